"""A worker's channels to its peers, opened on demand: the part of
:class:`~compass.worker.membership.Membership` that dials, queues, closes idle channels and caps
them.

A peer is live per the member table whether or not a channel to it is open: a send to one with
none dials it (one dial per peer at a time, what is sent meanwhile queued), a channel idle for
:attr:`~compass.worker.membership.MembershipOptions.idle_s` is closed, and at most
``max_channels`` are open (the least recently used with no request under way is closed first).
Closing by choice is no failure: the closer says ``bye`` and sends nothing more on it, the peer
closes it once its requests are answered. A channel that breaks is no verdict either: the
member table probes the peer (:class:`~compass.membership.events.ChannelLost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compass.errors import CompassError
from compass.membership.events import ChannelLost, Decision, Event
from compass.membership.table import Member
from compass.supervisor import Supervisor
from compass.wire.transport import Channel, ChannelOptions

__all__ = ["BYE_OP", "MAX_PEER_CHANNELS", "MAX_QUEUED", "PEER_IDLE_S", "Peer", "PeerChannels"]

log = logging.getLogger("compass.worker")

#: channels to peers closed after this long without a message either way (seconds)
PEER_IDLE_S = 30.0

#: open channels to peers one worker keeps at most (the least recently used idle one is closed)
MAX_PEER_CHANNELS = 64

#: notifies queued for one peer while it is dialed; more are dropped (a notify is fire-and-forget)
MAX_QUEUED = 256

#: the notify that says "this side closes this channel by choice, it is idle": no failure
BYE_OP = "bye"


@dataclass(frozen=True, slots=True)
class Peer:
    """A live peer: what the member table knows of it, and the open channel to it, if any
    (channels are opened when there is something to send and closed when idle, see
    :class:`Membership`)."""

    member: Member
    channel: Channel | None

    @property
    def name(self) -> str:
        return self.member.name

    @property
    def address(self) -> str:
        return self.member.address

    @property
    def last_seen(self) -> float:
        """When it was last heard from (the membership's clock)."""
        return self.member.last_seen

    @property
    def joined_at(self) -> float:
        return self.member.joined_at


class PeerChannels:
    """The channels half of :class:`~compass.worker.membership.Membership` (its base): what
    is open to whom, dialing on demand, closing by choice. The membership sets the attributes
    below and provides ``name``, ``_apply`` (the member table's events) and ``_reach`` (a
    dial and join handshake)."""

    peers: dict[str, Peer]
    _channels: ChannelOptions
    _clock: Callable[[], float]
    _closed: bool
    #: its background tasks (dials, channels closing), supervised: a failure is logged
    _tasks: Supervisor
    _reaching: dict[str, asyncio.Task[Channel]]
    #: every open channel to a peer, dialed or accepted (a peer may have two), by channel
    _open: dict[Channel, str]
    #: channels this side closes by choice (idle, over the cap, of a removed peer) or the
    #: peer said it closes (``bye``): their end is no failure
    _retired: set[Channel]
    #: peers whose channel broke (not closed by choice): a new one is a reconnection
    _broken: set[str]
    #: notifies waiting for a peer being dialed, by name
    _queued: dict[str, list[tuple[str, Any]]]
    _idle_s: float
    _max_channels: int
    _max_queued: int

    @property
    def name(self) -> str:
        raise NotImplementedError

    def _apply(self, event: Event, channel: Channel | None = None) -> list[Decision]:
        raise NotImplementedError

    async def _reach(self, name: str, address: str) -> Channel:
        raise NotImplementedError

    @property
    def open_channels(self) -> int:
        """Channels to peers open now (dialed or accepted; closing ones not counted)."""
        return len(self._open)

    def _adopt(self, name: str, channel: Channel) -> None:
        """``channel`` (dialed, or accepted from ``name``) carries a join: count it, and close
        the least recently used if that makes too many."""
        if channel in self._open or channel in self._retired or channel.closed:
            return  # counted already, or closing (the peer said bye before its join ended)
        self._open[channel] = name
        channel.on_close.append(lambda ch, exc: self._channel_closed(name, ch, exc))
        self._trim(keep=channel)

    def _trim(self, keep: Channel | None = None) -> None:
        """Close the least recently used channels with no request under way while more than
        :attr:`MembershipOptions.max_channels` are open (``keep``: the one just opened)."""
        excess = len(self._open) - self._max_channels
        if self._max_channels <= 0 or excess <= 0:
            return
        idle = [c for c in self._open if c is not keep and c.in_flight == 0]
        idle.sort(key=lambda c: c.last_active)
        for channel in idle[:excess]:
            log.debug("%s: %d channels to peers open, over %d: closing the one to %s",
                      self.name, len(self._open), self._max_channels,
                      self._open.get(channel))  # fmt: skip
            self._retire(channel)

    def _retire(self, channel: Channel, how: str = "bye") -> None:
        """Close ``channel`` by choice: its end is no failure, here or at the peer; the peer
        stays live, and is dialed again when there is something to send. Nothing more is sent
        on it from now on. ``how``: ``"bye"`` tells the peer, which closes it once it has read
        that (so what it sent before is still read here); ``"quiet"`` (the peer said bye)
        closes it once the requests under way on it are answered; ``"now"`` (a removed peer)
        at once."""
        name = self._open.pop(channel, None)
        if channel in self._retired:
            return
        self._retired.add(channel)
        if name is not None:
            self._detach(name, channel)
        if channel.closed:
            self._retired.discard(channel)
            return
        if how == "bye":
            try:
                channel.notify(BYE_OP, {"from": self.name})
            except CompassError:
                how = "now"
        # finished, not cancelled, when the membership closes: the peer is told, or it times out
        peer = name or channel.peer_name
        self._tasks.spawn(self._close(channel, how), f"{self.name}-close-{peer}", finish=True)

    async def _close(self, channel: Channel, how: str) -> None:
        timeouts = self._channels.timeouts
        if how == "bye":  # the peer closes it; past the close timeout, this side does
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeouts.close):
                    await channel.wait_closed()
        elif how == "quiet":
            loop = asyncio.get_running_loop()
            deadline = loop.time() + (timeouts.request or timeouts.close)
            # the channel has no event for "no request under way": look every 20 ms
            while channel.in_flight and not channel.closed and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        await channel.aclose()

    def _detach(self, name: str, channel: Channel) -> None:
        """``channel`` to ``name`` is closing: the peer's channel is another open one, if any."""
        peer = self.peers.get(name)
        if peer is not None and peer.channel is channel:
            other = next((c for c, n in self._open.items() if n == name and not c.closed), None)
            self.peers[name] = Peer(peer.member, other)

    def _on_bye(self, channel: Channel, body: Any) -> None:
        """The peer closes ``channel`` by choice (it was idle there): close it too, no failure."""
        if channel.peer_role != "worker":
            return
        if channel in self._retired:
            # both sides said bye at once: each has read all the other will send, and each
            # would wait out the close timeout for the other to close it
            name = self._open.get(channel, channel.peer_name)
            self._tasks.spawn(channel.aclose(), f"{self.name}-close-{name}", finish=True)
            return
        self._retire(channel, "quiet")

    def _channel_closed(self, name: str, channel: Channel, exc: BaseException | None) -> None:
        """A channel to peer ``name`` ended. Closed by choice (either side): nothing to do, the
        peer is dialed when there is something to send. Broken: no verdict, the table probes
        it now (through a new one)."""
        self._open.pop(channel, None)
        if channel in self._retired:
            self._retired.discard(channel)
            return
        peer = self.peers.get(name)
        if peer is None or peer.channel is not channel or self._closed:
            return
        self._detach(name, channel)
        if self.peers[name].channel is not None:
            return  # another channel to it is open: it is reachable
        self._broken.add(name)
        log.info("%s: connection to %s closed (%s); probing it", self.name, name,
                 exc or "by peer")  # fmt: skip
        self._apply(ChannelLost(self._clock(), name))

    async def _sweep(self) -> None:
        """Close the channels idle for :attr:`MembershipOptions.idle_s` (none with a request
        under way), and those over the cap, until cancelled."""
        loop = asyncio.get_running_loop()
        every = min(max(self._idle_s / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(every)
            quiet_since = loop.time() - self._idle_s
            for channel in [c for c in self._open if c.last_active <= quiet_since]:
                if channel.in_flight == 0:
                    log.debug("%s: closing the idle channel to %s", self.name,
                              self._open.get(channel))  # fmt: skip
                    self._retire(channel)
            self._trim()

    def _reach_task(self, name: str, address: str) -> asyncio.Task[Channel]:
        """The dial of live peer ``name`` (one per peer at a time); what was queued for it is
        sent once it is done, or dropped if it failed."""
        reaching = self._reaching.get(name)
        if reaching is None:
            # a peer that cannot be reached is the answer of those waiting for the dial; any
            # other error is a bug, logged by the supervisor
            reaching = self._tasks.spawn(
                self._reach(name, address), f"{self.name}-reach-{name}",
                expected=(CompassError, OSError),
            )  # fmt: skip
            self._reaching[name] = reaching
            reaching.add_done_callback(functools.partial(self._reached, name))
        return reaching

    def _reached(self, name: str, task: asyncio.Task[Channel]) -> None:
        if self._reaching.get(name) is task:
            del self._reaching[name]
        queued = self._queued.pop(name, [])
        if task.cancelled() or task.exception() is not None:
            if queued:
                log.debug("%s: dropped %d messages for %s: it could not be reached",
                          self.name, len(queued), name)  # fmt: skip
            return
        channel = task.result()
        for i, (op, body) in enumerate(queued):
            if not self._send(channel, op, body):  # closed meanwhile: dial it again
                peer = self.peers.get(name)
                if peer is not None and not self._closed:
                    self._queued.setdefault(name, [])[:0] = queued[i:]
                    self._reach_task(name, peer.address)
                break

    async def open_channel(self, name: str) -> Channel | None:
        """An open channel to live peer ``name``: the one there is, else a new one (dialed once
        however many ask at a time); None if it is no peer or could not be reached."""
        peer = self.peers.get(name)
        if peer is None:
            return None
        if peer.channel is not None and not peer.channel.closed:
            return peer.channel
        try:
            return await asyncio.shield(self._reach_task(name, peer.address))
        except (CompassError, OSError) as exc:
            log.debug("%s: could not reach %s: %s", self.name, name, exc)
            return None

    def _send(self, channel: Channel | None, op: str, body: Any) -> bool:
        if channel is None or channel.closed or channel in self._retired:
            return False  # a channel closing by choice carries nothing more
        try:
            channel.notify(op, body)
        except CompassError:  # it broke just now: what it was for times out
            return False
        return True

    def broadcast(self, op: str, body: Any) -> None:
        """Notify every live peer of ``op`` (dialing those with no open channel)."""
        for name in list(self.peers):
            self.send(name, op, body)

    def tell_connected(self, op: str, body: Any) -> int:
        """Notify every live peer a channel is open to now of ``op``, dialing nobody; how
        many were told."""
        return sum(self._send(peer.channel, op, body) for peer in list(self.peers.values()))

    def send(self, name: str, op: str, body: Any) -> bool:
        """Notify live peer ``name`` of ``op``: at once on its open channel, else once it is
        dialed (queued meanwhile, :attr:`MembershipOptions.max_queued` at most, dropped if the
        dial fails). False where it is no peer, or too much waits for it already (a notify is
        fire-and-forget: what it was for is sent again or times out)."""
        peer = self.peers.get(name)
        if peer is None:
            return False
        if self._send(peer.channel, op, body):
            return True
        if self._closed:
            return False
        queued = self._queued.setdefault(name, [])
        if len(queued) >= self._max_queued:
            return False
        queued.append((op, body))
        self._reach_task(name, peer.address)
        return True

    def channel(self, name: str) -> Channel | None:
        """The open channel to live peer ``name``, if there is one now (see
        :meth:`open_channel`)."""
        peer = self.peers.get(name)
        channel = None if peer is None else peer.channel
        return None if channel is None or channel.closed else channel
