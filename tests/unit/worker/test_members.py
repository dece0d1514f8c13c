"""The member table's rules, without a socket or an event loop: events in, decisions out, the
clock a number in each event and the jitter a seeded ``random.Random``. At the end, the asyncio
adapter (:class:`Membership`) on in-memory channels: an event loop, still no socket."""

from __future__ import annotations

import asyncio
import copy
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compass.config import Timeouts
from compass.errors import (
    CompassError,
    ConfigError,
    ConnectFailed,
    ProtocolError,
    WorkerUnavailable,
)
from compass.membership.events import (
    Decision,
    Dial,
    Duplicate,
    Event,
    Forgot,
    Fresh,
    HeardFrom,
    Hello,
    JoinAnswered,
    JoinAsked,
    JoinSeeds,
    Leave,
    Left,
    Moved,
    NotASeed,
    NotReached,
    PeerDown,
    PeerUp,
    Refuse,
    Refuted,
    Remove,
    RetryAt,
    RetryFailed,
    Seeds,
    SeedsAnswered,
    SeedsFailed,
    Stale,
    Tick,
    Welcome,
    members_of,
    parse_join,
    parse_welcome,
)
from compass.membership.swim import Probing
from compass.membership.table import (
    FORGET_AFTER_S,
    FORGET_LEFT_AFTER_S,
    LEFT_BACKOFF,
    Backoff,
    MemberTable,
)
from compass.wire.memory import MemoryNetwork
from compass.wire.rpc import Router
from compass.wire.transport import Channel, ChannelOptions, Server
from compass.worker.membership import Membership, MembershipOptions

REPO = Path(__file__).resolve().parents[3]
T0 = 1000.0
EXACT = Backoff(initial_s=0.1, max_s=0.4, jitter=0.0)  # no jitter: exact retry times


def table(name: str = "a", backoff: Backoff = EXACT, seed: int = 1) -> MemberTable:
    return MemberTable(
        name, f"{name}.lan:7341", instance=f"{name}-1", rng=random.Random(seed), backoff=backoff
    )


def hello(
    name: str,
    *,
    instance: str | None = None,
    incarnation: int = 0,
    dead: int | None = None,
    address: str | None = None,
) -> Hello:
    return Hello(name, address or f"{name}.lan:7341", incarnation, instance or f"{name}-1", dead)


def joined(t: MemberTable, *names: str, now: float = T0) -> None:
    """``names`` dialed ``t`` and joined."""
    for name in names:
        assert any(type(d) is PeerUp for d in t.handle(JoinAsked(now, hello(name))))


def state(t: MemberTable) -> Any:
    """Everything the table keeps (its detector's too), to compare before and after an event."""
    kept = {k: v for k, v in vars(t).items() if k not in ("rng", "detector", "log", "_handled")}
    # the detector shares the table's dicts and randomness, and calls back into the table
    detector = {k: v for k, v in vars(t.detector).items()
                if k not in ("rng", "members", "live", "_remove")}  # fmt: skip
    return copy.deepcopy({**kept, "detector": detector})


def kinds(decisions: list[Decision]) -> list[str]:
    return [type(d).__name__ for d in decisions]


# -- joining -------------------------------------------------------------------------------------
def test_a_newcomer_joins_and_is_told_the_peers_it_should_dial() -> None:
    t = table()
    first = t.handle(JoinAsked(T0, hello("b")))
    assert first[0] == PeerUp("b", "b.lan:7341", 0, back_after_s=None, replaces=False)
    welcome = first[-1]
    assert isinstance(welcome, Welcome)
    assert welcome.reply == {
        "name": "a", "address": "a.lan:7341", "incarnation": 0, "instance": "a-1", "dead": None,
        "members": [], "peers": {}, "incarnations": {},
    }  # fmt: skip
    (*_, second) = t.handle(JoinAsked(T0 + 1, hello("c")))
    assert isinstance(second, Welcome)
    assert second.reply["peers"] == {"b": "b.lan:7341"}
    assert members_of(second.reply) == [("b", "b.lan:7341")]
    assert members_of({"members": ["b.lan:7341"]}) == [(None, "b.lan:7341")]  # an older worker
    assert list(t.live) == ["b", "c"]
    assert (t.members["c"].joined_at, t.members["c"].last_seen) == (T0 + 1, T0 + 1)
    assert t.describe(T0 + 1.5) == [
        {"name": "b", "address": "b.lan:7341", "age_ms": 1500.0, "incarnation": 0,
         "suspect": False},
        {"name": "c", "address": "c.lan:7341", "age_ms": 500.0, "incarnation": 0,
         "suspect": False},
    ]  # fmt: skip


