"""The clients an application embeds: connect to any worker, submit jobs, await results.

::

    async with compass.Client("127.0.0.1:7341", token=token) as client:
        caption = await client.submit("img_to_text", image=pixels)

    with compass.SyncClient("127.0.0.1:7341", token=token) as client:  # scripts, notebooks
        caption = client.submit("img_to_text", image=pixels)

A job's trace (where each task ran and where its time went, :class:`~compass.trace.JobTrace`)
comes with its answer from :meth:`Client.submit_job` with ``trace=True``; the traces an
ingress sampled are read with :meth:`Client.trace` and :meth:`Client.traces`. A submission
made inside an OpenTelemetry span carries that span's context (W3C ``traceparent``), so the
job's spans, exported by workers started with ``--otel-endpoint``, are its children.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import ssl
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from compass.config import Limits, Timeouts, TLSConfig
from compass.errors import (
    CompassError,
    CompassTimeout,
    ConfigError,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    Overloaded,
    ProtocolError,
    WorkersLost,
    WorkerUnavailable,
)
from compass.objective import check_objective
from compass.payload import payload_bytes
from compass.trace import (
    JobTrace,
    TraceParent,
    format_traceparent,
    parse_traceparent,
    seen_by_client,
)
from compass.wire.transport import Channel, ChannelOptions, connect, new_event_loop

__all__ = ["BULK_THRESHOLD", "Client", "JobResult", "SyncClient"]

log = logging.getLogger(__name__)

_DEFAULT: Any = object()
_T = TypeVar("_T")

#: submissions whose inputs take more bytes than this travel on the client's second connection
BULK_THRESHOLD = 1 << 20


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job's answer with its id (:meth:`Client.submit_job`): the id the workers' logs and
    traces name the job by; with ``trace=True``, its :class:`~compass.trace.JobTrace`."""

    job_id: str
    value: Any
    trace: JobTrace | None = None


