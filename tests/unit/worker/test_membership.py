"""Membership: how often a worker may gossip, and when a silent peer is dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from compass.config import Limits, Timeouts
from compass.wire.rpc import Router
from compass.wire.transport import Channel, serve
from compass.worker.membership import Membership, gossip_gap_s

TOKEN = "cluster-secret"
FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=2.0)


def test_small_clusters_gossip_at_the_least_gap() -> None:
    assert gossip_gap_s(0.001, 0, 20000.0) == 0.001
    assert gossip_gap_s(0.001, 4, 20000.0) == 0.001
    assert gossip_gap_s(0.001, 20, 20000.0) == pytest.approx(0.001)


def test_large_clusters_space_heartbeats_to_keep_the_message_rate() -> None:
    for peers in (40, 100, 239):
        gap = gossip_gap_s(0.001, peers, 20000.0)
        assert gap > 0.001
        assert peers / gap == pytest.approx(20000.0)  # messages a second, over all peers


# -- liveness on an injected clock -------------------------------------------------------------


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def membership(
    name: str, clock: FakeClock, left: list[tuple[str, str]]
) -> tuple[Membership, Router]:
    router = Router()
    member = Membership(
        name=name,
        address="",  # set once its server listens
        token=TOKEN,
        limits=Limits(),
        timeouts=FAST,
        handler=router.handle_request,
        notify_handler=router.handle_notify,
        on_join=lambda peer: None,
        on_leave=lambda peer, why: left.append((peer, why)),
        clock=clock,
    )

    @router.request("join")
    async def join(channel: Channel, body: Any) -> Any:
        return member.accept_join(channel, body)

    return member, router


@asynccontextmanager
async def listening(member: Membership, router: Router) -> AsyncIterator[None]:
    server = await serve(
        "127.0.0.1",
        0,
        token=TOKEN,
        name=member.name,
        handler=router.handle_request,
        notify_handler=router.handle_notify,
        timeouts=FAST,
    )
    host, port = server.address[:2]
    member.address = f"{host}:{port}"
    async with server:
        try:
            yield
        finally:
            await member.aclose()


@pytest.mark.asyncio
async def test_a_silent_peer_expires_exactly_when_the_clock_passes_the_timeout() -> None:
    clock_a, clock_b = FakeClock(1000.0), FakeClock(5.0)
    left_a: list[tuple[str, str]] = []
    a, router_a = membership("a", clock_a, left_a)
    b, router_b = membership("b", clock_b, [])
    async with listening(a, router_a), listening(b, router_b):
        await a.join([b.address])  # over a real loopback channel
        assert set(a.peers) == {"b"}
        assert a.peers["b"].last_seen == a.peers["b"].joined_at == 1000.0
        assert b.peers["a"].last_seen == 5.0  # each side reads its own clock

        clock_a.now = 1000.5
        assert a.describe() == [{"name": "b", "address": b.address, "age_ms": 500.0}]
        a.seen("b")  # a heartbeat at 1000.5
        clock_a.now = 1002.5
        assert a.expire(2.0) == []  # silent for exactly the timeout: not yet
        assert "b" in a.peers
        clock_a.now = 1002.5 + 1e-6
        # b's clock never moved: a is not silent there, whatever the wall clock did
        assert b.expire(2.0) == []
        assert a.expire(2.0) == ["b"]
        assert "b" not in a.peers
        assert left_a == [("b", "silent for more than 2000 ms")]
        assert a.expire(2.0) == []  # removed once
