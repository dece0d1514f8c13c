"""Issue 24: a join costs O(1) dials. A joiner dials its seed only and takes the members the
welcome names as live peers without dialing them; a worker that hears of a member it never saw
(an ``alive`` update) does the same; the uniqueness of a name is checked at the first handshake
with such a peer. The table's rules without a socket, then in-memory workers counting dials."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compass.errors import ConfigError
from compass.membership.events import (
    Dial,
    Duplicate,
    Gossiped,
    JoinAnswered,
    JoinAsked,
    Named,
    PeerDown,
    PeerUp,
    Refuse,
    Remove,
    RetryAt,
    Tick,
    Update,
    Welcome,
    named_in,
)
from compass.wire.memory import MemoryNetwork
from compass.wire.transport import Channel, ChannelOptions
from tests.unit.worker.test_members import T0, Node, hello, joined, state, table, until

N = 50


def welcomed(n: int = N) -> Any:
    """A joiner ``j`` whose seed ``s`` answered with a welcome naming ``n`` members."""
    t = table("j")
    answer = t.handle(JoinAnswered(T0, "s.lan:7341", None, hello("s")))
    assert [type(d) for d in answer] == [PeerUp]
    members = tuple((f"m{i}", f"m{i}.lan:7341", i % 3) for i in range(n))
    return t, t.handle(Named(T0, "s", members))


def test_a_joiner_takes_the_members_of_a_welcome_as_live_without_dialing_them() -> None:
    t, decisions = welcomed()
    assert [type(d) for d in decisions] == [PeerUp] * N
    assert all(not d.replaces and d.back_after_s is None for d in decisions)
    assert set(t.live) == {"s", *(f"m{i}" for i in range(N))}
    assert t.members["m4"].incarnation == 1 and t.members["m4"].instance == ""
    assert t.members["s"].instance == "s-1"  # the seed was met: a handshake
    # nothing is dialed for them, now or later: only probes reach them, one a period
    for step in range(20):
        assert [d for d in t.handle(Tick(T0 + step * 0.1)) if type(d) is Dial] == []


def test_a_welcome_naming_a_lost_member_retries_it_at_once() -> None:
    t = table("j")
    joined(t, "m0")
    t.handle(JoinAnswered(T0, "s.lan:7341", None, hello("s")))
    t.handle(Remove(T0 + 0.5, "m0", "test"))
    now = T0 + 0.55  # its first retry is at T0 + 0.6
    assert "m0" not in t.live and t.members["m0"].retry_at > now
    decisions = t.handle(Named(now, "s", (("m0", "m0.lan:7341", 0),)))
    assert decisions == [RetryAt("m0", "m0.lan:7341", 0, now)]
    assert [d for d in t.handle(Tick(now)) if type(d) is Dial] == [Dial("m0", "m0.lan:7341")]
    assert t.dead_for("m0") == 0  # the handshake tells it it was declared dead


def test_a_member_heard_of_in_an_update_is_live_and_not_dialed() -> None:
    t = table("a")
    joined(t, "b")
    decisions = t.handle(Gossiped(T0, "b", (Update("alive", "n", 2, "n.lan:7341", "b"),)))
    assert decisions == [PeerUp("n", "n.lan:7341", 2, back_after_s=None, replaces=False)]
    assert "n" in t.live and t.members["n"].instance == ""
    assert t.detector.broadcasts.get("n") == Update("alive", "n", 2, "n.lan:7341", "b")  # passed on
    assert [d for d in t.handle(Tick(T0 + 5)) if type(d) is Dial] == []


def test_uniqueness_is_checked_at_the_first_handshake_with_a_named_peer() -> None:
    t, _ = welcomed(3)
    # m0 dials this worker from its address: it is m0; its instance is learnt
    (up, welcome) = t.handle(JoinAsked(T0 + 1, hello("m0")))
    assert up == PeerUp("m0", "m0.lan:7341", 0, back_after_s=None, replaces=True)
    assert isinstance(welcome, Welcome) and t.members["m0"].instance == "m0-1"
    # a second worker named m1 at another address: refused, nothing changes
    before = state(t)
    (refuse,) = t.handle(JoinAsked(T0 + 1, hello("m1", instance="x", address="x.lan:1")))
    assert isinstance(refuse, Refuse) and "'m1' is taken" in refuse.message
    assert state(t) == before
    # dialing m2 (a send or a probe) reaches another worker under its name: a duplicate
    (dup,) = t.handle(
        JoinAnswered(T0 + 1, "x.lan:2", "m2", hello("m2", instance="y", address="x.lan:2"))
    )
    assert dup == Duplicate("m2", "x.lan:2", "m2.lan:7341")
    assert t.members["m2"].instance == ""
    # the answer from m2's own address: it is m2
    (up,) = t.handle(JoinAnswered(T0 + 1, "m2.lan:7341", "m2", hello("m2")))
    assert up.replaces and t.members["m2"].instance == "m2-1"
    # and from then on, another instance at its address is a restart, as for any peer
    down, *_ = t.handle(JoinAsked(T0 + 2, hello("m2", instance="m2-2")))
    assert isinstance(down, PeerDown) and "restarted" in down.why


def test_a_seed_refuses_a_newcomer_under_the_name_of_a_member_it_only_heard_of() -> None:
    t = table("s")
    joined(t, "b")
    t.handle(Gossiped(T0, "b", (Update("alive", "n", 0, "n.lan:7341", "b"),)))
    (refuse,) = t.handle(JoinAsked(T0 + 1, hello("n", instance="n-2", address="other:1")))
    assert isinstance(refuse, Refuse) and refuse.kind is ConfigError
    assert t.members["n"].address == "n.lan:7341"


def test_a_redial_asks_for_no_member_list() -> None:
    t = table("a")
    joined(t, "b", "c")
    (*_, full) = t.handle(JoinAsked(T0, hello("d")))
    assert isinstance(full, Welcome)
    assert named_in(full.reply) == (("b", "b.lan:7341", 0), ("c", "c.lan:7341", 0))
    (*_, bare) = t.handle(JoinAsked(T0, hello("b"), wants_list=False))
    assert isinstance(bare, Welcome) and set(bare.reply) == {
        "name", "address", "incarnation", "instance", "dead"
    }  # fmt: skip


# -- in memory: an event loop, no socket -------------------------------------------------------
class Counting(Node):
    """A :class:`Node` that counts the channels it dials."""

    def __init__(self, network: MemoryNetwork, name: str) -> None:
        super().__init__(network, name)
        self.dials = 0

    async def dial(
        self, address: str | tuple[str, int], options: ChannelOptions, **kwargs: Any
    ) -> Channel:
        self.dials += 1
        return await super().dial(address, options, **kwargs)


@pytest.mark.asyncio
async def test_in_memory_workers_joining_one_seed_dial_it_only() -> None:
    network = MemoryNetwork()
    nodes = [Counting(network, f"w{i}") for i in range(8)]
    for node in nodes:
        await node.listen()
    seed, *others = nodes
    try:
        for node in others:
            await node.membership.join([seed.membership.table.address])
        last = others[-1].membership
        assert set(last.channels.peers) == {n.membership.name for n in nodes} - {last.name}
        assert [n.dials for n in others] == [1] * len(others)  # its seed, and nobody else
        assert seed.dials == 0
        assert last.channels.open_channels == 1
        # the seed passes each newcomer on in its updates: the others take it as live, undialed
        tasks = [asyncio.ensure_future(n.membership.run()) for n in nodes]
        try:
            await until(
                lambda: all(len(n.membership.channels.peers) == len(nodes) - 1 for n in nodes),
                "every worker knows every other",
            )
            # a send to a named peer dials it on demand; its instance is learnt then
            first = others[0]
            assert first.membership.table.members[last.name].instance in ("", last.table.instance)
            assert await first.membership.channels.open_channel(last.name) is not None
            assert first.membership.table.members[last.name].instance == last.table.instance
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for node in nodes:
            await node.aclose()