class Client:
    """A connection to one worker at a time: the ingress of every job this client submits.

    Any worker can be the ingress, so ``address`` may list several: when the connection is
    lost, the next call connects to the next one that answers (failover), and a client that was
    never connected connects on its first call. A call in flight when the connection breaks
    fails over too: a job whose worker is lost (:class:`~compass.errors.ConnectionLost`) or that
    is shutting down (:class:`~compass.errors.WorkerUnavailable`) is submitted again to the next
    worker, up to ``retries`` times (default 2). That runs a job's tasks again, so it requires
    idempotent tasks, which inference is; ``retries=0`` raises at once. Every job carries a key
    the client chose, so a worker that sees the same job twice (a retried request that did
    arrive) answers both with one run; another worker would run it again, so a job its ingress
    answered itself, because the workers it ran on were lost too often
    (:class:`~compass.errors.WorkersLost`), is not submitted again. A worker that refuses a job
    because it drains (it was told to stop) still answers the jobs already in flight on the
    same connection: only new calls go to the next worker. An error about a job names it
    (``error.job_id``, as the workers' logs do). After :meth:`aclose` calls fail until
    :meth:`connect`.

    A frame goes out whole on its TCP stream, so a small call behind a 128 MiB one would wait
    for it. Submissions whose inputs exceed ``bulk_threshold`` bytes therefore use a second
    connection to the same worker, opened on first need; the two always point at the same
    worker and fail over together. ``bulk_threshold=None`` keeps everything on one connection.
    (A small submission whose *result* is large still answers on the first connection.)

    A client belongs to the event loop it connected on until :meth:`aclose`; it can then be
    used again on another loop. Use from a different loop while connected raises
    :class:`~compass.errors.ConfigError`. :class:`SyncClient` wraps one for synchronous code.

    ``timeouts.request`` bounds each call, job submissions included, unless a call passes its own
    ``timeout`` (``None`` waits as long as the job takes).

    ``tls`` connects with mutual TLS to workers started with ``--tls-cert``: a
    :class:`~compass.config.TLSConfig` (this client's certificate and key, and the cluster CA;
    files are read here) or a ready ``ssl.SSLContext``. The token's strength is not checked
    here: workers refuse weak tokens when they start (``compass worker start``), and a client
    cannot make the cluster's token weaker or stronger.
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
        addresses = (address,) if isinstance(address, str) else tuple(address)
        if not addresses or not all(isinstance(a, str) and a for a in addresses):
            raise ConfigError(f"Client needs one or more worker addresses, got {address!r}")
        if bulk_threshold is not None and (
            isinstance(bulk_threshold, bool)
            or not isinstance(bulk_threshold, int)
            or bulk_threshold < 0
        ):
            raise ConfigError(
                f"Client bulk_threshold must be a byte count >= 0 or None, got {bulk_threshold!r}"
            )
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"Client retries must be an integer >= 0, got {retries!r}")
        if tls is not None and not isinstance(tls, (TLSConfig, ssl.SSLContext)):
            raise ConfigError(
                f"Client tls must be a compass.config.TLSConfig or an ssl.SSLContext, got {tls!r}"
            )
        self._ssl = tls.client_context() if isinstance(tls, TLSConfig) else tls
        self.retries = retries
        self.addresses = addresses
        #: the worker this client talks to now (or will try first)
        self.address = addresses[0]
        self.bulk_threshold = bulk_threshold
        self._token = token
        self._name = name
        # job keys: this client's random part and a count (one uuid4 per job was a tenth of
        # what the client ran per job, and a system call)
        self._key_prefix = f"{uuid.uuid4().hex}-"
        self._keys = itertools.count()
        self.timeouts = timeouts or Timeouts()
        self.limits = limits or Limits()
        self._channel: Channel | None = None  # every call but large submissions
        self._bulk: Channel | None = None  # large submissions, to the same worker
        # channels to a worker that is going away (it drains, or one of them broke): no new
        # call goes there, and the calls in flight on them finish (the worker answers them
        # before it leaves); closed by the worker, or by aclose()
        self._retired: set[Channel] = set()
        self._closed = False  # by aclose(): no reconnecting behind the caller's back
        # the loop the channels belong to, and its lock for one (re)connection at a time
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    # -- connections ------------------------------------------------------------------------

    async def connect(self) -> Client:
        """Connect (to the first address that answers) unless connected already."""
        self._closed = False
        await self._open(bulk=False)
        return self

    @property
    def channel(self) -> Channel:
        """The connection for every call but large submissions."""
        if self._channel is None:
            raise ConnectionClosed(
                f"client for {self.address} is not connected: use 'async with Client(...)' "
                "or 'await client.connect()'"
            )
        return self._channel

    @property
    def bulk_channel(self) -> Channel | None:
        """The connection for submissions above ``bulk_threshold``, once one has been made."""
        return self._bulk

    def _lock_for_this_loop(self) -> asyncio.Lock:
        """The connection lock of the running loop; refuses a loop the client is not open on."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._connecting is None:
            if self._loop is not None and self._holds_connections():
                ended = " (which has since ended)" if self._loop.is_closed() else ""
                raise ConfigError(
                    f"Client for {self.address} is open on another event loop{ended}: its "
                    "connections belong to that loop. Use it there, 'await client.aclose()' "
                    "there before using it on this loop, or use one client per loop "
                    "(SyncClient for synchronous code)"
                )
            self._loop = loop
            self._connecting = asyncio.Lock()
        return self._connecting

    def _holds_connections(self) -> bool:
        live = any(c is not None and not c.closed for c in (self._channel, self._bulk))
        return live or (self._connecting is not None and self._connecting.locked())

    def _usable(self, channel: Channel | None) -> bool:
        return channel is not None and not channel.closed and channel not in self._retired

    def _retire(self, channel: Channel) -> None:
        """``channel``'s worker is going away: the next call fails over, while the calls in
        flight on this channel (and on the other one to the same worker) go on."""
        for ch in (channel, self._channel, self._bulk):
            if ch is not None and not ch.closed and ch not in self._retired:
                self._retired.add(ch)
                ch.on_close.append(lambda closed, _exc: self._retired.discard(closed))

    async def _open(self, *, bulk: bool) -> Channel:
        """The channel for the next call: connected, reopened or failed over as needed."""
        lock = self._lock_for_this_loop()
        async with lock:
            channel = self._channel
            if not self._usable(channel):
                if self._closed:
                    raise ConnectionClosed(f"client for {self.address} was closed")
                await self._fail_over()
            if not bulk:
                return self.channel
            if self._usable(self._bulk):
                assert self._bulk is not None
                return self._bulk
            try:
                self._bulk = await self._dial(self.address)
            except (ConnectFailed, CompassTimeout):
                # the worker does not take a second connection: treat it as lost, and move
                # both connections to the next worker that answers
                await self.channel.aclose()
                await self._fail_over()
                self._bulk = await self._dial(self.address)
            return self._bulk

    async def _fail_over(self) -> None:
        """Connect to the first worker that answers; the current one last if it was lost."""
        bulk, self._bulk = self._bulk, None
        if bulk is not None and not bulk.closed and bulk not in self._retired:
            await bulk.aclose()  # it points at the worker being left
        n = len(self.addresses)
        first = self.addresses.index(self.address)
        if self._channel is not None:
            first += 1  # the current worker was lost: try the others first
        problems: list[str] = []
        for k in range(n):
            address = self.addresses[(first + k) % n]
            try:
                self._channel = await self._dial(address)
            except ConnectFailed as exc:
                problems.append(str(exc))
                continue
            self.address = address
            return
        if n == 1:
            raise ConnectFailed(problems[0])
        raise ConnectFailed(f"no worker answered ({n} tried): " + "; ".join(problems))

    async def _dial(self, address: str) -> Channel:
        try:
            channel = await connect(
                address,
                ChannelOptions(
                    name=self._name,
                    token=self._token,
                    limits=self.limits,
                    timeouts=self.timeouts,
                    ssl=self._ssl,
                ),
                role="client",
            )
        except (ConnectFailed, ConnectionLost) as exc:
            raise ConnectFailed(_explain_refusal(address, exc, tls=self._ssl is not None)) from exc
        if self._closed:  # aclose() ran while this connection was being made
            await channel.aclose()
            raise ConnectionClosed(f"client for {self.address} was closed")
        return channel

    # -- calls ------------------------------------------------------------------------------

    async def ping(self, *, timeout: float | None = _DEFAULT) -> float:
        """Round-trip time to the worker, in seconds."""
        t0 = time.perf_counter()
        await self._request("ping", None, timeout)
        return time.perf_counter() - t0

    async def status(self, *, timeout: float | None = _DEFAULT) -> dict[str, Any]:
        """The worker's status: name, address, version, uptime, peers, queue, cache, counters."""
        result = await self._request("status", None, timeout)
        assert isinstance(result, dict)
        return result

    async def submit(
        self,
        workflow: str,
        /,
        *,
        timeout: float | None = _DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: str = "drop",
        **inputs: Any,
    ) -> Any:
        """Run one job of ``workflow`` with ``inputs`` and return its final output.

        The job's objective: ``deadline_ms`` (answer within this many milliseconds of
        submission, or not at all: a job no plan can finish in time is refused at once with
        :class:`~compass.errors.DeadlineUnreachable`, one that falls too late on the way is
        dropped and answered :class:`~compass.errors.DeadlineExceeded`; ``on_miss="finish"``
        runs it to the end regardless), and ``priority`` (0 to 9, higher first: a worker
        runs a higher priority's tasks before a lower one's). Without them a job runs as it
        always has. Their names are not job inputs.

        Raises :class:`~compass.errors.JobFailed` when a task raised (with the task's name and
        remote traceback), :class:`~compass.errors.UnknownWorkflow` or
        :class:`~compass.errors.InvalidInputs` for a bad request; each names the job
        (``error.job_id``).
        """
        extra = _objective(deadline_ms, priority, on_miss)
        return (await self._submit(workflow, inputs, timeout, extra))[0]

    async def submit_job(
        self,
        workflow: str,
        /,
        *,
        timeout: float | None = _DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: str = "drop",
        trace: bool = False,
        traceparent: str | None = None,
        **inputs: Any,
    ) -> JobResult:
        """:meth:`submit`, answering the job's id with its output (:class:`JobResult`).

        ``trace=True`` traces the job whatever the workers' sampling and answers its trace
        with it (:attr:`JobResult.trace`; None when the worker keeps none, as for a job whose
        key a retry resubmitted after it had run): where each task ran, its queue wait, input
        transfer, model load, execution and batch, and the job's latency split along its
        critical path. A job that fails raises as :meth:`submit` does; its trace is then
        read with :meth:`trace` (``error.job_id``). ``traceparent``: the W3C trace context of
        the caller's span (by default the current OpenTelemetry span's, when there is one):
        the job's spans are its children. Neither is a job input."""
        extra: dict[str, Any] = {"reply": "job", **_objective(deadline_ms, priority, on_miss)}
        if traceparent is not None:
            if parse_traceparent(traceparent) is None:
                raise ConfigError(
                    f"traceparent {traceparent!r} is not a W3C trace context "
                    "('00-<32 hex digits>-<16 hex digits>-<2 hex digits>')"
                )
            extra["tp"] = traceparent
        if trace:
            extra["trace"] = True
        t0 = time.perf_counter()
        answer, retries = await self._submit(workflow, inputs, timeout, extra)
        latency_ms = (time.perf_counter() - t0) * 1000.0
        if not (isinstance(answer, dict) and isinstance(answer.get("job"), str)):
            raise ProtocolError(
                f"{self.address} answered a job without its id: the worker predates submit_job"
            )
        job_trace = None
        if trace and answer.get("trace") is not None:
            job_trace = JobTrace.from_json(seen_by_client(answer["trace"], latency_ms, retries))
        return JobResult(answer["job"], answer.get("value"), job_trace)

    async def trace(self, job_id: str, *, timeout: float | None = _DEFAULT) -> JobTrace:
        """The trace the connected worker kept of job ``job_id``, which it was the ingress
        of (the first part of a job id names it) and traced: sampled (``--trace-sample``) or
        asked for. :class:`~compass.errors.InvalidInputs` when it keeps none."""
        return JobTrace.from_json(await self._request("traces", {"job": job_id}, timeout))

    async def traces(self, limit: int = 20, *, timeout: float | None = _DEFAULT) -> list[JobTrace]:
        """The last ``limit`` (at most 100) traces the connected worker kept, oldest first."""
        answer = await self._request("traces", {"limit": limit}, timeout)
        if not isinstance(answer, list):
            raise ProtocolError(f"{self.address} answered traces with a {type(answer).__name__}")
        return [JobTrace.from_json(trace) for trace in answer]

    async def story(self, key: str, *, timeout: float | None = _DEFAULT) -> dict[str, Any]:
        """What the connected worker's cores logged lately about ``key`` (a job id, a peer's
        name, a model or a cause id), oldest first: ``{"worker", "key", "core", "members"}``,
        the last two lists of entries ``{cause, now, event, did, about}`` of its worker core
        and its member table (``now`` on the worker's clock)."""
        answer = await self._request("story", {"key": key}, timeout)
        if not isinstance(answer, dict):
            raise ProtocolError(f"{self.address} answered story with a {type(answer).__name__}")
        return answer

    async def _submit(
        self, workflow: str, inputs: dict[str, Any], timeout: float | None, extra: dict[str, Any]
    ) -> tuple[Any, int]:
        """Submit, failing over as the class says; the answer, and how many times the job
        was submitted again to another worker."""
        if timeout is _DEFAULT:
            timeout = self.timeouts.request
        threshold = self.bulk_threshold
        bulk = threshold is not None and payload_bytes(inputs) > threshold
        key = f"{self._key_prefix}{next(self._keys)}"
        body = {"workflow": workflow, "inputs": inputs, "key": key, **extra}
        if "tp" not in body:
            caller = _current_traceparent()
            if caller is not None:
                body["tp"] = caller
        lost: CompassError | None = None
        for retry in range(self.retries + 1):
            channel: Channel | None = None
            try:
                channel = await self._channel_for(bulk)
                return await channel.request("submit", body, timeout=timeout), retry
            except ConnectFailed:
                if lost is None:
                    raise
                raise lost from None  # no other worker to retry on: the job's own error
            except (ConnectionLost, WorkerUnavailable) as exc:
                if isinstance(exc, Overloaded | WorkersLost):
                    raise  # not going away: it refused the job, or answered it (it ran)
                lost = exc
                if isinstance(exc, WorkerUnavailable) and channel is not None:
                    # it is going away: the next call fails over; the other jobs in flight
                    # there are answered before it leaves (a draining worker finishes them),
                    # or fail over themselves
                    self._retire(channel)
        assert lost is not None
        raise lost

    async def submit_many(
        self,
        workflow: str,
        inputs: Iterable[Mapping[str, Any]],
        *,
        concurrency: int = 64,
        timeout: float | None = _DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: str = "drop",
    ) -> list[Any]:
        """Run one job per inputs mapping, at most ``concurrency`` at once; results in order.
        The objective, as for :meth:`submit`, is every job's."""
        limit = asyncio.Semaphore(concurrency)
        extra = _objective(deadline_ms, priority, on_miss)

        async def one(kwargs: Mapping[str, Any]) -> Any:
            async with limit:
                return (await self._submit(workflow, dict(kwargs), timeout, extra))[0]

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(kwargs)) for kwargs in inputs]
        return [task.result() for task in tasks]

    async def _request(self, op: str, body: Any, timeout: float | None) -> Any:
        if timeout is _DEFAULT:
            timeout = self.timeouts.request
        channel = await self._channel_for(bulk=False)
        return await channel.request(op, body, timeout=timeout)

    async def _channel_for(self, bulk: bool) -> Channel:
        """The channel the next call goes on, (re)connected or failed over as needed."""
        channel = self._bulk if bulk else self._channel
        if (
            not self._usable(channel)
            or self._loop is not asyncio.get_running_loop()
            or (bulk and not self._usable(self._channel))
        ):
            channel = await self._open(bulk=bulk)
        assert channel is not None
        return channel

    async def aclose(self) -> None:
        """Close both connections; calls then fail until :meth:`connect`. Idempotent."""
        self._closed = True
        if self._loop is None:
            return
        self._lock_for_this_loop()
        channels = [c for c in (self._channel, self._bulk, *self._retired) if c is not None]
        # forgotten, so that a later connect() starts at the same worker, not the next one
        self._channel = self._bulk = None
        self._retired.clear()
        await asyncio.gather(*(c.aclose() for c in channels))
        self._loop = self._connecting = None  # free to be used on another loop now

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _current_traceparent() -> str | None:
    """The W3C trace context of the current OpenTelemetry span, if the application uses
    OpenTelemetry (compass never imports it: an application that does has it loaded) and a
    span is current."""
    otel = sys.modules.get("opentelemetry.trace")
    if otel is None:
        return None
    context = otel.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    sampled = bool(context.trace_flags & 1)
    return format_traceparent(TraceParent(context.trace_id, context.span_id, sampled))


