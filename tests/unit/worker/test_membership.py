"""Membership: how often a worker may gossip, when a silent peer is dropped (its probes
unanswered), and how it comes back (backoff, incarnations, unique names, advertised
addresses)."""

from __future__ import annotations

import asyncio
import random
import re
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from compass.config import Timeouts, WorkerConfig
from compass.errors import ConfigError, ConnectFailed, ProtocolError, WorkerUnavailable
from compass.sched.view import ClusterView, Heartbeat
from compass.wire.rpc import Router
from compass.wire.transport import Channel, ChannelOptions, Server, serve
from compass.worker.membership import (
    FORGET_LEFT_AFTER_S,
    LEFT_BACKOFF,
    Backoff,
    Membership,
    MembershipOptions,
    Probing,
    advertised_address,
    gossip_gap_s,
)

TOKEN = "cluster-secret"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=2.0)
#: probes every 50 ms, acked within 20; an unconfirmed suspicion lasts 6 x 3 periods, 0.9 s
FAST_PROBES = Probing(period_s=0.05, timeout_s=0.02)


def test_small_clusters_gossip_at_the_least_gap() -> None:
    assert gossip_gap_s(0.001, 0, 20000.0) == 0.001
    assert gossip_gap_s(0.001, 4, 20000.0) == 0.001
    assert gossip_gap_s(0.001, 20, 20000.0) == pytest.approx(0.001)


def test_large_clusters_space_heartbeats_to_keep_the_message_rate() -> None:
    for peers in (40, 100, 239):
        gap = gossip_gap_s(0.001, peers, 20000.0)
        assert gap > 0.001
        assert peers / gap == pytest.approx(20000.0)  # messages a second, over all peers


# -- backoff -----------------------------------------------------------------------------------


def test_backoff_doubles_from_a_tenth_of_a_second_up_to_five() -> None:
    backoff = Backoff()
    # rand 0: no jitter taken off
    schedule = [backoff.delay_s(n, 0.0) for n in range(10)]
    assert schedule == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0])
    assert backoff.delay_s(10_000, 0.0) == 5.0  # no overflow however long a peer is away


def test_backoff_jitter_takes_off_at_most_half_and_spreads_the_retries() -> None:
    backoff = Backoff()
    rng = random.Random(7)
    for n in range(12):
        base = min(5.0, 0.1 * 2**n)
        delays = [backoff.delay_s(n, rng.random()) for _ in range(200)]
        assert all(base / 2 < d <= base for d in delays)
        assert len({round(d, 9) for d in delays}) > 150  # not in lockstep


@pytest.mark.parametrize(
    "kwargs",
    [{"initial_s": 0.0}, {"initial_s": 6.0}, {"factor": 0.5}, {"jitter": 1.0}, {"jitter": -0.1}],
)
def test_a_bad_backoff_is_a_config_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="Backoff"):
        Backoff(**kwargs)


# -- incarnations in the view ------------------------------------------------------------------


def _state(name: str, seq: int, incarnation: int = 0, wait_s: float = 0.0) -> Heartbeat:
    return Heartbeat(name, wait_s, frozenset(), 0, 10, seq=seq, incarnation=incarnation)


def test_a_worker_state_carries_its_incarnation_and_defaults_to_zero() -> None:
    state = _state("w1", 3, incarnation=4)
    wire = state.to_wire()
    assert Heartbeat.from_wire(wire) == state
    del wire["i"]  # a worker that predates incarnations
    assert Heartbeat.from_wire(wire).incarnation == 0
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ProtocolError, match=r"'i' must be an integer|incarnation must be >= 0"):
            Heartbeat.from_wire({**state.to_wire(), "i": bad})


