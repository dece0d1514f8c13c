"""A job whose caller reads its partial outputs as they are made: the ingress's side.

:func:`stream_job` submits a job as :meth:`Worker.submit_job <compass.worker.server.Worker.
submit_job>` does, marked as streaming: every step-wise sink of it reports each step's output
to the ingress (:class:`~compass.core.messages.ChunkMsg`, or at once when it runs here), which
the core hands on in order (:class:`~compass.core.events.Chunk`); :func:`stream_job` yields
each as an :class:`Output`, then the job's final output (``final``). A plain sink has no
partial output: its job streams its answer alone.

What the ingress holds for a reader is bounded: :data:`MAX_BEHIND` partial outputs. A reader
slower than the job's steps for that long has its job cancelled everywhere and gets
:class:`~compass.errors.StreamOverrun`, never a silent gap. Leaving the iteration early (or
cancelling the task that reads) cancels the job as a client that stops waiting does: its
step-wise tasks stop at their next step (:class:`~compass.core.events.StopTask`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from compass.errors import StreamOverrun
from compass.objective import NO_OBJECTIVE, Objective
from compass.streamed import Output

__all__ = ["MAX_BEHIND", "Output", "Streamer", "stream_job"]

#: partial outputs the ingress holds for one slow reader, at most
MAX_BEHIND = 256

Chunks = Callable[[str, int, Any], None]


class Measures(Protocol):
    def streamed(self, workflow: str, first_output_s: float) -> None: ...


class Streamer(Protocol):
    """What :func:`stream_job` needs of a worker (the worker is one): it submits, and its
    metrics time the first output."""

    @property
    def metrics(self) -> Measures: ...

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
) -> AsyncIterator[Output]:
    """Run a job of ``workflow`` with ``worker`` as its ingress; its partial outputs as they
    are made, then its final output (raises the job's error instead). See the module
    docstring."""
    items: asyncio.Queue[Output] = asyncio.Queue()
    overrun: list[StreamOverrun] = []
    loop = asyncio.get_running_loop()
    started, first = loop.time(), [True]

    def chunk(task: str, seq: int, value: Any) -> None:
        if overrun:
            return
        if first[0]:
            first[0] = False
            worker.metrics.streamed(workflow, loop.time() - started)
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
            while not items.empty():
                yield items.get_nowait()
            if answer.done():
                break
            taken = asyncio.ensure_future(items.get())
            await asyncio.wait((taken, answer), return_when=asyncio.FIRST_COMPLETED)
            if taken.done():
                yield taken.result()
            else:
                taken.cancel()
        if overrun:
            raise overrun[0]
        _, value = answer.result()  # the job's error, if it failed
        yield Output(value, final=True)
    finally:
        if not answer.done():
            answer.cancel()  # left early: the job is cancelled
            with contextlib.suppress(BaseException):
                await answer