def test_dialing_a_worker_makes_it_a_peer_and_a_second_channel_replaces_the_first() -> None:
    t = table()
    assert t.handle(JoinAnswered(T0, "b.lan:7341", None, hello("b"))) == [
        PeerUp("b", "b.lan:7341", 0, None, replaces=False)
    ]
    # b dialed at the same moment: same process, its newer channel is used, nobody leaves
    decisions = t.handle(JoinAsked(T0, hello("b")))
    assert decisions[0] == PeerUp("b", "b.lan:7341", 0, None, replaces=True)
    assert kinds(decisions) == ["PeerUp", "Welcome"]


def test_a_duplicate_name_is_refused_and_nothing_changes() -> None:
    t = table()
    joined(t, "b")
    before = state(t)
    twin = hello("b", instance="b-2", address="elsewhere:7341")
    (refused,) = t.handle(JoinAsked(T0 + 1, twin))
    assert isinstance(refused, Refuse)
    error = refused.error()
    assert isinstance(error, ConfigError)
    assert error.detail == {"name": "b", "address": "b.lan:7341"}
    assert "'b' is taken" in error.message and "--name" in error.message
    assert state(t) == before
    # dialing the twin: ignored, the live b kept
    assert t.handle(JoinAnswered(T0 + 1, "elsewhere:7341", None, twin)) == [
        Duplicate("b", "elsewhere:7341", "b.lan:7341")
    ]
    assert state(t) == before


def test_this_workers_own_name_is_itself_or_taken() -> None:
    t = table()
    (itself,) = t.handle(JoinAsked(T0, hello("a")))  # same instance: it dialed itself
    assert isinstance(itself, Refuse) and itself.kind is ConfigError
    assert itself.detail == {"name": "a", "address": "a.lan:7341", "itself": True}
    (taken,) = t.handle(JoinAsked(T0, hello("a", instance="a-2")))
    assert isinstance(taken, Refuse) and taken.kind is ConfigError
    assert taken.detail == {"name": "a", "address": "a.lan:7341"}
    assert t.members == {}


def test_a_leaving_worker_takes_nobody_in() -> None:
    t = table()
    t.handle(Leave(T0))
    (refused,) = t.handle(JoinAsked(T0, hello("b")))
    assert isinstance(refused, Refuse)
    with pytest.raises(WorkerUnavailable, match="leaving"):
        raise refused.error()
    assert t.live == {}


def test_a_new_instance_at_a_live_peers_address_is_a_restart() -> None:
    # killed and started again within a heartbeat: its old connection has not broken yet
    t = table()
    joined(t, "b")
    restarted = hello("b", instance="b-2")  # same address, new process
    decisions = t.handle(JoinAsked(T0 + 1, restarted))
    assert kinds(decisions) == ["PeerDown", "RetryAt", "PeerUp", "Welcome"]
    assert decisions[0] == PeerDown(
        "b", "b.lan:7341", "it restarted (a new instance of it answers at b.lan:7341)"
    )
    assert decisions[2] == PeerUp("b", "b.lan:7341", 1, back_after_s=0.0, replaces=False)
    welcome = decisions[3]
    assert isinstance(welcome, Welcome) and welcome.reply["dead"] == 0  # "you were dead at 0"
    assert t.members["b"].instance == "b-2" and t.members["b"].incarnation == 1

    # the same when this worker dials the new instance
    t2 = table()
    t2.handle(JoinAnswered(T0, "b.lan:7341", None, hello("b")))
    answer = hello("b", instance="b-2", incarnation=1)
    assert kinds(t2.handle(JoinAnswered(T0 + 1, "b.lan:7341", "b", answer))) == [
        "PeerDown", "RetryAt", "PeerUp",
    ]  # fmt: skip
    assert t2.members["b"].instance == "b-2"


# -- incarnations --------------------------------------------------------------------------------
def test_told_it_was_declared_dead_a_worker_takes_the_next_incarnation() -> None:
    t = table()
    (refuted, up, _) = t.handle(JoinAsked(T0, hello("b", dead=0)))
    assert refuted == Refuted("b", 0, 1) and t.incarnation == 1
    assert isinstance(up, PeerUp)
    # an older declaration does not raise it again
    assert kinds(t.handle(JoinAsked(T0, hello("c", dead=0)))) == ["PeerUp", "Welcome"]
    assert t.incarnation == 1
    assert t.hello().incarnation == 1


