"""Cluster membership: join through any known address, keep a channel to every peer, send
heartbeats, and drop peers that fall silent or whose connection breaks.

The mesh is full (every worker talks to every other); that suits the tens of workers compass
targets on a LAN. A peer is known by its name; two workers that connect to each other at once
end up with two channels, and the newer one is used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compass.config import Limits, Timeouts
from compass.errors import CompassError
from compass.wire.transport import Channel, Handler, NotifyHandler, connect

__all__ = ["Membership", "Peer", "gossip_gap_s"]

log = logging.getLogger("compass.worker")


def gossip_gap_s(min_gap_s: float, peers: int, max_rate: float) -> float:
    """The least seconds between two heartbeats of a worker with ``peers`` peers: at least
    ``min_gap_s``, and enough that it sends at most ``max_rate`` messages a second in all
    (a full mesh: one message per peer per heartbeat)."""
    return max(min_gap_s, peers / max_rate)


@dataclass(slots=True)
class Peer:
    name: str
    address: str
    channel: Channel
    last_seen: float
    joined_at: float


class Membership:
    """Who is in the cluster, as seen from one worker.

    ``clock`` is read for every time it keeps (join, last heartbeat, ages, expiry): seconds
    that only move forward, :func:`time.monotonic` by default.
    """

    def __init__(
        self,
        *,
        name: str,
        address: str,
        token: str | None,
        limits: Limits,
        timeouts: Timeouts,
        handler: Handler,
        notify_handler: NotifyHandler,
        on_join: Callable[[Peer], None],
        on_leave: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.address = address
        self._token = token
        self._limits = limits
        self._timeouts = timeouts
        self._handler = handler
        self._notify_handler = notify_handler
        self._on_join = on_join
        self._on_leave = on_leave
        self._clock = clock
        self.peers: dict[str, Peer] = {}
        self._connecting: set[str] = set()
        self._closing: set[asyncio.Task[None]] = set()  # channels of removed peers, closing
        self._closed = False

    # -- joining -----------------------------------------------------------------------------
    async def join(self, addresses: list[str]) -> None:
        """Connect to each seed, learn its members, and connect to those too."""
        pending = list(addresses)
        tried: set[str] = set()
        while pending:
            address = pending.pop()
            if address in tried or address == self.address:
                continue
            tried.add(address)
            members = await self.connect_peer(address)
            pending.extend(m for m in members if m not in tried)

    async def connect_peer(self, address: str) -> list[str]:
        """Open a channel to the worker at ``address``; returns the addresses it knows."""
        if address in self._connecting or self._closed:
            return []
        self._connecting.add(address)
        try:
            channel = await connect(
                address,
                token=self._token,
                name=self.name,
                role="worker",
                limits=self._limits,
                timeouts=self._timeouts,
                handler=self._handler,
                notify_handler=self._notify_handler,
            )
            try:
                reply = await channel.request("join", {"name": self.name, "address": self.address})
            except BaseException:
                await channel.aclose()
                raise
            self.register(channel, str(reply["name"]), str(reply["address"]))
            return [str(a) for a in reply.get("members", [])]
        finally:
            self._connecting.discard(address)

    def accept_join(self, channel: Channel, body: Any) -> dict[str, Any]:
        """Answer a peer's ``join`` request on an accepted channel."""
        if not isinstance(body, dict) or "name" not in body or "address" not in body:
            raise CompassError("join needs {name, address}")
        self.register(channel, str(body["name"]), str(body["address"]))
        return {
            "name": self.name,
            "address": self.address,
            "members": [p.address for p in self.peers.values() if p.name != body["name"]],
        }

    def register(self, channel: Channel, name: str, address: str) -> None:
        if name == self.name:
            raise CompassError(
                f"a worker named {name!r} is already this worker: names must be unique"
            )
        now = self._clock()
        old = self.peers.get(name)
        peer = Peer(name, address, channel, last_seen=now, joined_at=now)
        self.peers[name] = peer
        channel.on_close.append(lambda ch, exc: self._channel_closed(name, ch, exc))
        if old is None:
            log.info("%s: peer %s joined from %s", self.name, name, address)
            self._on_join(peer)

    def _channel_closed(self, name: str, channel: Channel, exc: BaseException | None) -> None:
        peer = self.peers.get(name)
        if peer is not None and peer.channel is channel:
            self.remove(name, f"connection closed ({exc or 'by peer'})")

    def remove(self, name: str, why: str) -> None:
        peer = self.peers.pop(name, None)
        if peer is None:
            return
        log.warning("%s: peer %s removed: %s", self.name, name, why)
        if not peer.channel.closed:
            task = asyncio.get_running_loop().create_task(peer.channel.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._on_leave(name, why)

    # -- liveness ----------------------------------------------------------------------------
    def seen(self, name: str) -> None:
        peer = self.peers.get(name)
        if peer is not None:
            peer.last_seen = self._clock()

    def expire(self, timeout_s: float) -> list[str]:
        """Remove peers silent for longer than ``timeout_s``; returns their names."""
        now = self._clock()
        silent = [p.name for p in self.peers.values() if now - p.last_seen > timeout_s]
        for name in silent:
            self.remove(name, f"silent for more than {timeout_s * 1000:.0f} ms")
        return silent

    def broadcast(self, op: str, body: Any) -> None:
        for peer in list(self.peers.values()):
            if not peer.channel.closed:
                peer.channel.notify(op, body)

    def channel(self, name: str) -> Channel | None:
        peer = self.peers.get(name)
        return None if peer is None else peer.channel

    def describe(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {"name": p.name, "address": p.address, "age_ms": round((now - p.last_seen) * 1000, 1)}
            for p in sorted(self.peers.values(), key=lambda p: p.name)
        ]

    async def aclose(self) -> None:
        self._closed = True
        peers = list(self.peers.values())
        self.peers.clear()
        await asyncio.gather(
            *(p.channel.aclose() for p in peers), *self._closing, return_exceptions=True
        )