def test_the_view_orders_heartbeats_by_incarnation_then_seq() -> None:
    view = ClusterView("me")
    assert view.apply_heartbeat(_state("p", seq=50, incarnation=1, wait_s=1.0), now=1.0)
    # a late heartbeat of the incarnation before, however high its seq: stale
    assert not view.apply_heartbeat(_state("p", seq=99, incarnation=0, wait_s=9.0), now=2.0)
    assert not view.apply_heartbeat(_state("p", seq=50, incarnation=1, wait_s=9.0), now=2.0)
    assert view.get("p") == _state("p", seq=50, incarnation=1, wait_s=1.0)
    # a restarted worker counts seq from 1 again, in a newer incarnation: it wins
    assert view.apply_heartbeat(_state("p", seq=1, incarnation=2, wait_s=2.0), now=3.0)
    got = view.get("p")
    assert got is not None and (got.incarnation, got.seq, got.wait_s) == (2, 1, 2.0)
    # removed (declared dead), the peer is absent until its first heartbeat after rejoining
    view.remove("p")
    assert "p" not in view and view.names() == ()
    assert view.apply_heartbeat(_state("p", seq=2, incarnation=3), now=4.0)
    assert view.names() == ("p",)


# -- members on real loopback channels, with an injected clock -----------------------------------


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def membership(
    name: str,
    clock: Callable[[], float],
    left: list[tuple[str, str]],
    backoff: Backoff = Backoff(),
    joined: list[str] | None = None,
    probes: bool = True,
    probing: Probing = FAST_PROBES,
) -> tuple[Membership, Router]:
    """A membership served by its own router; with ``probes`` False it answers no probe."""
    router = Router()
    member = Membership(
        "",  # set once its server listens
        MembershipOptions(
            ChannelOptions(name=name, token=TOKEN, timeouts=FAST),
            backoff=backoff,
            probing=probing,
            clock=clock,
            rng=random.Random(1),
        ),
        handler=router.handle_request,
        notify_handler=router.handle_notify,
        on_join=lambda peer: None if joined is None else joined.append(peer.name),
        on_leave=lambda peer, why: left.append((peer, why)),
    )

    @router.request("join")
    async def join(channel: Channel, body: Any) -> Any:
        return member.accept_join(channel, body)

    if probes:
        member.route(router)
    return member, router


async def _serve(member: Membership, router: Router, port: int = 0) -> Server:
    server = await serve(
        "127.0.0.1",
        port,
        ChannelOptions(name=member.name, token=TOKEN, timeouts=FAST),
        handler=router.handle_request,
        notify_handler=router.handle_notify,
    )
    host, bound = server.address[:2]
    member.listen_at(f"{host}:{bound}")
    return server


@asynccontextmanager
async def listening(member: Membership, router: Router) -> AsyncIterator[None]:
    server = await _serve(member, router)
    async with server:
        try:
            yield
        finally:
            await member.aclose()