def test_a_peer_declared_dead_comes_back_one_incarnation_later() -> None:
    t = table()
    joined(t, "b")
    t.handle(Remove(T0 + 3, "b", "declared dead"))  # at incarnation 0
    assert t.members["b"].declared_dead and t.dead_for("b") == 0
    assert t.dead_for("nobody") is None and t.dead_for(None) is None
    # b dials back still at 0: it is told, and comes back as 1
    decisions = t.handle(JoinAsked(T0 + 4, hello("b")))
    up, welcome = decisions
    assert up == PeerUp("b", "b.lan:7341", 1, back_after_s=1.0, replaces=False)
    assert isinstance(welcome, Welcome) and welcome.reply["dead"] == 0
    assert not t.members["b"].declared_dead and t.dead_for("b") is None
    # a worker that predates incarnations (no "incarnation" in its join) stays at 0
    t.handle(Remove(T0 + 10, "b", "declared dead"))
    old = parse_join({"name": "b", "address": "b.lan:7341"})
    assert not old.has_incarnation
    up, welcome = t.handle(JoinAsked(T0 + 11, old))
    assert isinstance(welcome, Welcome) and welcome.reply["dead"] is None
    assert isinstance(up, PeerUp) and up.incarnation == 1  # the highest one heard is kept


def test_heartbeats_of_an_older_incarnation_are_stale_and_a_newer_one_is_adopted() -> None:
    t = table()
    t.handle(JoinAsked(T0, hello("b", incarnation=1)))
    assert t.handle(HeardFrom(T0 + 1, "b", 0)) == [Stale("b", 0, 1)]
    assert t.stale_heartbeats == 1 and t.members["b"].last_seen == T0  # not refreshed
    assert t.handle(HeardFrom(T0 + 2, "b", 1)) == [Fresh("b")]
    assert t.handle(HeardFrom(T0 + 3, "b")) == [Fresh("b")]  # one that names no incarnation
    assert t.members["b"].last_seen == T0 + 3
    assert t.handle(HeardFrom(T0 + 4, "b", 2)) == [Fresh("b")]
    assert t.members["b"].incarnation == 2
    assert t.handle(HeardFrom(T0 + 5, "stranger", 0)) == []  # no peer: does not count


# -- declared dead --------------------------------------------------------------------------------
def test_a_peer_declared_dead_is_removed_once_and_retried() -> None:
    t = table()
    joined(t, "b", "c")
    (down, retry) = t.handle(Remove(T0 + 2.0, "c", "it restarted"))
    assert down == PeerDown("c", "c.lan:7341", "it restarted")
    assert retry == RetryAt("c", "c.lan:7341", 0, T0 + 2.0 + 0.1)
    assert list(t.live) == ["b"]
    assert t.handle(Remove(T0 + 2.2, "c", "again")) == []  # removed once


# -- retries, leaving, forgetting ------------------------------------------------------------------
def test_a_lost_peer_is_retried_on_its_backoff_and_forgotten_after_a_day() -> None:
    t = table()
    joined(t, "b")
    t.handle(Remove(T0, "b", "connection closed (by peer)"))
    assert t.describe_lost(T0) == [
        {"name": "b", "address": "b.lan:7341", "lost_s": 0.0, "failures": 0,
         "retry_in_s": 0.1, "left": False},
    ]  # fmt: skip
    assert t.next_due() == T0 + 0.1
    assert t.handle(Tick(T0 + 0.0999)) == []
    assert t.handle(Tick(T0 + 0.1)) == [Dial("b", "b.lan:7341")]
    assert t.handle(Tick(T0 + 0.1, busy=frozenset({"b"}))) == []  # under way: not twice
    assert t.next_due(busy=frozenset({"b"})) == float("inf")
    now, waits = T0 + 0.1, []
    for _ in range(5):  # each try fails, the wait doubles up to the cap
        (retry,) = t.handle(RetryFailed(now, "b"))
        assert isinstance(retry, RetryAt)
        waits.append(round(retry.at - now, 6))
    assert waits == [0.2, 0.4, 0.4, 0.4, 0.4]
    assert t.members["b"].failures == 5
    assert t.handle(RetryFailed(now, "stranger")) == []
    assert t.handle(Tick(T0 + FORGET_AFTER_S - 1))[0] == Dial("b", "b.lan:7341")
    assert t.handle(Tick(T0 + FORGET_AFTER_S + 1)) == [Forgot("b", FORGET_AFTER_S + 1)]
    assert t.members == {} and t.next_due() == float("inf")


