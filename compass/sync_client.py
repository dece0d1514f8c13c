"""The blocking client, :class:`SyncClient`: an async :class:`~compass.client.Client` on an
event loop of a thread of its own (:mod:`compass.loop_thread`), each method waiting for its
answer. For scripts and notebooks; an asyncio program uses :class:`~compass.client.Client`.
"""

from __future__ import annotations

import ssl
import threading
import weakref
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from compass.client import BULK_THRESHOLD, Client, JobResult
from compass.config import Limits, Timeouts, TLSConfig
from compass.errors import ConnectionClosed
from compass.loop_thread import LoopThread
from compass.reports import JobRecord, WorkerStatus, WorkerTimeline
from compass.streamed import Output
from compass.submission import USE_CLIENT_DEFAULT, JobOptions, OnMiss, TimeoutArg, job_options
from compass.trace import JobTrace

__all__ = ["SyncClient"]

_T = TypeVar("_T")


class SyncClient:
    """A blocking :class:`Client` for scripts and notebooks.

    The same methods and arguments, without ``await``: the client runs on a private event loop
    in a background thread, started on first use and ended by :meth:`close` (or the ``with``
    block). Calls may come from several threads at once; they share one client. An interrupted
    call (KeyboardInterrupt) is cancelled, its job too. After :meth:`close` calls fail until
    :meth:`connect`.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        token: str | None = None,
        name: str = "client",
        timeouts: Timeouts | None = None,
        limits: Limits | None = None,
        bulk_threshold: int | None = BULK_THRESHOLD,
        retries: int = 2,
        tls: TLSConfig | ssl.SSLContext | None = None,
    ) -> None:
        self._client = Client(
            address,
            token=token,
            name=name,
            timeouts=timeouts,
            limits=limits,
            bulk_threshold=bulk_threshold,
            retries=retries,
            tls=tls,
        )
        self._runner: LoopThread | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False
        self._starting = threading.Lock()

    @property
    def address(self) -> str:
        """The worker this client talks to now (or will try first)."""
        return self._client.address

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._client.addresses

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        runner = self._runner
        if runner is None:
            with self._starting:
                runner = self._runner
                if runner is None:
                    if self._closed:
                        coro.close()
                        raise ConnectionClosed(f"client for {self.address} was closed")
                    runner = LoopThread(f"compass-client-{self.address}", self._client.aclose)
                    # a client dropped without close() still ends its thread and connections
                    self._finalizer = weakref.finalize(self, runner.stop_soon)
                    self._finalizer.atexit = False  # at exit the daemon thread just ends
                    self._runner = runner
        return runner.run(coro)

    def connect(self) -> SyncClient:
        """Connect (to the first address that answers) unless connected already."""
        self._closed = False
        self._run(self._client.connect())
        return self

    def ping(self, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> float:
        """Round-trip time to the worker, in seconds."""
        return self._run(self._client.ping(timeout=timeout))

    def status(self, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> WorkerStatus:
        """The worker's status (see :meth:`Client.status`)."""
        return self._run(self._client.status(timeout=timeout))

    def records(
        self, *, clear: bool = False, timeout: TimeoutArg = USE_CLIENT_DEFAULT
    ) -> list[JobRecord]:
        """The records of the last jobs the worker answered (see :meth:`Client.records`)."""
        return self._run(self._client.records(clear=clear, timeout=timeout))

    def timeline(self, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> WorkerTimeline:
        """What ran on the worker lately (see :meth:`Client.timeline`)."""
        return self._run(self._client.timeline(timeout=timeout))

    def submit(
        self,
        workflow: str,
        /,
        inputs: Mapping[str, Any] | None = None,
        *,
        timeout: TimeoutArg = USE_CLIENT_DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: OnMiss = "drop",
        **keywords: Any,
    ) -> Any:
        """Run one job of ``workflow`` with ``inputs`` (a mapping, keywords, or both) and
        return its final output (see :meth:`Client.submit`)."""
        return self._run(self._client.submit(
            workflow, inputs, timeout=timeout, deadline_ms=deadline_ms, priority=priority,
            on_miss=on_miss, **keywords,
        ))  # fmt: skip

    def stream(
        self,
        workflow: str,
        /,
        inputs: Mapping[str, Any] | None = None,
        *,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: OnMiss = "drop",
        window: int = 16,
        **keywords: Any,
    ) -> Iterator[Output]:
        """Run one job streaming (see :meth:`Client.stream`): its partial outputs as they are
        made, then its final output. Closing the iterator (a ``for`` loop left with ``break``
        closes it when it is collected) cancels the job."""
        items = self._client.stream(
            workflow, inputs, deadline_ms=deadline_ms, priority=priority, on_miss=on_miss,
            window=window, **keywords,
        )  # fmt: skip
        try:
            while True:
                try:
                    yield self._run(_next(items))
                except StopAsyncIteration:
                    return
        finally:
            self._run(_close(items))

    def submit_job(
        self,
        workflow: str,
        /,
        inputs: Mapping[str, Any] | None = None,
        *,
        timeout: TimeoutArg = USE_CLIENT_DEFAULT,
        options: JobOptions | None = None,
        **keywords: Any,
    ) -> JobResult:
        """Run one job and return its id with its output, and with
        ``options=JobOptions(trace=True)`` its trace (see :meth:`Client.submit_job`)."""
        options = job_options("submit_job", options, keywords)
        return self._run(self._client.submit_job(
            workflow, inputs, timeout=timeout, options=options, **keywords
        ))  # fmt: skip

    def trace(self, job_id: str, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> JobTrace:
        """The trace the connected worker kept of job ``job_id`` (see :meth:`Client.trace`)."""
        return self._run(self._client.trace(job_id, timeout=timeout))

    def traces(
        self, limit: int = 20, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT
    ) -> list[JobTrace]:
        """The last ``limit`` traces the connected worker kept (see :meth:`Client.traces`)."""
        return self._run(self._client.traces(limit, timeout=timeout))

    def submit_many(
        self,
        workflow: str,
        inputs: Iterable[Mapping[str, Any]],
        *,
        concurrency: int = 64,
        timeout: TimeoutArg = USE_CLIENT_DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: OnMiss = "drop",
    ) -> list[Any]:
        """Run one job per inputs mapping, at most ``concurrency`` at once; results in order."""
        return self._run(self._client.submit_many(
            workflow, inputs, concurrency=concurrency, timeout=timeout, deadline_ms=deadline_ms,
            priority=priority, on_miss=on_miss,
        ))  # fmt: skip

    def close(self) -> None:
        """Close the connections and end the background thread. Idempotent."""
        with self._starting:
            self._closed = True
            runner, self._runner = self._runner, None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        if runner is not None:
            runner.stop()  # the loop closes the client before it ends

    def __enter__(self) -> SyncClient:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def _next(items: AsyncIterator[Output]) -> Output:
    return await items.__anext__()


async def _close(items: AsyncIterator[Output]) -> None:
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()
