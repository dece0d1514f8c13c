"""A worker's typed messages to its peers (:class:`Outbox`): sent on the peer's open channel,
or held a moment for a peer with none.

The core's :class:`~compass.core.events.Send` instructions come here. A message for a live
peer with no open channel (channels are opened on demand, see
:mod:`~compass.worker.peer_channels`) waits while the peer is dialed; one for a worker this one
has no connection to at all (it restarted, or the peer did, and they are still connecting)
waits up to :data:`HOLD_S` too. What cannot be sent, or waited past that, goes back to the core
as an :class:`~compass.core.events.Undeliverable` event, and its job is planned again by its
ingress.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from compass.core.events import Event, Undeliverable
from compass.core.messages import PeerMessage, TaskMsg
from compass.observe.tracing import TRACE_FIELD, Tracer
from compass.worker.peer_channels import PeerChannels

__all__ = ["HOLD_S", "MAX_HELD", "Outbox"]

#: seconds a message for a worker this one has no connection to waits for one (a restarted
#: worker meets every member within moments of joining, and they take it back as soon)
HOLD_S = 2.0
#: messages held for workers not connected, at most (past it their jobs are planned again)
MAX_HELD = 10_000

log = logging.getLogger("compass.worker")


class Outbox:
    """The messages worker ``name`` sends its peers over ``channels`` (None: a worker with no
    membership, which holds nothing). ``tracer`` adds a traced job's spans to its messages;
    ``apply`` feeds the core an event (a message it could not send); ``clock`` is the
    core's; ``spawn(coro, name)`` runs a dial as a supervised task."""

    def __init__(
        self,
        name: str,
        channels: PeerChannels | None,
        tracer: Tracer,
        *,
        apply: Callable[[Event], None],
        clock: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        self.name = name
        self.channels = channels
        self._tracer = tracer
        self._apply = apply
        self._clock = clock
        self._spawn = spawn
        #: messages for workers this one has no connection to, by name, and their timers
        self.held: dict[str, list[PeerMessage]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        #: the dials of peers that messages wait for (:meth:`_hold`)
        self.dialing: dict[str, asyncio.Task[None]] = {}

    def send(self, worker: str, msg: PeerMessage) -> None:
        """Send ``msg`` to ``worker`` now, or hold it until there is a channel to it."""
        channels = self.channels
        channel = None if channels is None else channels.channel(worker)
        if channels is not None and (worker in self.held or channel is None or channel.closed):
            # not connected (yet, or any more): wait a moment for it. A live peer with no open
            # channel (channels are opened on demand) is dialed; a worker this one lost may be
            # back already for the job's ingress, whose plan names it; one that is gone for
            # good has its jobs planned again by their ingresses (PeerLost) meanwhile
            self._hold(worker, msg)
            if channel is None and worker not in self.dialing and worker in channels.peers:
                self.dialing[worker] = self._spawn(self._dial(worker), f"dial-{worker}")
            return
        assert channel is not None
        body = msg.to_wire()
        if isinstance(msg, TaskMsg):
            body["sent"] = time.time()  # the receiver derives the push's transfer time
        if self._tracer.jobs:  # some job is traced: its messages carry its spans
            traced = self._tracer.outgoing(msg, worker)
            if traced is not None:
                body[TRACE_FIELD] = traced
        try:
            channel.notify(msg.op, body)
        except Exception as exc:  # an output the wire cannot encode, or a channel just closed
            why = f"{type(exc).__name__}: {exc}"
            log.warning("%s: could not send %r to %s: %s", self.name, msg.op, worker, why)
            self._apply(Undeliverable(self._clock(), worker, msg, why))

    def _hold(self, worker: str, msg: PeerMessage) -> None:
        """No connection to ``worker``: this worker restarted, or the peer did, and they are
        still connecting, or this worker lost it while the job's ingress has it back. ``msg``
        waits for it, behind what waits already, up to :data:`HOLD_S`; then its job is
        planned again by its ingress."""
        if sum(map(len, self.held.values())) >= MAX_HELD:
            why = f"no connection to {worker}, and {MAX_HELD} messages wait already"
            self._apply(Undeliverable(self._clock(), worker, msg, why, unreachable=True))
            return
        if worker not in self.held:
            self.held[worker] = []
            self._timers[worker] = asyncio.get_running_loop().call_later(
                HOLD_S, self._give_up, worker
            )
        self.held[worker].append(msg)

    async def _dial(self, worker: str) -> None:
        """Open a channel to live peer ``worker`` for what waits for it; if that fails (a bug
        too: the supervisor logs it), it waits on (:data:`HOLD_S`, then its jobs are planned
        again)."""
        assert self.channels is not None
        try:
            channel = await self.channels.open_channel(worker)
        finally:
            self.dialing.pop(worker, None)
        if channel is not None and worker in self.held:
            self.flush(worker)

    async def send_held(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the messages held for peers being dialed to go out:
        a worker about to leave sends what it owes first (a result for a peer whose channel
        closed idle), as a leaving worker dials nobody."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while dials := [task for peer, task in self.dialing.items() if peer in self.held]:
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.wait(dials, timeout=left)

    def flush(self, worker: str) -> None:
        """Peer ``worker`` is connected: send what waited for it, in order."""
        timer = self._timers.pop(worker, None)
        if timer is not None:
            timer.cancel()
        for msg in self.held.pop(worker, []):
            self.send(worker, msg)

    def _give_up(self, worker: str) -> None:
        """No connection to ``worker`` within :data:`HOLD_S`: each job of what waited is
        planned again by its ingress."""
        self._timers.pop(worker, None)
        why = f"no connection to {worker} within {HOLD_S:g} s"
        held = self.held.pop(worker, [])
        jobs = sorted({msg.job for msg in held if hasattr(msg, "job")})
        named = ", ".join(jobs[:5]) + (" ..." if len(jobs) > 5 else "")
        log.warning("%s: could not send %d messages to %s (jobs %s): %s", self.name, len(held),
                    worker, named, why)  # fmt: skip
        for msg in held:
            self._apply(Undeliverable(self._clock(), worker, msg, why, unreachable=True))

    def close(self) -> None:
        """Stop the timers of what is held (the worker closes)."""
        for timer in self._timers.values():
            timer.cancel()
