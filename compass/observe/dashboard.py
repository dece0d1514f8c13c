"""The live dashboard: the page a worker's metrics port serves at ``/``, and the JSON it reads.

Data flow. Each worker keeps its own recent task spans and answered jobs
(:class:`~compass.observe.timeline.Timeline`) and knows its own queue, lanes and cache. The
worker a browser opens gathers the rest: ``GET /api/cluster`` asks every peer it is connected
to for its part over the peer channels it already holds (the ``dashboard`` request, answered
inline from the peer's state, like ``status``), at once and for at most
:data:`PEER_TIMEOUT_S`, and returns every worker's part in one JSON document. So the page
needs one origin: the browser reaches one worker (a port-forward, a load balancer), never the
others' metrics ports, which are often bound to loopback or a private network; no CORS, and
a peer that does not answer in time is one row saying so, not a stalled page.

Each part carries the worker's wall clock (``now``) next to its spans, so the page places
every span on its own clock (``span time - part's now + page's now``) whatever the skew
between hosts. The page asks for the last ``window`` seconds: the whole minute at first,
then the time since its last answer plus a margin, and drops the spans it has (by the
worker's ``instance`` and the span's ``seq``); a worker caps what it sends per answer
(:data:`MAX_SPANS`, :data:`MAX_JOBS`), and says when it did.

The endpoints, their parameters and fields are documented in docs/DEPLOY.md ("The dashboard").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.resources
import json
import math
import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Protocol

import compass
from compass.errors import CompassError, InvalidInputs, UnknownOperation
from compass.observe.shown import Holdings, Identity, PeerLinks, Peers, Records, queue_status
from compass.observe.timeline import JOB_FIELDS, SPAN_FIELDS, rows

if TYPE_CHECKING:
    from compass.wire.rpc import Router
    from compass.wire.transport import Channel

__all__ = [
    "DASHBOARD_OP",
    "DEFAULT_WINDOW_S",
    "MAX_WINDOW_S",
    "PAGE_HEADERS",
    "Shown",
    "add_request",
    "cluster_view",
    "local_view",
    "page",
    "to_json",
    "window_of",
]

#: the peer request that answers one worker's part
DASHBOARD_OP = "dashboard"
#: seconds of spans and jobs an answer covers unless asked otherwise
DEFAULT_WINDOW_S = 15.0
#: the most a request may ask for (a worker keeps a few thousand spans anyway)
MAX_WINDOW_S = 600.0
#: spans and jobs one worker sends per answer, at most (the newest): a busy emulated worker
#: ends thousands of tasks a second, and a peer's answer must stay far below the wire's
#: element and header limits
MAX_SPANS = 1000
MAX_JOBS = 1000
#: traces one worker sends per answer (its newest), and tasks per trace
MAX_TRACES = 5
MAX_TRACE_TASKS = 50
#: streams in flight one worker sends per answer (its oldest)
MAX_STREAMS = 50
#: seconds the gathering worker waits for a peer's part
PEER_TIMEOUT_S = 1.0

_PAGE = "dashboard.html"


class Shown(Identity, Holdings, Records, Protocol):
    """What the dashboard shows of a worker (:mod:`compass.observe.shown` names the groups),
    and the peers it asks for theirs."""

    @property
    def membership(self) -> Peers | None: ...


def add_request(router: Router, worker: Shown) -> None:
    """Answer the ``dashboard`` request (any authenticated channel, as ``status``) on
    ``router`` with ``worker``'s part."""
    router.inline(DASHBOARD_OP)(functools.partial(_answer, worker))


def _answer(worker: Shown, channel: Channel, body: Any) -> dict[str, Any]:
    window = body.get("window_s", DEFAULT_WINDOW_S) if isinstance(body, dict) else None
    if isinstance(window, bool) or not isinstance(window, int | float):
        raise InvalidInputs("a dashboard request is {window_s: seconds}")
    return local_view(worker, _checked_window(float(window)))


def local_view(worker: Shown, window_s: float = DEFAULT_WINDOW_S) -> dict[str, Any]:
    """This worker's part: who it is, its state, queue, lanes and cache, and its task spans
    and answered jobs of the last ``window_s`` seconds (as rows of :data:`SPAN_FIELDS` and
    :data:`JOB_FIELDS`)."""
    lanes, cache, metrics = worker.lanes, worker.cache, worker.metrics
    timeline = metrics.timeline
    spans, spans_cut = timeline.recent_spans(window_s, MAX_SPANS)
    jobs, jobs_cut = timeline.recent_jobs(window_s, MAX_JOBS)
    ready, why = metrics.is_ready()
    queue = queue_status(worker)  # the same numbers as `compass status` shows
    queue["wait_ms"] = _finite(queue["wait_ms"])  # JSON has no infinity
    if worker.draining:
        state = "draining"
    elif lanes.degraded:
        state = "degraded"
    else:
        state = "ready" if ready else "not ready"
    snapshot = cache.snapshot()
    loading = set(snapshot["loading"])
    pinned: dict[str, int] = snapshot["pinned"]
    models = [
        {
            "name": name,
            "bytes": cache.size_bytes(name),
            "state": "loading" if name in loading else "resident",
            "pins": pinned.get(name, 0),
        }
        for name in sorted({*snapshot["resident"], *loading})
    ]
    membership = worker.membership
    return {
        "name": worker.name,
        "address": worker.address,
        "http": metrics.http_address or None,  # its HTTP front door, if it serves one
        "instance": worker.instance,
        "version": compass.__version__,
        "policy": worker.policy.name,
        "emulate": worker.config.emulate,
        "time_scale": worker.config.time_scale,
        "now": time.time(),
        "uptime_s": round(time.monotonic() - worker.started_at, 3),
        "state": state,
        "why": why,
        "queue": queue,
        "jobs_in_flight": worker.jobs_in_flight,
        "tasks": {"run": worker.stats.tasks_run, "failed": worker.stats.tasks_failed},
        "cache": {
            "backend": snapshot.get("backend", ""),
            "device": snapshot.get("device", ""),
            "capacity_bytes": snapshot["capacity_bytes"],
            "free_bytes": snapshot["free_bytes"],
            "models": models,
        },
        "slo": metrics.slo_summary(),
        # the cluster's desired worker count as this worker computes it (compass.elastic)
        "desired_workers": metrics.desired_workers().to_json(),
        "peers": [] if membership is None else sorted(membership.channels.peers),
        "spans": rows(spans),
        "spans_recorded": timeline.recorded,
        "spans_truncated": spans_cut,
        "jobs": rows(jobs),
        "jobs_truncated": jobs_cut,
        # the newest traces of jobs this worker was the ingress of (their JSON form)
        "traces": [_page_trace(trace) for trace in worker.tracer.recent(MAX_TRACES)],
        "traces_sample": worker.tracer.sample,
        # streamed jobs being read here: partial outputs made and read, time to first output
        "streams_in_flight": len(metrics.streams),
        "streams": metrics.streams.rows(time.time(), MAX_STREAMS),
    }


