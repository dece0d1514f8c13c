"""A job whose caller reads its partial outputs as they are made: the ingress's side.

:func:`stream_job` submits a job as :meth:`Worker.submit_job <compass.worker.server.Worker.
submit_job>` does, marked as streaming: every step-wise sink of it reports each step's output
to the ingress (:class:`~compass.core.messages.ChunkMsg`, or at once when it runs here), which
the core hands on in order (:class:`~compass.core.events.Chunk`); :func:`stream_job` yields
each as an :class:`Output`, then the job's final output (``final``). A plain sink has no
partial output: its job streams its answer alone.

A slow reader slows the steps that make the job's partial outputs: each one yielded and taken
(the wire's producer resumes :func:`stream_job` only when its reader has credit for the next)
is counted as read in its sink's window (:mod:`compass.worker.windows`; the worker running the
sink is told, when it is another), so a sink makes at most ``stream_window`` partial outputs
ahead of its reader, then waits; one that waits ``stream_stall_s`` for a read fails the job
with :class:`~compass.errors.StreamOverrun`. Whatever happens to the reads, what the ingress
holds for one reader is bounded by :data:`MAX_BEHIND`: past it the job is cancelled everywhere
with :class:`~compass.errors.StreamOverrun`, never a silent gap. A sink whose worker was lost
mid-stream starts again from its first step when the job is planned again: the reader would
get partial outputs twice, so the job is cancelled and the reader gets
:class:`~compass.errors.WorkersLost` saying so (its partial outputs are never repeated, nor
is one skipped). Leaving the iteration early (or
cancelling the task that reads) cancels the job as a client that stops waiting does: its
step-wise tasks stop at their next step (:class:`~compass.core.events.StopTask`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any, Protocol

from compass.errors import CompassError, StreamOverrun, WorkersLost
from compass.objective import NO_OBJECTIVE, Objective
from compass.observe.streams import StreamsInFlight
from compass.streamed import Output
from compass.worker.windows import Chunks

__all__ = ["MAX_BEHIND", "Output", "Streamer", "stream_job"]

#: partial outputs the ingress holds for one slow reader, at most (the sinks' windows keep it
#: far below this; it bounds what reads gone astray could let pile up)
MAX_BEHIND = 256


class Measures(Protocol):
    @property
    def streams(self) -> StreamsInFlight: ...

    def streamed(self, workflow: str, first_output_s: float) -> None: ...


class Reads(Protocol):
    def read(self, job_id: str, task: str, seq: int) -> None: ...


class Traces(Protocol):
    def first_output(self, job_id: str, wall: float) -> None: ...


class Streamer(Protocol):
    """What :func:`stream_job` needs of a worker (the worker is one): it submits, its
    metrics and traces time the first output, and its sinks' windows hear what the reader
    took."""

    @property
    def metrics(self) -> Measures: ...

    @property
    def tracer(self) -> Traces: ...

    @property
    def streamed(self) -> Reads: ...

    async def submit_job(
        self,
        workflow: str,
        inputs: Any,
        key: str | None = None,
        objective: Objective = NO_OBJECTIVE,
        *,
        trace: bool = False,
        traceparent: str | None = None,
        chunks: Chunks | None = None,
    ) -> tuple[str, Any]: ...


async def stream_job(
    worker: Streamer,
    workflow: str,
    inputs: Any,
    objective: Objective = NO_OBJECTIVE,
    *,
    trace: bool = False,
) -> AsyncGenerator[Output, None]:
    """Run a job of ``workflow`` with ``worker`` as its ingress; its partial outputs as they
    are made, then its final output (raises the job's error instead). See the module
    docstring."""
    items: asyncio.Queue[Output] = asyncio.Queue()
    overrun: list[CompassError] = []
    #: per sink, the step whose partial output comes next
    expected: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    started = loop.time()
    key, shown = worker.metrics.streams.open(workflow, time.time())  # the dashboard's

    def chunk(job_id: str, task: str, seq: int, value: Any) -> None:
        if overrun:
            return
        if seq != expected.get(task, 0):  # a sink that started again: the job was re-planned
            overrun.append(WorkersLost(
                f"sink {task!r} of job {job_id} ({workflow}) started again at step {seq} after "
                f"step {expected.get(task, 0) - 1}: a worker was lost mid-stream and the job "
                "planned again; it was cancelled rather than repeat partial outputs",
                detail={"job_id": job_id, "task": task, "seq": seq},
            ))  # fmt: skip
            answer.cancel()
            return
        expected[task] = seq + 1
        shown.job, shown.made = job_id, shown.made + 1
        if shown.first_output_ms is None:
            first_s = loop.time() - started
            shown.first_output_ms = round(first_s * 1000.0, 3)
            worker.metrics.streamed(workflow, first_s)
            worker.tracer.first_output(job_id, time.time())
        if items.qsize() >= MAX_BEHIND:
            overrun.append(
                StreamOverrun(
                    f"the reader fell {MAX_BEHIND} partial outputs behind job of "
                    f"{workflow!r}; it was cancelled"
                )
            )
            answer.cancel()  # the job is cancelled everywhere (its tasks stop at a step)
            return
        items.put_nowait(Output(value, task, seq))

    answer = asyncio.ensure_future(
        worker.submit_job(workflow, inputs, None, objective, trace=trace, chunks=chunk)
    )
    try:
        while True:
            if not items.empty():
                item = items.get_nowait()
            elif answer.done():
                break
            else:
                taken = asyncio.ensure_future(items.get())
                await asyncio.wait((taken, answer), return_when=asyncio.FIRST_COMPLETED)
                if not taken.done():
                    taken.cancel()
                    continue
                item = taken.result()
            yield item
            # resumed: the reader took it (the wire has credit for the next), so its sink's
            # window moves on
            shown.read += 1
            worker.streamed.read(shown.job, item.task or "", item.seq)
        if overrun:
            raise overrun[0]
        _, value = answer.result()  # the job's error, if it failed
        worker.metrics.streams.close(key)  # answered: no longer in flight, whenever it is closed
        yield Output(value, final=True)
    finally:
        worker.metrics.streams.close(key)
        if not answer.done():
            answer.cancel()  # left early: the job is cancelled
            with contextlib.suppress(BaseException):
                await answer