async def until(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    """Wait, event loop running, until ``check()`` holds; fail after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_peer_that_answers_no_probe_is_suspected_then_declared_dead_by_the_clock() -> None:
    clock_a, clock_b = FakeClock(1000.0), FakeClock(5.0)
    left_a: list[tuple[str, str]] = []
    a, router_a = membership("a", clock_a, left_a)
    b, router_b = membership("b", clock_b, [], probes=False)  # alive, but deaf to probes
    async with listening(a, router_a), listening(b, router_b):
        await a.join([b.table.address])  # over a real loopback channel
        assert set(a.channels.peers) == {"b"}
        assert a.channels.peers["b"].last_seen == a.channels.peers["b"].joined_at == 1000.0
        assert b.channels.peers["a"].last_seen == 5.0  # each side reads its own clock

        clock_a.now = a.table.detector.probe_at  # within a period of the join
        a.due(clock_a.now)  # probes b
        clock_a.now += 0.02  # no ack within the timeout, and no other peer to ask: suspected
        a.due(clock_a.now)
        (row,) = a.describe()
        assert row["suspect"] is True and row["incarnation"] == 0
        suspected_at = clock_a.now
        # two workers: nobody can confirm it, so it lasts the longest (6 x 3 periods)
        clock_a.now = suspected_at + 0.9 - 1e-6
        a.due(clock_a.now)
        assert "b" in a.channels.peers
        # b's clock never moved: it suspects nobody, whatever the wall clock did
        assert b.due(clock_b.now) == [] and b.describe()[0]["suspect"] is False
        clock_a.now = suspected_at + 0.9
        a.due(clock_a.now)
        assert "b" not in a.channels.peers
        assert left_a == [("b", "suspected for 900 ms without refuting it (first by a, "
                                "confirmed by 0 other workers)")]  # fmt: skip
        a.due(clock_a.now + 0.1)
        assert len(left_a) == 1  # removed once


@pytest.mark.asyncio
async def test_an_answered_probe_keeps_a_peer_and_a_broken_channel_is_redialed() -> None:
    clock_a, clock_b = FakeClock(1000.0), FakeClock(5.0)
    left_a: list[tuple[str, str]] = []
    joined_a: list[str] = []
    a, router_a = membership("a", clock_a, left_a, joined=joined_a)
    b, router_b = membership("b", clock_b, [])
    async with listening(a, router_a), listening(b, router_b):
        await a.join([b.table.address])
        clock_a.now = a.table.detector.probe_at
        a.due(clock_a.now)
        await until(lambda: not a.table.detector._probes, "b's ack reaches a")
        clock_a.now += 0.01
        a.due(clock_a.now)
        assert a.describe()[0]["suspect"] is False and a.table.detector.health == 0
        # the channel breaks with both alive: no verdict; a probes b through a new channel
        channel = a.channels.channel("b")
        assert channel is not None
        await channel.aclose()
        await until(lambda: a.channels.channel("b") not in (None, channel), "a redials b")
        await until(lambda: not a.table.detector._probes, "b acks the probe on the new channel")
        assert left_a == [] and joined_a == ["b", "b"]  # reconnected: held messages go out


@pytest.mark.asyncio
async def test_a_removed_peer_is_retried_on_the_backoff_schedule() -> None:
    clock = FakeClock(1000.0)
    backoff = Backoff(initial_s=0.1, max_s=0.4, jitter=0.0)  # no jitter: exact times
    a, router_a = membership("a", clock, [], backoff)
    b, router_b = membership("b", FakeClock(), [])
    async with listening(a, router_a):
        server_b = await _serve(b, router_b)
        async with server_b:
            await a.join([b.table.address])
        await b.aclose()  # b is gone; its address is remembered
        a.remove("b", "test")
        lost = {"lost_s": 0.0, "failures": 0, "retry_in_s": 0.1, "left": False}
        assert a.describe_lost() == [{"name": "b", "address": b.table.address, **lost}]
        assert a.due(1000.0999) == []
        assert a.due(1000.1) == ["b"]
        # a probe of b may still be dialing its address (b closed its channel): let it fail
        for _ in range(500):
            if b.table.address not in a._connecting:
                break
            await asyncio.sleep(0.01)
        retry_at = []
        for _ in range(5):  # nothing listens at b's address: each try fails, the wait doubles
            with pytest.raises(ConnectFailed):
                await a.connect_peer(b.table.address, expect="b")
            a.failed("b", ConnectFailed("refused"))
            retry_at.append(round(a.table.members["b"].retry_at - clock.now, 6))
        assert retry_at == [0.2, 0.4, 0.4, 0.4, 0.4]  # capped
        assert a.table.members["b"].failures == 5

        # a peer lost for longer than forget_after_s is forgotten
        clock.now += a.table.forget_after_s + 1
        assert a.due(clock.now) == []
        assert "b" not in a.table.members


@pytest.mark.asyncio
async def test_a_peer_declared_dead_rejoins_with_a_newer_incarnation() -> None:
    clock_a, clock_b = FakeClock(1000.0), FakeClock(5.0)
    left_a: list[tuple[str, str]] = []
    left_b: list[tuple[str, str]] = []
    joined_a: list[str] = []
    a, router_a = membership("a", clock_a, left_a, joined=joined_a)
    b, router_b = membership("b", clock_b, left_b)
    async with listening(a, router_a), listening(b, router_b):
        await a.join([b.table.address])
        assert (a.table.incarnation, b.table.incarnation) == (0, 0)
        clock_a.now += 3.0
        a.remove("b", "declared dead")  # at incarnation 0; a closes the channel
        assert "b" not in a.channels.peers
        assert a.seen("b", 0) is False  # not a peer any more: its heartbeats do not count

        # b sees its channel to a close and probes a through a new one: a tells b it was
        # declared dead at 0, and b takes incarnation 1
        await until(lambda: "b" in a.channels.peers, "b has dialed a back")
        assert set(a.channels.peers) == {"b"} and set(b.channels.peers) == {"a"}
        assert (a.table.incarnation, b.table.incarnation) == (0, 1)
        assert a.table.members["b"].incarnation == 1
        assert a.describe()[0]["incarnation"] == 1
        assert joined_a == ["b", "b"]  # joined, then joined again
        assert left_b == []  # b never lost a: a broken channel is no verdict

        # a heartbeat sent before the rejoin (incarnation 0) is stale; a newer one is adopted
        clock_a.now += 1.0
        assert a.seen("b", 0) is False
        assert a.table.stale_heartbeats == 1
        assert a.describe()[0]["age_ms"] == 1000.0  # the stale one did not refresh it
        assert a.seen("b", 1) is True
        assert a.describe()[0]["age_ms"] == 0.0
        assert a.seen("b", 2) is True and a.table.members["b"].incarnation == 2

        # dead again, at incarnation 2: it comes back as 3, not 2
        clock_a.now += 1.0
        a.remove("b", "declared dead")
        await until(lambda: b.table.incarnation == 3 and "b" in a.channels.peers, "b is back at 3")
        assert a.table.members["b"].incarnation == 3
        # and when a dials b, b is told too
        await a.connect_peer(b.table.address, expect="b")
        assert b.table.incarnation == 3


@pytest.mark.asyncio
async def test_a_duplicate_name_is_refused_and_the_cluster_not_split() -> None:
    clock = FakeClock()
    a, router_a = membership("a", clock, [])
    b, router_b = membership("b", clock, [])
    twin, router_twin = membership("b", clock, [])  # another process, same name
    same_as_a, router_same = membership("a", clock, [])
    async with listening(a, router_a), listening(b, router_b), listening(twin, router_twin):
        await b.join([a.table.address])
        with pytest.raises(ConfigError, match=r"'b' is taken: the worker at \S+ has it") as info:
            await twin.join([a.table.address])
        assert info.value.detail == {"name": "b", "address": b.table.address}
        assert "--name" in info.value.message
        async with listening(same_as_a, router_same):
            with pytest.raises(
                ConfigError,
                match=re.escape(f"'a' is taken: the worker at {a.table.address} has it"),
            ):
                await same_as_a.join([a.table.address])
        assert set(a.channels.peers) == {"b"} and a.table.members["b"].instance == b.table.instance
        assert twin.channels.peers == {}

        # once b is lost, a new process under its name is a restart, not a duplicate
        a.remove("b", "test")
        await twin.join([a.table.address])
        assert set(a.channels.peers) == {"b"}
        assert a.channels.peers["b"].address == twin.table.address
        assert a.table.members["b"].instance == twin.table.instance
        assert twin.table.incarnation == 1  # the name was declared dead at 0


@pytest.mark.asyncio
async def test_a_seed_that_is_this_worker_by_another_address_is_skipped() -> None:
    # every pod of a StatefulSet joins pod 0, pod 0 included: it must start the cluster
    a, router_a = membership("a", time.monotonic, [])
    b, router_b = membership("b", time.monotonic, [])
    async with listening(a, router_a), listening(b, router_b):
        port = a.table.address.rsplit(":", 1)[1]
        await a.join([f"localhost:{port}"], timeout_s=5.0)  # a itself: alone, no error
        assert a.channels.peers == {}
        await a.join([f"localhost:{port}", b.table.address], timeout_s=5.0)
        assert set(a.channels.peers) == {"b"}


@pytest.mark.asyncio
async def test_join_keeps_trying_until_a_worker_listens_there() -> None:
    a, router_a = membership("a", time.monotonic, [], Backoff(0.01, 0.05))
    b, router_b = membership("b", time.monotonic, [])
    with socket.socket() as sock:  # a free port, nothing listening on it yet
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    async with listening(a, router_a):
        joining = asyncio.ensure_future(a.join([f"127.0.0.1:{port}"], timeout_s=30.0))
        await asyncio.sleep(0.2)
        assert not joining.done()  # refused, retrying
        server_b = await _serve(b, router_b, port)
        async with server_b:
            await asyncio.wait_for(joining, 30.0)
            assert set(a.channels.peers) == {"b"}
            await b.aclose()


@pytest.mark.asyncio
async def test_join_gives_up_after_its_timeout_with_a_clear_error() -> None:
    a, router_a = membership("a", time.monotonic, [], Backoff(0.01, 0.05))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    async with listening(a, router_a):
        with pytest.raises(ConnectFailed) as info:
            await a.join([f"127.0.0.1:{port}"], timeout_s=0.3)
    message = info.value.message
    assert f"could not join the cluster at 127.0.0.1:{port} within 0.3 s" in message
    assert "\n" not in message


@pytest.mark.asyncio
async def test_both_sides_retry_until_a_lost_peer_is_back() -> None:
    backoff = Backoff(0.01, 0.05)
    left: list[tuple[str, str]] = []
    a, router_a = membership("a", time.monotonic, left, backoff)
    b, router_b = membership("b", time.monotonic, [], backoff)
    async with listening(a, router_a):
        server_b = await _serve(b, router_b)
        port = int(b.table.address.rsplit(":", 1)[1])
        retrying = asyncio.ensure_future(a.run())
        try:
            async with server_b:
                await a.join([b.table.address])
            await b.aclose()  # b crashes: a loses it and keeps trying its address
            await until(lambda: a.table.members["b"].failures >= 3, "a has retried b a few times")
            assert [name for name, _ in left] == ["b"]
            restarted, router_r = membership("b", time.monotonic, [], backoff)
            server_r = await _serve(restarted, router_r, port)  # back at the same address
            async with server_r:
                await until(lambda: "b" in a.channels.peers, "a has b back")
                assert a.table.members["b"].instance == restarted.table.instance
                assert restarted.table.incarnation == 1 and a.table.members["b"].incarnation == 1
                assert a.describe_lost() == []
                await restarted.aclose()
        finally:
            retrying.cancel()
            await asyncio.gather(retrying, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_new_instance_where_a_live_peer_listens_is_a_restart_not_a_duplicate() -> None:
    # killed and started again within a heartbeat: its old connection has not broken yet
    left: list[tuple[str, str]] = []
    a, router_a = membership("a", FakeClock(), left)
    b, router_b = membership("b", FakeClock(), [])
    restarted, router_r = membership("b", FakeClock(), [])
    async with listening(a, router_a), listening(b, router_b), listening(restarted, router_r):
        await b.join([a.table.address])
        old_instance = b.table.instance
        restarted.listen_at(b.table.address)  # the new process listens where the old one did
        await restarted.join([a.table.address])
        assert [name for name, _ in left] == ["b"]  # the old instance's jobs are re-planned
        assert a.channels.peers["b"].address == b.table.address
        assert a.table.members["b"].instance == restarted.table.instance != old_instance
        assert restarted.table.incarnation == 1  # the old instance was declared dead at 0


@pytest.mark.asyncio
async def test_a_peer_that_left_is_retried_soon_and_often_then_forgotten_after_an_hour() -> None:
    clock = FakeClock(1000.0)
    a, router_a = membership("a", clock, [], Backoff(initial_s=1.0, max_s=60.0, jitter=0.0))
    b, router_b = membership("b", FakeClock(), [])
    async with listening(a, router_a), listening(b, router_b):
        await a.join([b.table.address])
        a.left("b", "it left the cluster")
        (lost,) = a.describe_lost()
        assert lost["left"] is True and lost["retry_in_s"] <= LEFT_BACKOFF.initial_s
        for _ in range(6):  # each failed try backs off, up to a second, not the minute
            a.failed("b", ConnectFailed("refused"))
        assert a.table.members["b"].retry_at - clock.now <= LEFT_BACKOFF.max_s
        clock.now += FORGET_LEFT_AFTER_S - 1
        assert a.due(clock.now) and "b" in a.table.members
        clock.now += 2
        a.due(clock.now)
        assert "b" not in a.table.members


@pytest.mark.asyncio
async def test_a_worker_with_no_peer_joins_through_its_seeds_again() -> None:
    backoff = Backoff(0.01, 0.05)
    a, router_a = membership("a", time.monotonic, [], backoff)
    b, router_b = membership("b", time.monotonic, [], backoff)
    async with listening(a, router_a):
        server_b = await _serve(b, router_b)
        port = int(b.table.address.rsplit(":", 1)[1])
        a.forget_after(0.0)  # b is forgotten at once: only the seed list can find it again
        retrying = asyncio.ensure_future(a.run())
        try:
            async with server_b:
                await a.join([b.table.address])
            assert a.table.seeds == [b.table.address]
            await b.aclose()
            await until(lambda: not a.table.members, "a has forgotten b")
            restarted, router_r = membership("b", time.monotonic, [], backoff)
            async with await _serve(restarted, router_r, port):
                await until(lambda: "b" in a.channels.peers, "a has joined its seed again")
                await restarted.aclose()
        finally:
            retrying.cancel()
            await asyncio.gather(retrying, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_leaving_worker_takes_nobody_in() -> None:
    a, router_a = membership("a", FakeClock(), [])
    b, router_b = membership("b", FakeClock(), [])
    async with listening(a, router_a), listening(b, router_b):
        a.leave()
        with pytest.raises(WorkerUnavailable, match="leaving"):
            await b.join([a.table.address])
        assert a.channels.peers == {}


# -- the address a worker advertises -----------------------------------------------------------


def test_a_worker_never_advertises_a_wildcard() -> None:
    assert advertised_address("127.0.0.1", 7341) == "127.0.0.1:7341"
    assert advertised_address("::1", 7341) == "[::1]:7341"
    for wildcard in ("0.0.0.0", "::"):
        host = advertised_address(wildcard, 7341).rsplit(":", 1)[0].strip("[]")
        assert host not in ("0.0.0.0", "::", "")
    assert advertised_address("0.0.0.0", 7341, "10.1.2.3") == "10.1.2.3:7341"
    assert advertised_address("0.0.0.0", 7341, "10.1.2.3:80") == "10.1.2.3:80"
    assert advertised_address("0.0.0.0", 7341, "gpu7.lan:9000") == "gpu7.lan:9000"
    with pytest.raises(ConfigError, match="wildcard"):
        advertised_address("127.0.0.1", 7341, "0.0.0.0:7341")


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"advertise_address": "0.0.0.0:7341"}, "wildcard"),
        ({"advertise_address": "[::]"}, "wildcard"),
        ({"advertise_address": "host:port"}, "not a number"),
        ({"join_timeout_s": 0.0}, "join_timeout_s must be > 0"),
    ],
)
def test_bad_join_and_advertise_settings_are_config_errors(
    kwargs: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem):
        WorkerConfig(**kwargs)
