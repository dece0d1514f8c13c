"""A worker's channels to its peers, opened on demand (:class:`PeerChannels`, which its
membership service :class:`~compass.worker.membership.Membership` composes): it dials, queues,
closes idle channels and caps them.

A peer is live per the member table whether or not a channel to it is open: a send to one with
none dials it (one dial per peer at a time, what is sent meanwhile queued), a channel idle for
:attr:`~compass.worker.membership.MembershipOptions.idle_s` is closed, and at most
``max_channels`` are open (the least recently used with no request under way is closed first).
Closing by choice is no failure: the closer says ``bye`` and sends nothing more on it, the peer
closes it once its requests are answered. A channel that breaks is no verdict either: the
member table probes the peer (the membership turns it into a
:class:`~compass.membership.events.ChannelLost`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from compass.config import Timeouts
from compass.errors import CompassError
from compass.membership.table import Member
from compass.supervisor import Supervisor
from compass.wire.transport import Channel

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
    :class:`PeerChannels`)."""

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
    """The channels of worker ``name`` to its live peers (:attr:`peers`), which its
    membership service (:class:`~compass.worker.membership.Membership`) composes: what is
    open to whom, dialing on demand, closing by choice.

    The membership says who is live (:meth:`up`, :meth:`down`); ``reach(name, address)``
    dials a peer and joins it (a new channel, which the membership installs with :meth:`up`),
    ``lost(name)`` hears of a peer whose channel broke with no other open (the member table
    probes it). ``tasks`` runs the dials and the closing channels (the membership's
    supervisor); ``timeouts`` bound a closing channel. ``idle_s``, ``max_channels`` and
    ``max_queued`` are :class:`~compass.worker.membership.MembershipOptions`'.
    """

    def __init__(
        self,
        name: str,
        timeouts: Timeouts,
        tasks: Supervisor,
        *,
        reach: Callable[[str, str], Coroutine[Any, Any, Channel]],
        lost: Callable[[str], None],
        idle_s: float = PEER_IDLE_S,
        max_channels: int = MAX_PEER_CHANNELS,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.name = name
        self._timeouts = timeouts
        self._tasks = tasks
        self._reach = reach
        self._lost = lost
        self.idle_s = idle_s
        self._max_channels = max_channels
        self._max_queued = max_queued
        #: the live peers and their channels, in the member table's order
        self.peers: dict[str, Peer] = {}
        #: closed (:meth:`close`): nothing is sent or dialed any more
        self.closed = False
        #: dials of live peers (one per peer at a time), and the probes waiting
        self._reaching: dict[str, asyncio.Task[Channel]] = {}
        #: every open channel to a peer, dialed or accepted (a peer may have two), by channel
        self._open: dict[Channel, str] = {}
        #: channels this side closes by choice (idle, over the cap, of a removed peer) or the
        #: peer said it closes (``bye``): their end is no failure
        self._retired: set[Channel] = set()
        #: peers whose channel broke (not closed by choice): a new one is a reconnection
        self._broken: set[str] = set()
        #: notifies waiting for a peer being dialed, by name
        self._queued: dict[str, list[tuple[str, Any]]] = {}

    @property
    def open_channels(self) -> int:
        """Channels to peers open now (dialed or accepted; closing ones not counted)."""
        return len(self._open)

    def sizes(self) -> dict[str, int]:
        """Entries in its tables keyed by peers (for ``compass status`` and the soak)."""
        return {
            "peers": len(self.peers),
            "peer_channels": len(self._open),
            "queued_notifies": sum(len(queued) for queued in self._queued.values()),
        }

    def open_list(self) -> list[Channel]:
        """The channels to peers open now (for the sizes of their own tables)."""
        return list(self._open)

    # -- who is live ---------------------------------------------------------------------------
    def up(self, member: Member, channel: Channel | None, *, replaces: bool) -> tuple[Peer, bool]:
        """``member`` is a live peer; ``channel``: the one its join came on (None: it was
        named by another worker, and keeps the channel it has, if any, or is dialed when there
        is something to send). ``replaces``: it was live already. The peer, and whether this
        is a new channel to one whose channel had broken (a reconnection)."""
        name = member.name
        if channel is None:
            before = self.peers.get(name)
            channel = None if before is None else before.channel
        else:
            self._adopt(name, channel)
        peer = Peer(member, channel)
        self.peers[name] = peer
        reconnected = name in self._broken and channel is not None
        if reconnected or not replaces:
            self._broken.discard(name)
        return peer, reconnected

    def down(self, name: str) -> None:
        """Peer ``name`` was removed: its channels are closed at once, what waits for it
        dropped."""
        peer = self.peers.pop(name, None)
        self._broken.discard(name)
        self._queued.pop(name, None)
        if peer is not None and peer.channel is not None:
            self._retire(peer.channel, "now")
        for channel, owner in list(self._open.items()):
            if owner == name:
                self._retire(channel, "now")

    def close(self) -> set[Channel]:
        """Forget every peer and channel, and take nothing more to send; the channels that
        were open, for the caller to close."""
        self.closed = True
        channels = {*self._open, *(p.channel for p in self.peers.values() if p.channel)}
        self.peers.clear()
        self._open.clear()
        self._queued.clear()
        return channels

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
        timeouts = self._timeouts
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

    def on_bye(self, channel: Channel, body: Any) -> None:
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
        if peer is None or peer.channel is not channel or self.closed:
            return
        self._detach(name, channel)
        if self.peers[name].channel is not None:
            return  # another channel to it is open: it is reachable
        self._broken.add(name)
        log.info("%s: connection to %s closed (%s); probing it", self.name, name,
                 exc or "by peer")  # fmt: skip
        self._lost(name)

    async def sweep(self) -> None:
        """Close the channels idle for :attr:`MembershipOptions.idle_s` (none with a request
        under way), and those over the cap, until cancelled."""
        loop = asyncio.get_running_loop()
        every = min(max(self.idle_s / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(every)
            quiet_since = loop.time() - self.idle_s
            for channel in [c for c in self._open if c.last_active <= quiet_since]:
                if channel.in_flight == 0:
                    log.debug("%s: closing the idle channel to %s", self.name,
                              self._open.get(channel))  # fmt: skip
                    self._retire(channel)
            self._trim()

    def reach(self, name: str, address: str) -> asyncio.Task[Channel]:
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
            if not self.send_on(channel, op, body):  # closed meanwhile: dial it again
                peer = self.peers.get(name)
                if peer is not None and not self.closed:
                    self._queued.setdefault(name, [])[:0] = queued[i:]
                    self.reach(name, peer.address)
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
            return await asyncio.shield(self.reach(name, peer.address))
        except (CompassError, OSError) as exc:
            log.debug("%s: could not reach %s: %s", self.name, name, exc)
            return None

    def send_on(self, channel: Channel | None, op: str, body: Any) -> bool:
        """Notify ``op`` on ``channel`` (one to a peer, or None): False where there is none,
        it is closed or closing by choice, or it broke just now."""
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
        return sum(self.send_on(peer.channel, op, body) for peer in list(self.peers.values()))

    def send(self, name: str, op: str, body: Any) -> bool:
        """Notify live peer ``name`` of ``op``: at once on its open channel, else once it is
        dialed (queued meanwhile, :attr:`MembershipOptions.max_queued` at most, dropped if the
        dial fails). False where it is no peer, or too much waits for it already (a notify is
        fire-and-forget: what it was for is sent again or times out)."""
        peer = self.peers.get(name)
        if peer is None:
            return False
        if self.send_on(peer.channel, op, body):
            return True
        if self.closed:
            return False
        queued = self._queued.setdefault(name, [])
        if len(queued) >= self._max_queued:
            return False
        queued.append((op, body))
        self.reach(name, peer.address)
        return True

    def channel(self, name: str) -> Channel | None:
        """The open channel to live peer ``name``, if there is one now (see
        :meth:`open_channel`)."""
        peer = self.peers.get(name)
        channel = None if peer is None else peer.channel
        return None if channel is None or channel.closed else channel
