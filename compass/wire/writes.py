"""Write batching for one channel: a few small messages per system call, none held for long.

The first write of a loop iteration goes out at once, so a lone request waits for nothing.
While other requests are in flight, later writes in the same iteration are gathered and go
out together at the start of the next one (at most :data:`HELD_WRITES` pieces held), so 64
pipelined answers cost a few system calls, not 64. Answers to a batch of requests read
together are held until every handler started by the batch has had its first step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["HELD_WRITES", "WriteBatcher"]

#: small writes held back within one loop iteration before they go out together; a few, not
#: all: the peer starts on the first ones while this side prepares the rest (measured on
#: loopback: 4-8 doubles pipelined throughput over writing each message; 32 loses half of it)
HELD_WRITES = 6

Chunks = list[bytes | memoryview]


def _nothing_in_flight() -> int:
    return 0


def _nothing_queued() -> Chunks:
    return []


class WriteBatcher:
    """Decides when the bytes a connection queued reach the transport.

    ``source`` returns (and forgets) what the connection queued; ``in_flight`` counts the
    requests and handlers in progress, which predicts whether more writes follow soon.
    """

    __slots__ = (
        "_flush_scheduled",
        "_holds",
        "_in_flight",
        "_loop",
        "_pending",
        "_reading",
        "_source",
        "_transport",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        source: Callable[[], Chunks],
        in_flight: Callable[[], int],
    ) -> None:
        self._loop = loop
        self._source = source
        self._in_flight = in_flight
        self._transport: asyncio.Transport | None = None
        self._pending: Chunks = []  # held until the end of the loop iteration
        self._flush_scheduled = False
        self._reading = False  # inside a batch of received messages
        self._holds = 0  # handlers started by a batch that have not had their first step

    def attach(self, transport: asyncio.Transport) -> None:
        """Write to ``transport`` from now on."""
        self._transport = transport

    @property
    def reading(self) -> bool:
        """True between :meth:`start_batch` and :meth:`end_batch`."""
        return self._reading

    def hold(self) -> None:
        """A handler started that has not had its first step: gather writes until it has."""
        self._holds += 1

    def release(self) -> None:
        """A handler counted by :meth:`hold` has had its first step."""
        self._holds -= 1

    def start_batch(self) -> None:
        """Received messages are being handled: what they queue goes out when they are done."""
        self._reading = True

    def end_batch(self, *, flush: bool) -> None:
        """The batch is handled; with ``flush``, what it queued goes out in one write.

        Without ``flush`` (the batch broke the connection) what it queued stays for
        :meth:`close` to write.
        """
        self._reading = False
        if not flush:
            return
        data = self._source()
        if data:
            if self._pending:
                self._pending.extend(data)
            else:
                self._pending = data
        if self._pending and not self._flush_scheduled:
            self.flush()

    def write_out(self) -> None:
        """Write what the connection queued now, or gather it for the end of the iteration."""
        data = self._source()
        if not data:
            return
        if self._reading:
            # answered inline while reading a batch of requests: one write when the batch ends
            self._pending.extend(data)
            return
        if self._holds or (self._flush_scheduled and len(self._pending) < HELD_WRITES):
            self._pending.extend(data)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self._loop.call_soon(self._scheduled_flush)
            return
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if not self._flush_scheduled and self._in_flight() > 1:
            # other requests are in flight, so more writes are likely in this iteration: hold
            # them until it is over (a lone request skips this bookkeeping)
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)
        if self._pending:
            data = self._pending + data
            self._pending = []
        if len(data) == 1:
            transport.write(data[0])
        else:
            transport.writelines(data)

    def write_gathered(self) -> None:
        """:meth:`write_out` for a writer likely to write again in this pass of the loop (a
        stream's producer): its first write of a pass goes out at once, later ones together
        at the end of the pass."""
        if self._reading or self._flush_scheduled:
            self._pending.extend(self._source())
            return
        self.write_out()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)

    def spill(self) -> None:
        """Write what the batch being read has queued so far, now, and keep reading the batch.

        A batch of many requests would otherwise answer them all before the transport's flow
        control sees any of it (see :class:`~compass.wire.channel.Channel`).
        """
        data = self._source()
        if data:
            self._pending.extend(data)
        self.flush()

    def detach(self) -> None:
        """The connection is gone: drop the transport and the callbacks into the channel."""
        self._transport = None
        self._pending = []
        self._source = _nothing_queued
        self._in_flight = _nothing_in_flight

    def flush(self) -> None:
        """Write everything gathered so far."""
        pending = self._pending
        if pending:
            self._pending = []
            transport = self._transport
            if transport is not None and not transport.is_closing():
                if len(pending) == 1:
                    transport.write(pending[0])
                else:
                    transport.writelines(pending)

    def close(self) -> bool:
        """Write everything gathered and queued, then close the transport.

        Returns False if there was no transport to close.
        """
        transport = self._transport
        if transport is None:
            return False
        self._pending.extend(self._source())
        self.flush()
        transport.close()
        return True

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self.flush()