def _page_trace(trace: dict[str, Any]) -> dict[str, Any]:
    """A kept trace as the page gets it: at most :data:`MAX_TRACE_TASKS` tasks."""
    if len(trace["tasks"]) <= MAX_TRACE_TASKS:
        return trace
    return {**trace, "tasks": trace["tasks"][:MAX_TRACE_TASKS], "tasks_truncated": True}


async def cluster_view(
    worker: Shown, window_s: float = DEFAULT_WINDOW_S, timeout_s: float = PEER_TIMEOUT_S
) -> dict[str, Any]:
    """Every worker's part, as this worker gathers them: its own, and each connected peer's
    (a peer that does not answer within ``timeout_s`` is ``{name, address, error}``)."""
    membership = worker.membership
    answers = []
    if membership is not None:
        peers = sorted(membership.channels.peers.values(), key=lambda p: p.name)
        answers = await asyncio.gather(
            *(
                _peer_part(p.name, p.address, membership.channels, window_s, timeout_s)
                for p in peers
            )
        )
    parts = sorted([local_view(worker, window_s), *answers], key=lambda part: str(part["name"]))
    lost = []
    if membership is not None:
        lost = [
            {"name": m["name"], "address": m["address"], "lost_s": m["lost_s"]}
            for m in membership.describe_lost()
            if m["name"] not in membership.channels.peers
        ]
    return {
        "via": worker.name,
        # the gathering worker's answer: every worker computes the same within a gossip round
        "desired_workers": next(p["desired_workers"] for p in parts if p["name"] == worker.name),
        "now": time.time(),
        "window_s": window_s,
        "span_fields": list(SPAN_FIELDS),
        "job_fields": list(JOB_FIELDS),
        "workers": parts,
        "lost": lost,
    }


async def _peer_part(
    name: str, address: str, channels: PeerLinks, window_s: float, timeout_s: float
) -> dict[str, Any]:
    channel = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            channel = await channels.open_channel(name)  # channels are opened on demand
    if channel is None:
        return {"name": name, "address": address, "error": "not reachable now"}
    try:
        part = await channel.request(DASHBOARD_OP, {"window_s": window_s}, timeout=timeout_s)
    except UnknownOperation:
        error = "it serves no dashboard (an older compass?)"
    except CompassError as exc:  # a timeout, a lost connection, its own refusal
        error = f"{type(exc).__name__}: {exc}"
    else:
        if isinstance(part, dict) and part.get("name") == name:
            return part
        error = "its answer was not a dashboard part"
    return {"name": name, "address": address, "error": error}


def window_of(query: str) -> float:
    """The ``window`` parameter of a query string (seconds; :data:`DEFAULT_WINDOW_S` when
    absent); :class:`~compass.errors.InvalidInputs` saying what is wrong otherwise."""
    try:
        params = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise InvalidInputs(f"cannot parse the query {query!r}; try ?window=15") from None
    unknown = sorted(set(params) - {"window"})
    if unknown:
        raise InvalidInputs(f"unknown parameter {unknown[0]!r}; the one parameter is window")
    values = params.get("window")
    if not values:
        return DEFAULT_WINDOW_S
    if len(values) > 1:
        raise InvalidInputs("give window once")
    try:
        window = float(values[0])
    except ValueError:
        raise InvalidInputs(f"window must be a number of seconds, got {values[0]!r}") from None
    return _checked_window(window)


def _checked_window(window: float) -> float:
    if not 0 < window <= MAX_WINDOW_S:  # also refuses nan
        raise InvalidInputs(f"window must be in (0, {MAX_WINDOW_S:g}] seconds, got {window:g}")
    return window


def to_json(view: dict[str, Any]) -> bytes:
    """``view`` as JSON a browser parses: a non-finite number (which JSON lacks) is null."""
    try:
        text = json.dumps(view, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(_without_nan(view), allow_nan=False, separators=(",", ":"))
    return text.encode()


def _without_nan(value: Any) -> Any:
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(item) for item in value]
    return value


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


@functools.cache
def page() -> bytes:
    """The dashboard page: one HTML file with its script and style inline, shipped in the
    package (no script or style from anywhere else: it works offline)."""
    return importlib.resources.files("compass.observe").joinpath(_PAGE).read_bytes()


#: the page's headers: it may load nothing but itself and the JSON it reads
PAGE_HEADERS = (
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'\r\n"
    "X-Content-Type-Options: nosniff\r\n"
)