def test_the_jitter_spreads_retries_and_replays_the_same_with_the_same_seed() -> None:
    def run(seed: int) -> list[Decision]:
        t = table(backoff=Backoff(), seed=seed)
        joined(t, "b", "c", "d")
        out = [d for name in "bcd" for d in t.handle(Remove(T0 + 10, name, "declared dead"))]
        for k in range(4):
            out += t.handle(RetryFailed(T0 + 11 + k, "c"))
        return out

    assert run(7) == run(7)
    times = [d.at for d in run(7) if type(d) is RetryAt][:3]
    assert len(set(times)) == 3  # lost at the same moment, not retried in lockstep
    assert all(T0 + 10 + 0.05 < at <= T0 + 10 + 0.1 for at in times)


def test_a_peer_that_left_is_retried_soon_and_often_then_forgotten_after_an_hour() -> None:
    t = table(backoff=Backoff(initial_s=1.0, max_s=60.0, jitter=0.0))
    joined(t, "b")
    down, retry = t.handle(Left(T0, "b", "it left the cluster"))
    assert down == PeerDown("b", "b.lan:7341", "it left the cluster")
    assert isinstance(retry, RetryAt) and retry.at - T0 <= LEFT_BACKOFF.initial_s
    for _ in range(6):  # each failed try backs off, up to a second, not the minute
        t.handle(RetryFailed(T0, "b"))
    assert t.members["b"].retry_at - T0 <= LEFT_BACKOFF.max_s
    assert t.describe_lost(T0)[0]["left"] is True
    assert t.handle(Tick(T0 + FORGET_LEFT_AFTER_S - 1)) == [Dial("b", "b.lan:7341")]
    assert "b" in t.members
    assert t.handle(Tick(T0 + FORGET_LEFT_AFTER_S + 1)) == [Forgot("b", FORGET_LEFT_AFTER_S + 1)]
    # it comes back: no longer "left"
    joined(t, "b", now=T0 + FORGET_LEFT_AFTER_S + 2)
    assert t.members["b"].left is False


def test_a_member_named_by_a_seed_but_not_reached_is_retried() -> None:
    t = table()
    assert t.handle(NotReached(T0, "c", "c.lan:7341")) == [RetryAt("c", "c.lan:7341", 0, T0 + 0.1)]
    assert t.handle(Tick(T0 + 0.1)) == [Dial("c", "c.lan:7341")]


def test_a_lost_members_address_answering_as_another_forgets_the_lost_one() -> None:
    t = table()
    joined(t, "b")
    t.handle(Remove(T0, "b", "test"))
    assert t.lost_at_address("b.lan:7341") == "b" and t.lost("b") is not None
    decisions = t.handle(JoinAnswered(T0 + 1, "b.lan:7341", "b", hello("c", address="b.lan:7341")))
    assert decisions[0] == Moved("b", "c", "b.lan:7341")
    assert set(t.members) == {"c"} and t.lost("b") is None


# -- seeds ---------------------------------------------------------------------------------------
def test_a_worker_alone_joins_through_its_seeds_again_on_the_backoff() -> None:
    t = table()
    t.handle(Seeds(T0, ("a.lan:7341", "s1:7341", "s2:7341")))
    t.handle(NotASeed(T0, "a.lan:7341"))  # this worker, by another address
    assert t.seeds == ["s1:7341", "s2:7341"]
    assert t.handle(Tick(T0)) == [JoinSeeds(("s1:7341", "s2:7341"))]
    assert t.handle(Tick(T0, seeds_busy=True)) == []  # already joining
    now, waits = T0, []
    for _ in range(4):
        t.handle(SeedsFailed(now))
        waits.append(round(t.seed_retry_at - now, 6))
        assert t.next_due() == t.seed_retry_at
        assert t.handle(Tick(t.seed_retry_at - 0.001)) == []
        now = t.seed_retry_at
        assert t.handle(Tick(now)) == [JoinSeeds(("s1:7341", "s2:7341"))]
    assert waits == [0.1, 0.2, 0.4, 0.4]
    t.handle(SeedsAnswered(now))
    assert t.seed_failures == 0
    joined(t, "s1")  # not alone any more: the seeds rest (s1 is probed)
    assert kinds(t.handle(Tick(now + 100))) == ["SendProbe"]
    assert t.next_due() == min(t.detector.probe_at, *(p.due() for p in t.detector._probes.values()))


