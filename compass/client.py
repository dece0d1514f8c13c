"""The clients an application embeds: connect to any worker, submit jobs, await results.

::

    async with compass.Client("127.0.0.1:7341", token=token) as client:
        caption = await client.submit("img_to_text", image=pixels)

    with compass.SyncClient("127.0.0.1:7341", token=token) as client:  # scripts, notebooks
        caption = client.submit("img_to_text", image=pixels)

A job's inputs are keywords, an ``inputs`` mapping or both; an input named like an option
goes in the mapping (``client.submit("rank", {"priority": p}, priority=3)``,
:mod:`compass.submission`). A job's trace (where each task ran and where its time went,
:class:`~compass.trace.JobTrace`) comes with its answer from :meth:`Client.submit_job` with
``options=JobOptions(trace=True)``; the traces an ingress sampled are read with
:meth:`Client.trace` and :meth:`Client.traces`. What a worker reports comes typed
(:mod:`compass.reports`): :meth:`Client.status`, :meth:`Client.records` (the jobs it
answered) and :meth:`Client.timeline` (its task spans and model loads). The connections are
private.

A submission made inside an OpenTelemetry span carries that span's context (W3C
``traceparent``), so the job's spans, exported by workers started with ``--otel-endpoint``,
are its children.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from compass.config import Limits, Timeouts, TLSConfig
from compass.errors import (
    AuthenticationError,
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
from compass.payload import payload_bytes
from compass.reports import JobRecord, WorkerStatus, WorkerTimeline
from compass.security import client_token
from compass.streamed import Output, read_stream
from compass.submission import (
    USE_CLIENT_DEFAULT,
    JobOptions,
    OnMiss,
    TimeoutArg,
    check_job_size,
    job_inputs,
    job_options,
    objective_fields,
    resolve_timeout,
)
from compass.trace import (
    JobTrace,
    TraceParent,
    format_traceparent,
    parse_traceparent,
    seen_by_client,
)
from compass.wire.codec import torch_import_s
from compass.wire.transport import Channel, ChannelOptions, connect, send_limits

__all__ = ["BULK_THRESHOLD", "Client", "JobOptions", "JobResult"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: submissions whose inputs take more bytes than this travel on the client's second connection
BULK_THRESHOLD = 1 << 20


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job's answer with its id (:meth:`Client.submit_job`): the id the workers' logs and
    traces name the job by; with ``JobOptions(trace=True)``, its
    :class:`~compass.trace.JobTrace`."""

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
    files are read here) or a ready ``ssl.SSLContext``. ``token`` is the cluster's token; left
    None, the client reads ``COMPASS_TOKEN`` as the CLI and the workers do (``token=""``
    presents none), and an :class:`~compass.errors.AuthenticationError` says which it used.
    The token's strength is not checked here: workers refuse weak tokens when they start
    (``compass worker start``), and a client cannot make the cluster's token weaker or
    stronger.
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
        # None reads COMPASS_TOKEN, as the CLI and the workers do
        self._token = client_token(token)
        self._name = name
        # job keys: this client's random part and a count (one uuid4 per job was a tenth of
        # what the client ran per job, and a system call)
        self._key_prefix = f"{uuid.uuid4().hex}-"
        self._keys = itertools.count()
        self.timeouts = timeouts or Timeouts()
        self.limits = limits or Limits()
        self._channel: Channel | None = None  # every call but large submissions
        self._bulk_channel: Channel | None = None  # large submissions, to the same worker
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
        """Deprecated: the transport is private. Each request has a method of its own
        (:meth:`status`, :meth:`records`, :meth:`traces`, :meth:`timeline`, ...)."""
        warnings.warn(
            "Client.channel is deprecated and will be removed: use the client's methods "
            "(status(), records(), traces(), timeline(), submit(), ...)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._connected()

    @property
    def bulk_channel(self) -> Channel | None:
        """Deprecated: the transport is private (the connection for large submissions)."""
        warnings.warn(
            "Client.bulk_channel is deprecated and will be removed: large submissions use it "
            "on their own",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._bulk_channel

    def _connected(self) -> Channel:
        """The connection for every call but large submissions."""
        if self._channel is None:
            raise ConnectionClosed(
                f"client for {self.address} is not connected: use 'async with Client(...)' "
                "or 'await client.connect()'"
            )
        return self._channel

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
        live = any(c is not None and not c.closed for c in (self._channel, self._bulk_channel))
        return live or (self._connecting is not None and self._connecting.locked())

    def _usable(self, channel: Channel | None) -> bool:
        return channel is not None and not channel.closed and channel not in self._retired

    def _retire(self, channel: Channel) -> None:
        """``channel``'s worker is going away: the next call fails over, while the calls in
        flight on this channel (and on the other one to the same worker) go on."""
        for ch in (channel, self._channel, self._bulk_channel):
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
                return self._connected()
            if self._usable(self._bulk_channel):
                assert self._bulk_channel is not None
                return self._bulk_channel
            try:
                self._bulk_channel = await self._dial(self.address)
            except (ConnectFailed, CompassTimeout):
                # the worker does not take a second connection: treat it as lost, and move
                # both connections to the next worker that answers
                await self._connected().aclose()
                await self._fail_over()
                self._bulk_channel = await self._dial(self.address)
            return self._bulk_channel

    async def _fail_over(self) -> None:
        """Connect to the first worker that answers; the current one last if it was lost."""
        bulk, self._bulk_channel = self._bulk_channel, None
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
                    token=self._token.value,
                    limits=self.limits,
                    timeouts=self.timeouts,
                    ssl=self._ssl,
                ),
                role="client",
            )
        except (ConnectFailed, ConnectionLost) as exc:
            raise ConnectFailed(_explain_refusal(address, exc, tls=self._ssl is not None)) from exc
        except AuthenticationError as exc:
            raise AuthenticationError(f"{exc} (this client's token: {self._token.source})") from exc
        if self._closed:  # aclose() ran while this connection was being made
            await channel.aclose()
            raise ConnectionClosed(f"client for {self.address} was closed")
        return channel

    # -- calls ------------------------------------------------------------------------------

    async def ping(self, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> float:
        """Round-trip time to the worker, in seconds."""
        t0 = time.perf_counter()
        await self._request("ping", None, timeout)
        return time.perf_counter() - t0

    async def status(self, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> WorkerStatus:
        """The worker's status (:class:`~compass.reports.WorkerStatus`): name, address,
        version, uptime, peers, queue, cache, counters."""
        return WorkerStatus.from_wire(await self._request("status", None, timeout))

    async def records(
        self, *, clear: bool = False, timeout: TimeoutArg = USE_CLIENT_DEFAULT
    ) -> list[JobRecord]:
        """The records of the last jobs the connected worker answered as their ingress
        (:class:`~compass.reports.JobRecord`: where their tasks ran, how they ended), oldest
        first; ``clear=True`` empties its log after reading it, so that the next read has only
        newer ones."""
        answer = await self._request("trace", {"clear": True} if clear else None, timeout)
        if not isinstance(answer, list):
            raise ProtocolError(f"{self.address} answered records with a {type(answer).__name__}")
        return [JobRecord.from_wire(record) for record in answer]

    async def timeline(self, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> WorkerTimeline:
        """What ran on the connected worker lately (:class:`~compass.reports.WorkerTimeline`):
        every task span its ring keeps, oldest first (read in pages, each bounded by
        ``timeout``), and the model loads it keeps."""
        parts, after = [], 0
        while True:
            part = await self._request("timeline", {"after": after}, timeout)
            parts.append(part)
            rows = part.get("spans") if isinstance(part, dict) else None
            if not (isinstance(part, dict) and part.get("more") and rows):
                return WorkerTimeline.from_parts(parts)
            after = WorkerTimeline.from_parts([part]).spans[-1].seq

    async def submit(
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
        """Run one job of ``workflow`` with ``inputs`` and return its final output.

        The job's inputs: the ``inputs`` mapping, keywords (``submit("wf", image=x)``), or
        both. An input named like an option (``priority``, ``timeout``, ``trace``, ...) goes in
        ``inputs=``: a keyword of that name is the option, or a :class:`TypeError` that says so.

        The job's objective: ``deadline_ms`` (answer within this many milliseconds of
        submission, or not at all: a job no plan can finish in time is refused at once with
        :class:`~compass.errors.DeadlineUnreachable`, one that falls too late on the way is
        dropped and answered :class:`~compass.errors.DeadlineExceeded`, and so is one whose
        result comes past the deadline all the same; ``on_miss="finish"`` runs it to the end
        regardless and gives its value however late), and ``priority`` (0 to 9, higher
        first: a worker runs a higher priority's tasks before a lower one's). Without them a
        job runs as it always has. Their names are not job inputs.

        Raises :class:`~compass.errors.JobFailed` when a task raised (with the task's name and
        remote traceback), :class:`~compass.errors.UnknownWorkflow` or
        :class:`~compass.errors.InvalidInputs` for a bad request; each names the job
        (``error.job_id``). :class:`~compass.errors.JobTooLarge`, before anything is sent,
        when the inputs do not fit the one frame a job travels in (``--max-frame-mb``), and
        from the worker when they are past its ``--max-job-mb`` (by default, the frame less
        1 MiB for the message around them).
        """
        job = job_inputs("submit", inputs, keywords)
        extra = objective_fields(deadline_ms, priority, on_miss)
        return (await self._submit(workflow, job, timeout, extra))[0]

    async def submit_job(
        self,
        workflow: str,
        /,
        inputs: Mapping[str, Any] | None = None,
        *,
        timeout: TimeoutArg = USE_CLIENT_DEFAULT,
        options: JobOptions | None = None,
        **keywords: Any,
    ) -> JobResult:
        """:meth:`submit`, answering the job's id with its output (:class:`JobResult`).

        ``options`` (a :class:`~compass.submission.JobOptions`): the job's objective
        (``deadline_ms``, ``priority``, ``on_miss``, as :meth:`submit` takes them), ``trace``
        and ``traceparent``. ``trace=True`` traces the job whatever the workers' sampling and
        answers its trace with it (:attr:`JobResult.trace`; None when the worker keeps none,
        as for a job whose key a retry resubmitted after it had run): where each task ran,
        its queue wait, input transfer, model load, execution and batch, and the job's
        latency split along its critical path. A job that fails raises as :meth:`submit`
        does; its trace is then read with :meth:`trace` (``error.job_id``).
        ``traceparent``: the W3C trace context of the caller's span (by default the current
        OpenTelemetry span's, when there is one): the job's spans are its children. The
        options given as keywords, as this method took them before, still work, with a
        :class:`DeprecationWarning`; none of them is a job input."""
        options = job_options("submit_job", options, keywords)
        job = job_inputs("submit_job", inputs, keywords)
        objective = objective_fields(options.deadline_ms, options.priority, options.on_miss)
        extra: dict[str, Any] = {"reply": "job", **objective}
        traceparent, trace = options.traceparent, options.trace
        if traceparent is not None:
            if parse_traceparent(traceparent) is None:
                raise ConfigError(
                    f"traceparent {traceparent!r} is not a W3C trace context "
                    "('00-<32 hex digits>-<16 hex digits>-<2 hex digits>')"
                )
            extra["tp"] = traceparent
        if trace:
            extra["trace"] = True
        imported_s, t0 = torch_import_s(), time.perf_counter()
        answer, retries = await self._submit(workflow, job, timeout, extra)
        latency_ms = (time.perf_counter() - t0) * 1000.0
        # torch imported on the way to rebuild a tensor of the answer: named in the trace
        import_ms = (torch_import_s() - imported_s) * 1000.0
        if not (isinstance(answer, dict) and isinstance(answer.get("job"), str)):
            raise ProtocolError(
                f"{self.address} answered a job without its id: the worker predates submit_job"
            )
        job_trace = None
        if trace and answer.get("trace") is not None:
            answered = seen_by_client(answer["trace"], latency_ms, retries, import_ms)
            job_trace = JobTrace.from_json(answered)
        return JobResult(answer["job"], answer.get("value"), job_trace)

    async def trace(self, job_id: str, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> JobTrace:
        """The trace the connected worker kept of job ``job_id``, which it was the ingress
        of (the first part of a job id names it) and traced: sampled (``--trace-sample``) or
        asked for. :class:`~compass.errors.InvalidInputs` when it keeps none."""
        return JobTrace.from_json(await self._request("traces", {"job": job_id}, timeout))

    async def traces(
        self, limit: int = 20, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT
    ) -> list[JobTrace]:
        """The last ``limit`` (at most 100) traces the connected worker kept, oldest first."""
        answer = await self._request("traces", {"limit": limit}, timeout)
        if not isinstance(answer, list):
            raise ProtocolError(f"{self.address} answered traces with a {type(answer).__name__}")
        return [JobTrace.from_json(trace) for trace in answer]

    async def story(self, key: str, *, timeout: TimeoutArg = USE_CLIENT_DEFAULT) -> dict[str, Any]:
        """What the connected worker's cores logged lately about ``key`` (a job id, a peer's
        name, a model or a cause id), oldest first: ``{"worker", "key", "core", "members"}``,
        the last two lists of entries ``{cause, now, event, did, about}`` of its worker core
        and its member table (``now`` on the worker's clock)."""
        answer = await self._request("story", {"key": key}, timeout)
        if not isinstance(answer, dict):
            raise ProtocolError(f"{self.address} answered story with a {type(answer).__name__}")
        return answer

    def _is_bulk(self, input_bytes: int) -> bool:
        """Whether inputs this large travel on the bulk connection."""
        threshold = self.bulk_threshold
        return threshold is not None and input_bytes > threshold

    async def _submit(
        self, workflow: str, inputs: dict[str, Any], wait: TimeoutArg, extra: dict[str, Any]
    ) -> tuple[Any, int]:
        """Submit, failing over as the class says; the answer, and how many times the job
        was submitted again to another worker."""
        timeout = resolve_timeout(wait, self.timeouts.request)
        input_bytes = payload_bytes(inputs)
        bulk = self._is_bulk(input_bytes)
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
                check_job_size(inputs, input_bytes, send_limits(channel), self.limits, self.address)
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
    ) -> AsyncIterator[Output]:
        """Run one job of ``workflow`` as :meth:`submit` does, streaming: its step-wise sinks'
        partial outputs as they are made, each an :class:`~compass.streamed.Output` tagged
        with its task, then the final output (``final``); ``window`` of them at most on the
        way. Leaving the loop early cancels the job (see :mod:`compass.streamed`). As
        :meth:`submit`, :class:`~compass.errors.JobTooLarge` (at the first item, before
        anything is sent) when the inputs do not fit the one frame a job travels in."""
        job = job_inputs("stream", inputs, keywords)
        body = {
            "workflow": workflow,
            "inputs": job,
            **objective_fields(deadline_ms, priority, on_miss),
        }
        input_bytes = payload_bytes(job)

        async def channel() -> Channel:
            # as submit does: a job larger than its frame is refused before it is sent
            opened = await self._channel_for(self._is_bulk(input_bytes))
            check_job_size(job, input_bytes, send_limits(opened), self.limits, self.address)
            return opened

        return read_stream(channel, body, window)

    async def submit_many(
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
        """Run one job per inputs mapping, at most ``concurrency`` at once; results in order.
        The objective, as for :meth:`submit`, is every job's. Every mapping is checked before
        any job is sent."""
        limit = asyncio.Semaphore(concurrency)
        extra = objective_fields(deadline_ms, priority, on_miss)
        jobs = [job_inputs("submit_many", each, {}) for each in inputs]

        async def one(job: dict[str, Any]) -> Any:
            async with limit:
                return (await self._submit(workflow, job, timeout, extra))[0]

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(job)) for job in jobs]
        return [task.result() for task in tasks]

    async def _request(self, op: str, body: Any, wait: TimeoutArg) -> Any:
        timeout = resolve_timeout(wait, self.timeouts.request)
        channel = await self._channel_for(bulk=False)
        return await channel.request(op, body, timeout=timeout)

    async def _channel_for(self, bulk: bool) -> Channel:
        """The channel the next call goes on, (re)connected or failed over as needed."""
        channel = self._bulk_channel if bulk else self._channel
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
        channels = [c for c in (self._channel, self._bulk_channel, *self._retired) if c is not None]
        # forgotten, so that a later connect() starts at the same worker, not the next one
        self._channel = self._bulk_channel = None
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