def _objective(deadline_ms: float | None, priority: int, on_miss: str) -> dict[str, Any]:
    """The objective's fields of a submission (none for a job that asks for nothing),
    checked here so that a bad one fails before anything is sent."""
    if deadline_ms is None and type(priority) is int and priority == 0 and on_miss == "drop":
        return {}  # the defaults: nothing to check or send
    check_objective(deadline_ms, priority, on_miss)
    body: dict[str, Any] = {}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    if priority:
        body["priority"] = priority
    if on_miss != "drop":
        body["on_miss"] = on_miss
    return body


def _explain_refusal(address: str, exc: ConnectFailed | ConnectionLost, *, tls: bool) -> str:
    """Why dialing ``address`` failed, naming TLS on one side only or a refused certificate:
    TLS reports these as a hang-up or an OpenSSL code."""
    cause = exc.__cause__
    refused = (
        f"{address} refused this client's TLS certificate (none given, or not signed by the CA "
        "the worker trusts: its --tls-ca), or it is not a compass worker"
    )
    if isinstance(exc, ConnectionLost):
        # the peer hung up before the compass handshake ended: under TLS 1.3 that is how a
        # client learns its certificate was refused (its own TLS handshake has already ended)
        if tls:
            return refused
        return (
            f"{address} closed the connection during the handshake: it requires TLS (a worker "
            "started with --tls-cert: give this client tls=TLSConfig(...), or --tls-cert, "
            "--tls-key and --tls-ca), or it is not a compass worker"
        )
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            f"could not verify the TLS certificate of {address}: {cause.verify_message}; it "
            "must be signed by the CA this client trusts (tls.ca, --tls-ca)"
        )
    if isinstance(cause, ssl.SSLError) and "ALERT" in (cause.reason or ""):
        return f"{refused} ({cause.reason})"  # TLS 1.2 refuses within the TLS handshake
    if isinstance(cause, ssl.SSLError) or (tls and isinstance(cause, ConnectionResetError)):
        return (
            f"TLS handshake with {address} failed ({getattr(cause, 'reason', None) or cause}): "
            "is the worker serving plain TCP (started without --tls-cert)?"
        )
    return str(exc)


