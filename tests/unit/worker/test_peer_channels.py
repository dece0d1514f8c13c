"""Channels to peers on demand (compass/worker/membership.py), in memory: a peer stays a member
whether or not a channel to it is open; a send to one with none dials it (once, whatever is
sent meanwhile); idle channels close with no verdict on either side; the cap holds."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from compass.config import Timeouts
from compass.errors import ConfigError
from compass.wire.memory import MemoryNetwork
from compass.wire.rpc import Router
from compass.wire.transport import Channel, ChannelOptions, Server
from compass.worker.membership import Membership, MembershipOptions, Probing

from .test_members import until

TOKEN = "channels-token"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=0.5)
#: probes rare enough that they keep no channel open between them
SLOW_PROBES = Probing(period_s=5.0, timeout_s=1.0)


class Node:
    """A :class:`Membership` on a :class:`MemoryNetwork` that counts the dials it makes and
    the ``note`` notifies it receives."""

    def __init__(
        self, network: MemoryNetwork, name: str, probing: Probing = SLOW_PROBES, **options: Any
    ) -> None:
        self.network = network
        self.router = Router()
        self.left: list[tuple[str, str]] = []
        self.notes: list[Any] = []
        self.dials = 0
        self.server: Server | None = None
        self.options = ChannelOptions(name=name, token=TOKEN, timeouts=FAST)
        self.membership = m = Membership(
            "",
            MembershipOptions(self.options, probing=probing, dial=self.dial,
                              rng=random.Random(7), **options),
            handler=self.router.handle_request, notify_handler=self.router.handle_notify,
            on_join=lambda peer: None, on_leave=lambda peer, why: self.left.append((peer, why)),
        )  # fmt: skip
        m.route(self.router)

        async def join(channel: Channel, body: Any) -> Any:
            return m.accept_join(channel, body)

        self.router.add_request("join", join)
        self.router.add_notify("note", lambda channel, body: self.notes.append(body))
        self.run: asyncio.Future[None] | None = None

    async def dial(self, address: Any, options: ChannelOptions, **kwargs: Any) -> Channel:
        self.dials += 1
        return await self.network.connect(address, options, **kwargs)

    async def start(self) -> Node:
        self.server = await self.network.serve(
            self.membership.name, 0, self.options, handler=self.router.handle_request,
            notify_handler=self.router.handle_notify,
        )  # fmt: skip
        host, port = self.server.address
        self.membership.listen_at(f"{host}:{port}")
        self.run = asyncio.ensure_future(self.membership.run())
        return self

    async def aclose(self) -> None:
        if self.run is not None:
            self.run.cancel()
            await asyncio.gather(self.run, return_exceptions=True)
        await self.membership.aclose()
        if self.server is not None:
            await self.server.aclose()


def test_bad_channel_options_are_config_errors() -> None:
    options = ChannelOptions(name="a", token=TOKEN)
    for bad in ({"idle_s": -1.0}, {"idle_s": float("inf")}, {"max_channels": -1},
                {"max_queued": True}):  # fmt: skip
        with pytest.raises(ConfigError):
            MembershipOptions(options, **bad)


@pytest.mark.asyncio
async def test_idle_channels_close_with_no_verdict_and_a_send_dials_again() -> None:
    network = MemoryNetwork()
    nodes = [await Node(network, name, idle_s=0.2).start() for name in "abc"]
    a, b, c = nodes
    try:
        for node in (b, c):
            await node.membership.join([a.membership.table.address])
        # c knows b from a's welcome; b hears of c from c's first dial (else from gossip, on
        # the first of probes 5 s apart)
        assert c.membership.channels.send("b", "note", "hello")
        await until(lambda: all(len(n.membership.channels.peers) == 2 for n in nodes), "all joined")
        # idle: every channel is closed, by choice, and nobody lost anybody
        await until(
            lambda: all(n.membership.channels.open_channels == 0 for n in nodes), "all idle"
        )
        await asyncio.sleep(0.3)
        for node in nodes:
            assert len(node.membership.channels.peers) == 2 and node.left == []
            assert all(p.channel is None for p in node.membership.channels.peers.values())
            assert node.membership.describe_lost() == []
            assert not any(p["suspect"] for p in node.membership.describe())
        # a send to a live peer with no channel dials it once, whatever is sent meanwhile
        dials = a.dials
        assert all(a.membership.channels.send("c", "note", {"n": n}) for n in range(5))
        await until(lambda: len(c.notes) == 5, "c has every note")
        assert c.notes == [{"n": n} for n in range(5)] and a.dials == dials + 1
        assert (
            a.membership.channels.channel("c") is not None
            and c.membership.channels.channel("a") is not None
        )
        # an accepted channel counts: c answers a on the channel a opened, dialing nobody
        c_dials = c.dials
        assert c.membership.channels.send("a", "note", "back")
        await until(lambda: a.notes == ["back"], "a has c's note")
        assert c.dials == c_dials
        await until(lambda: a.membership.channels.open_channels == 0, "idle again")
        assert a.left == c.left == []
        # a channel that breaks (not closed by choice) is a failure to look at: probed
        channel = a.membership.channels.channel("b") or await a.membership.channels.open_channel(
            "b"
        )
        assert channel is not None
        channel.abort()
        await until(
            lambda: a.membership.table.detector._probes != {} or a.dials > dials + 2, "probed"
        )
    finally:
        for node in nodes:
            await node.aclose()


@pytest.mark.asyncio
async def test_a_capped_worker_never_holds_more_channels_than_its_cap() -> None:
    network = MemoryNetwork()
    hub = await Node(network, "hub", max_channels=2, idle_s=0).start()
    spokes = [await Node(network, f"s{i}", idle_s=0).start() for i in range(5)]
    try:
        for spoke in spokes:
            await spoke.membership.join([hub.membership.table.address])
            assert hub.membership.channels.open_channels <= 2
        await until(lambda: len(hub.membership.channels.peers) == 5, "all joined the hub")
        for _ in range(3):
            for spoke in spokes:
                assert hub.membership.channels.send(
                    spoke.membership.name, "note", hub.membership.name
                )

                def arrived(node: Node = spoke) -> bool:
                    return bool(node.notes)

                await until(arrived, "the note arrives")
                spoke.notes.clear()
                assert hub.membership.channels.open_channels <= 2
        # the spokes dialing the hub: accepted channels count against its cap too
        for spoke in spokes:
            assert spoke.membership.channels.send("hub", "note", spoke.membership.name)
        await until(lambda: len(hub.notes) == 5, "the hub has every note")
        assert hub.membership.channels.open_channels <= 2
        assert hub.left == [] and all(s.left == [] for s in spokes)
        assert len(hub.membership.channels.peers) == 5
    finally:
        for node in [hub, *spokes]:
            await node.aclose()


@pytest.mark.asyncio
async def test_a_worker_that_leaves_tells_its_open_channels_and_they_pass_it_on() -> None:
    """Leaving dials nobody (the worker closes next: a dial to every peer of a large cluster
    would be cancelled unfinished); the peers it has a channel to hear it at once and pass it
    on piggybacked on their probes, so the others know it left, not that it died."""
    network = MemoryNetwork()
    a = await Node(network, "a", idle_s=0.2).start()
    # b probes often (its probes carry the news); c and d hardly at all
    b = await Node(network, "b", probing=Probing(period_s=0.05, timeout_s=0.04)).start()
    others = [await Node(network, name).start() for name in "cd"]
    nodes = [a, b, *others]
    try:
        for node in nodes[1:]:
            await node.membership.join([a.membership.table.address])
        await until(lambda: all(len(n.membership.channels.peers) == 3 for n in nodes), "all joined")
        await until(lambda: a.membership.channels.open_channels == 0, "a's channels idle")
        assert a.membership.channels.send("b", "note", "hello")
        await until(lambda: b.notes == ["hello"], "a has a channel to b")
        dials = a.dials
        a.membership.leave()
        # no dial even begun (a leaving worker makes none)
        assert not a.membership.channels._reaching
        await asyncio.sleep(0.2)
        assert a.dials == dials
        await until(lambda: "a" not in b.membership.channels.peers, "b hears it at once")
        for node in others:

            def heard(node: Node = node) -> bool:
                return "a" not in node.membership.channels.peers

            await until(heard, f"{node.membership.name} hears it from b")
        for node in nodes[1:]:
            assert [peer for peer, _ in node.left] == ["a"]
            assert "left" in node.left[0][1], node.left
            assert next(m for m in node.membership.describe_lost() if m["name"] == "a")["left"]
    finally:
        for node in nodes:
            await node.aclose()


@pytest.mark.asyncio
async def test_a_channel_both_sides_retire_at_once_closes_without_the_close_timeout() -> None:
    """Both ends retire an idle channel at the same moment: each says bye and reads the
    other's, so each closes it then (they waited out the close timeout, 60 s here)."""
    network = MemoryNetwork()
    slow_close = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=60.0)
    a, b = [await Node(network, name).start() for name in "ab"]
    for node in (a, b):
        node.options = ChannelOptions(name=node.membership.name, token=TOKEN, timeouts=slow_close)
        node.membership._channels = node.options
    try:
        await b.membership.join([a.membership.table.address])
        await until(lambda: all(len(n.membership.channels.peers) == 1 for n in (a, b)), "joined")
        ours, theirs = a.membership.channels.channel("b"), b.membership.channels.channel("a")
        assert ours is not None and theirs is not None
        a.membership.channels._retire(ours)
        b.membership.channels._retire(theirs)
        await until(lambda: ours.closed and theirs.closed, "both ends closed", limit_s=5.0)
        assert a.left == b.left == []
    finally:
        for node in (a, b):
            await node.aclose()