def test_a_first_worker_whose_only_seed_is_itself_never_retries_it() -> None:
    t = table()
    t.handle(Seeds(T0, ("a.lan:7341",)))
    t.handle(NotASeed(T0, "a.lan:7341"))
    assert t.handle(Tick(T0 + 1)) == [] and t.next_due() == float("inf")


# -- the handshake read off the wire --------------------------------------------------------------
def test_a_malformed_join_is_refused_before_the_table_sees_it() -> None:
    with pytest.raises(CompassError, match="join needs"):
        parse_join({"name": "b"})
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ProtocolError, match="incarnation must be an integer"):
            parse_join({"name": "b", "address": "x:1", "incarnation": bad})
        with pytest.raises(ProtocolError, match="incarnation must be an integer"):
            parse_join({"name": "b", "address": "x:1", "dead": bad})
    with pytest.raises(ProtocolError, match="x:1 answered join without its name"):
        parse_welcome({"name": "b"}, "x:1")
    good = hello("b", incarnation=2, dead=1)
    assert parse_welcome(good.to_wire(), "x:1") == good
    assert parse_join(good.to_wire()) == good


def test_every_event_gives_the_same_decisions_on_replay() -> None:
    events: list[Event] = [
        Seeds(T0, ("s:1",)),
        JoinAsked(T0, hello("b")),
        JoinAnswered(T0, "c.lan:7341", None, hello("c", dead=0)),
        HeardFrom(T0 + 1, "b", 0),
        Remove(T0 + 2.5, "c", "declared dead"),
        Tick(T0 + 3),
        RetryFailed(T0 + 3, "c"),
        Left(T0 + 3, "b", "it left the cluster"),
        Tick(T0 + 10),
        SeedsFailed(T0 + 10),
        Leave(T0 + 11),
        JoinAsked(T0 + 11, hello("d")),
    ]

    def replay() -> list[list[Decision]]:
        t = table(backoff=Backoff(), seed=5)
        return [t.handle(event) for event in events]

    first = replay()
    assert first == replay()
    assert [kinds(d) for d in first] == [
        [], ["PeerUp", "Welcome"], ["Refuted", "PeerUp"], ["Fresh"],
        ["PeerDown", "RetryAt"],  # c
        ["SendProbe", "Dial"], ["RetryAt"],  # b is probed; c is tried, and fails
        ["PeerDown", "RetryAt"],  # b left
        ["Dial", "Dial", "JoinSeeds"],  # alone: the seeds too
        [], [], ["Refuse"],  # leaving: takes nobody in
    ]  # fmt: skip


def test_the_table_imports_neither_asyncio_nor_socket() -> None:
    code = (
        "import sys, compass.membership.table, compass.membership.events\n"
        "print(sorted({'asyncio', 'socket', 'compass.wire.channel'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[]"


# -- the adapter on in-memory channels: an event loop, no socket ----------------------------------
TOKEN = "members-token"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=2.0)
FAST_PROBES = Probing(period_s=0.05, timeout_s=0.02)


def test_an_answer_to_a_join_sent_before_a_peer_was_declared_dead_does_not_bring_it_back() -> None:
    """A slow peer (paused, not gone) answers a join sent before it was declared dead: at the
    incarnation it was declared dead at, it is not taken back; it is dialed again at once,
    told, and comes back one incarnation later."""
    t = table()
    b = hello("b")
    t.handle(JoinAnswered(T0, b.address, "b", b))
    t.handle(Remove(T0 + 1, "b", "suspected"))
    out = t.handle(JoinAnswered(T0 + 2, b.address, "b", b))
    assert "b" not in t.live and not any(type(d) is PeerUp for d in out)
    assert [type(d) for d in out] == [RetryAt] and out[0].at == T0 + 2  # type: ignore[union-attr]
    assert t.dead_for("b") == 0  # what the next dial tells it
    newer = hello("b", incarnation=1)
    out = t.handle(JoinAnswered(T0 + 3, b.address, "b", newer))
    assert "b" in t.live and any(type(d) is PeerUp for d in out)