class _LoopThread:
    """An event loop running in a daemon thread; coroutines are handed to it and awaited."""

    def __init__(self, name: str, on_stop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.loop = new_event_loop()
        self._on_stop = on_stop
        # guards handing work to the loop, so that nothing is handed over once it has stopped
        self._lock = threading.Lock()
        self._running = True
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            with self._lock:
                self._running = False
            try:
                loop.run_until_complete(self._on_stop())
            except Exception:  # nobody waits for this thread: say why, then end cleanly
                log.exception("closing the client on %s failed", self.thread.name)
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise ConfigError(
                "a SyncClient method was called from its own event loop thread, where it "
                "would wait for itself forever: use the async Client there"
            )
        with self._lock:
            if not self._running:
                coro.close()
                raise ConnectionClosed("the client was closed (by another thread)")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._running:
                raise
            raise ConnectionClosed("the client was closed while this call waited") from None
        except BaseException:
            future.cancel()  # an interrupted caller (Ctrl-C) cancels the call, job included
            raise

    def stop_soon(self) -> None:
        """Ask the loop to close the client and end; does not wait."""
        with contextlib.suppress(RuntimeError):  # the loop has closed already
            self.loop.call_soon_threadsafe(self.loop.stop)

    def stop(self) -> None:
        self.stop_soon()
        self.thread.join()


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
        self._runner: _LoopThread | None = None
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
                    runner = _LoopThread(f"compass-client-{self.address}", self._client.aclose)
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

    def ping(self, *, timeout: float | None = _DEFAULT) -> float:
        """Round-trip time to the worker, in seconds."""
        return self._run(self._client.ping(timeout=timeout))

    def status(self, *, timeout: float | None = _DEFAULT) -> dict[str, Any]:
        """The worker's status: name, address, version, uptime, peers, queue, cache, counters."""
        return self._run(self._client.status(timeout=timeout))

    def submit(
        self,
        workflow: str,
        /,
        *,
        timeout: float | None = _DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: str = "drop",
        **inputs: Any,
    ) -> Any:
        """Run one job of ``workflow`` with ``inputs`` and return its final output (see
        :meth:`Client.submit`)."""
        return self._run(self._client.submit(
            workflow, timeout=timeout, deadline_ms=deadline_ms, priority=priority,
            on_miss=on_miss, **inputs,
        ))  # fmt: skip

    def submit_job(
        self,
        workflow: str,
        /,
        *,
        timeout: float | None = _DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: str = "drop",
        trace: bool = False,
        traceparent: str | None = None,
        **inputs: Any,
    ) -> JobResult:
        """Run one job and return its id with its output, and with ``trace=True`` its trace
        (see :meth:`Client.submit_job`)."""
        return self._run(self._client.submit_job(
            workflow, timeout=timeout, deadline_ms=deadline_ms, priority=priority,
            on_miss=on_miss, trace=trace, traceparent=traceparent, **inputs,
        ))  # fmt: skip

    def trace(self, job_id: str, *, timeout: float | None = _DEFAULT) -> JobTrace:
        """The trace the connected worker kept of job ``job_id`` (see :meth:`Client.trace`)."""
        return self._run(self._client.trace(job_id, timeout=timeout))

    def traces(self, limit: int = 20, *, timeout: float | None = _DEFAULT) -> list[JobTrace]:
        """The last ``limit`` traces the connected worker kept (see :meth:`Client.traces`)."""
        return self._run(self._client.traces(limit, timeout=timeout))

    def submit_many(
        self,
        workflow: str,
        inputs: Iterable[Mapping[str, Any]],
        *,
        concurrency: int = 64,
        timeout: float | None = _DEFAULT,
        deadline_ms: float | None = None,
        priority: int = 0,
        on_miss: str = "drop",
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