class Node:
    """A :class:`Membership` listening on a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, name: str, backoff: Backoff = EXACT) -> None:
        self.network = network
        self.router = Router()
        self.joined: list[str] = []
        self.left: list[tuple[str, str]] = []
        self.server: Server | None = None
        #: set while the node runs; cleared, it is as if SIGSTOPped: it reads no notify (no
        #: probe, no ack), answers no join and dials nobody until it is set again
        self.running = asyncio.Event()
        self.running.set()
        self.options = ChannelOptions(name=name, token=TOKEN, timeouts=FAST)
        self.membership = Membership(
            "",
            MembershipOptions(
                self.options, backoff=backoff, probing=FAST_PROBES, dial=self.dial,
                rng=random.Random(1),
            ),
            handler=self.router.handle_request, notify_handler=self.notified,
            on_join=lambda peer: self.joined.append(peer.name),
            on_leave=lambda peer, why: self.left.append((peer, why)),
        )  # fmt: skip
        membership = self.membership
        membership.route(self.router)

        @self.router.request("join")
        async def join(channel: Channel, body: Any) -> Any:
            await self.running.wait()
            return membership.accept_join(channel, body)

        @self.router.notify("leave")
        def leave(channel: Channel, body: Any) -> None:
            membership.left(body["name"], "it left the cluster")

    def notified(self, channel: Channel, op: str, body: Any) -> None:
        if self.running.is_set():
            self.router.handle_notify(channel, op, body)

    async def dial(
        self, address: str | tuple[str, int], options: ChannelOptions, **kwargs: Any
    ) -> Channel:
        await self.running.wait()
        return await self.network.connect(address, options, **kwargs)

    async def listen(self, port: int = 0) -> Node:
        m = self.membership
        self.server = await self.network.serve(
            m.name, port, self.options, handler=self.router.handle_request,
            notify_handler=self.notified,
        )  # fmt: skip
        host, bound = self.server.address
        m.listen_at(f"{host}:{bound}")
        return self

    async def aclose(self) -> None:
        await self.membership.aclose()
        if self.server is not None:
            await self.server.aclose()


async def until(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_in_memory_workers_join_refuse_a_duplicate_and_take_a_restart_back() -> None:
    network = MemoryNetwork()
    a, b, c = [await Node(network, name).listen() for name in ("a", "b", "c")]
    twin = await Node(network, "b").listen()
    try:
        await b.membership.join([a.membership.table.address])
        await c.membership.join([a.membership.table.address])  # b, which a names: live, not dialed
        assert set(a.membership.channels.peers) == {"b", "c"} and set(
            c.membership.channels.peers
        ) == {"a", "b"}
        with pytest.raises(ConfigError, match="'b' is taken"):
            await twin.membership.join([a.membership.table.address])
        assert twin.membership.channels.peers == {}

        # b crashes; a and c lose it and retry it; it comes back at its address
        port = int(b.membership.table.address.rsplit(":", 1)[1])
        retrying = [asyncio.ensure_future(n.membership.run()) for n in (a, c)]
        await b.aclose()
        await until(lambda: "b" not in a.membership.channels.peers, "a has lost b")
        restarted = await Node(network, "b").listen(port)
        await until(
            lambda: "b" in a.membership.channels.peers and "b" in c.membership.channels.peers,
            "a and c have b back",
        )
        assert a.membership.table.members["b"].instance == restarted.membership.table.instance
        assert restarted.membership.table.incarnation == 1  # it was declared dead at 0
        assert [name for name, _ in a.left] == ["b"]
        for task in retrying:
            task.cancel()
        await asyncio.gather(*retrying, return_exceptions=True)
        await restarted.aclose()
    finally:
        for node in (a, b, c, twin):
            await node.aclose()


@pytest.mark.asyncio
async def test_an_in_memory_worker_that_leaves_is_retried_soon_and_often() -> None:
    network = MemoryNetwork()
    a, b = [await Node(network, name).listen() for name in ("a", "b")]
    try:
        await a.membership.join([b.membership.table.address])
        b.membership.leave()
        await until(lambda: "b" not in a.membership.channels.peers, "a hears b leave")
        (lost,) = a.membership.describe_lost()
        assert lost["left"] is True and lost["retry_in_s"] <= LEFT_BACKOFF.initial_s
        assert a.left == [("b", "it left the cluster")]
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.asyncio
async def test_a_leaving_worker_dials_nobody_so_its_peers_do_not_take_it_back() -> None:
    network = MemoryNetwork()
    a, b = [await Node(network, name).listen() for name in ("a", "b")]
    try:
        await a.membership.join([b.membership.table.address])
        b.membership.leave()
        await until(lambda: "b" not in a.membership.channels.peers, "a hears b leave")
        # a retry of b's (or its seed loop) firing now must not rejoin it to a
        assert await b.membership.connect_peer(a.membership.table.address, "a") == []
        await asyncio.sleep(0.05)
        assert "b" not in a.membership.channels.peers
        assert a.membership.describe_lost()[0]["left"] is True
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.asyncio
async def test_in_memory_a_silent_worker_is_suspected_declared_dead_then_refutes_and_rejoins() -> (
    None
):
    network = MemoryNetwork()
    nodes = [await Node(network, name).listen() for name in ("a", "b", "c", "d")]
    a, b, c, d = nodes
    for node in (b, c, d):
        await node.membership.join([a.membership.table.address])
    runs = {n.membership.name: asyncio.ensure_future(n.membership.run()) for n in nodes}
    others = (a, b, c)
    try:
        await until(lambda: all(len(n.membership.channels.peers) == 3 for n in nodes), "all joined")
        await asyncio.sleep(0.3)  # probing, all answered
        assert all(not n.left for n in nodes)
        paused_at = time.monotonic()
        d.running.clear()  # answers nothing, probes nobody: alive to its channels, silent
        runs["d"].cancel()
        await until(
            lambda: (
                all(any(p["suspect"] for p in n.membership.describe()) for n in others)
                or all("d" not in n.membership.channels.peers for n in others)
            ),
            "the others suspect d",
        )
        await until(
            lambda: all("d" not in n.membership.channels.peers for n in others), "d declared dead"
        )
        dropped_s = time.monotonic() - paused_at
        for node in others:
            ((name, why),) = node.left
            assert name == "d" and ("without refuting it" in why or "declared dead by" in why)
            assert set(node.membership.channels.peers) == {"a", "b", "c"} - {node.membership.name}
        # it wakes: its channels were closed, it probes through new ones, is told it was
        # declared dead, refutes, and is back everywhere one incarnation later
        d.running.set()
        runs["d"] = asyncio.ensure_future(d.membership.run())
        await until(lambda: all("d" in n.membership.channels.peers for n in others), "d is back")
        assert d.membership.table.incarnation >= 1
        assert all(n.membership.table.members["d"].incarnation >= 1 for n in others)
        await until(lambda: len(d.membership.channels.peers) == 3, "d has every peer again")
        await asyncio.sleep(0.3)  # and it stays: nobody suspects anybody any more
        assert all(not any(p["suspect"] for p in n.membership.describe()) for n in nodes)
        assert all(len(n.membership.channels.peers) == 3 for n in nodes)
        # a 50 ms period, a 20 ms timeout, suspicions of 0.15 s confirmed
        assert dropped_s < 2.0, dropped_s
    finally:
        for task in runs.values():
            task.cancel()
        await asyncio.gather(*runs.values(), return_exceptions=True)
        for node in nodes:
            await node.aclose()


@pytest.mark.asyncio
async def test_a_join_that_keeps_failing_fails_and_is_never_raced_by_a_seed_retry() -> None:
    """While a worker's own join tries its seeds, its retry loop must not dial them too: the
    second dial of a seed being dialed returns at once, and the join took that for success,
    leaving the worker alone in a cluster it never joined (a plain worker at a TLS seed)."""
    network = MemoryNetwork()
    node = Node(network, "lonely")
    dialing: dict[str, int] = {}
    most = 0

    async def slow_failing_dial(
        address: str | tuple[str, int], options: ChannelOptions, **kwargs: Any
    ) -> Channel:
        nonlocal most
        key = str(address)
        dialing[key] = dialing.get(key, 0) + 1
        most = max(most, dialing[key])
        try:
            await asyncio.sleep(0.15)  # a handshake that takes a while, then fails
            raise ConnectFailed(f"nothing answers at {key}")
        finally:
            dialing[key] -= 1

    node.membership._dial = slow_failing_dial
    await node.listen()
    run = asyncio.create_task(node.membership.run())
    try:
        with pytest.raises(ConnectFailed, match="could not join the cluster"):
            await node.membership.join(["seed:1"], timeout_s=1.5)
        assert most == 1 and not node.membership.channels.peers
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await node.aclose()
