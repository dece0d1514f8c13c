"""What a worker reports to a client, typed: its status (:class:`WorkerStatus`), the records
of the jobs it answered (:class:`JobRecord`) and its timeline of task spans and model loads
(:class:`WorkerTimeline`).

Each is built from the map the worker sends (``from_wire``) by the :class:`~compass.Client`
method that asks for it (:meth:`~compass.Client.status`, :meth:`~compass.Client.records`,
:meth:`~compass.Client.timeline`); a map that lacks a field the type needs raises
:class:`~compass.errors.ProtocolError` naming it. A status keeps the map it came from
(:meth:`WorkerStatus.to_json`, what ``compass status --json`` prints), so a field a newer
worker adds is not lost on the way.

Nothing here imports asyncio: a test or a tool can build these from saved JSON.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from compass.errors import ProtocolError
from compass.observe.timeline import LoadSpan, TaskSpan

__all__ = ["JobRecord", "WorkerStatus", "WorkerTimeline"]

_T = TypeVar("_T")


def _field(wire: Mapping[str, Any], name: str, kind: type[_T] | tuple[type, ...], what: str) -> Any:
    """``wire[name]``, checked to be a ``kind``; a ProtocolError naming it otherwise."""
    value = wire.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        shown = "nothing" if name not in wire else type(value).__name__
        raise ProtocolError(f"a worker's {what} has {shown} as {name!r}")
    return value


def _map(wire: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(wire, Mapping):
        raise ProtocolError(f"a worker answered its {what} with a {type(wire).__name__}")
    return wire


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker's status (:meth:`Client.status <compass.Client.status>`, ``compass status``):
    who it is, its peers, queues, cache, counters and what it plans on.

    The nested parts (``peers``, ``queue``, ``cache``, ``stats``, ...) are the maps the
    worker sent; the fields below name what each holds. :meth:`to_json` gives the whole map.
    """

    #: the worker's name, the address it serves on and its compass version
    name: str
    address: str
    version: str
    #: seconds since it started
    uptime_s: float
    #: its placement policy (``--policy``) and whether it emulates its tasks
    policy: str
    emulate: bool
    #: this run of the worker (a restarted worker has a new one)
    instance: str
    #: it was told to stop: it takes no new jobs and finishes those in flight
    draining: bool
    #: the address its peers reach it at ("" without membership)
    advertised: str
    #: its peers (``name``, ``address``, ...), the peers lost and being retried, channels to
    #: peers open now and the join handshakes it made
    peers: tuple[Mapping[str, Any], ...]
    lost: tuple[Mapping[str, Any], ...]
    peer_channels: int
    peer_handshakes: Mapping[str, Any]
    #: the workers it can place tasks on and what its planner believes of each (``name``,
    #: ``wait_ms``, ``models``, ``age_ms``, ...), and the view's kind and watches
    cluster: tuple[Mapping[str, Any], ...]
    view: Mapping[str, Any]
    #: the workflows its app declares
    workflows: tuple[str, ...]
    #: its queues and lanes (``ready``, ``running``, ``wait_ms``, ``stuck``, ...)
    queue: Mapping[str, Any]
    jobs_in_flight: int
    #: its model cache (``resident``, ``free_bytes``, ``capacity_bytes``, ...)
    cache: Mapping[str, Any]
    #: its counters (``tasks_run``, ``messages_dropped``, ...)
    stats: Mapping[str, Any]
    #: model -> {batch size: runs}
    batches: Mapping[str, Any]
    #: jobs with a deadline: workflow -> priority -> outcome counts and attainment
    slo: Mapping[str, Any]
    #: the address of its metrics and dashboard endpoint, if it serves one
    metrics: str | None
    #: jobs traced at this ingress: ``sample``, ``traced``, ``kept`` and ``recent`` briefs
    traces: Mapping[str, Any]
    #: what the process holds (``rss_mb``, ``open_fds``, ...) and its tables' sizes
    process: Mapping[str, Any]
    tables: Mapping[str, Any]
    #: the cluster's desired size as this worker sees it (``desired``, ``reason``,
    #: ``pressure``: compass.elastic); empty from a worker that does not say
    desired_workers: Mapping[str, Any] = field(default_factory=dict)
    #: the address of its HTTP front door (``--http-port``), if it serves one
    http: str | None = None
    _wire: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_wire(cls, wire: Any) -> WorkerStatus:
        """The status a worker sent (``status`` request); ProtocolError if it is malformed.
        Who the worker is must be there; a part an older worker does not send is empty."""
        w = _map(wire, "status")
        what = "status"

        def rows(name: str) -> tuple[Mapping[str, Any], ...]:
            items = _field(w, name, list, what) if name in w else []
            if not all(isinstance(item, Mapping) for item in items):
                raise ProtocolError(f"a worker's status has a {name!r} that is not a list of maps")
            return tuple(items)

        def mapping(name: str) -> Mapping[str, Any]:
            return _field(w, name, Mapping, what) if name in w else {}

        def optional(name: str, kind: type, empty: Any) -> Any:
            return _field(w, name, kind, what) if name in w else empty

        metrics, http = w.get("metrics"), w.get("http")
        for name, value in (("metrics", metrics), ("http", http)):
            if value is not None and not isinstance(value, str):
                raise ProtocolError(f"a worker's status has a {type(value).__name__} as {name!r}")
        return cls(
            name=_field(w, "name", str, what),
            address=_field(w, "address", str, what),
            version=_field(w, "version", str, what),
            uptime_s=float(_field(w, "uptime_s", (int, float), what)),
            policy=optional("policy", str, ""),
            emulate=optional("emulate", bool, False),
            instance=_field(w, "instance", str, what),
            draining=optional("draining", bool, False),
            advertised=optional("advertised", str, ""),
            peers=rows("peers"),
            lost=rows("lost"),
            peer_channels=optional("peer_channels", int, 0),
            peer_handshakes=mapping("peer_handshakes"),
            cluster=rows("cluster"),
            view=mapping("view"),
            workflows=tuple(optional("workflows", list, [])),
            queue=mapping("queue"),
            jobs_in_flight=optional("jobs_in_flight", int, 0),
            cache=mapping("cache"),
            stats=mapping("stats"),
            batches=mapping("batches"),
            slo=mapping("slo"),
            metrics=metrics,
            traces=mapping("traces"),
            process=mapping("process"),
            tables=mapping("tables"),
            desired_workers=mapping("desired_workers"),
            http=http,
            _wire=w,
        )

    def to_json(self) -> dict[str, Any]:
        """The whole map the worker sent (fields a newer worker adds included)."""
        return dict(self._wire)

    @property
    def peer_names(self) -> list[str]:
        """The names of its peers, in the order it lists them."""
        return [str(peer.get("name")) for peer in self.peers]

    def __getitem__(self, key: str) -> Any:
        """Deprecated: ``status["peers"]`` was the spelling while :meth:`Client.status
        <compass.Client.status>` answered a dict; read the attribute (``status.peers``)."""
        warnings.warn(
            f"WorkerStatus[{key!r}] is deprecated: read the attribute (status.{key}), or "
            "status.to_json() for the map the worker sent",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._wire[key]


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What an ingress keeps of a job it answered (:meth:`Client.records
    <compass.Client.records>`): where its tasks last ran and how it ended."""

    #: the job's id (the workers' logs name it by this) and its workflow
    job: str
    workflow: str
    #: task -> the worker it ran on, in the plan that answered the job
    plan: Mapping[str, str]
    #: how many times the job was planned (1: it never had to be planned again)
    attempts: int
    #: the client's key for the job (a job run twice shows twice under one key)
    key: str | None
    priority: int
    #: seconds the job had from its submission (None: no deadline)
    deadline_s: float | None
    ok: bool
    #: seconds from its submission to its answer, in the ingress's clock (workload time
    #: on an emulated worker)
    latency_s: float
    #: of a workflow decided at run time (else empty): each decision task that ran -> its
    #: choice (a branch's successor, a fan-out's width, a loop's "again" or "stop"), the same
    #: in words by declared task (``route: expert_a; refine: 3 iterations``), and the tasks
    #: of the unrolled workflow the job skipped
    choices: Mapping[str, str] = field(default_factory=dict)
    taken: str = ""
    skipped: tuple[str, ...] = ()

    @classmethod
    def from_wire(cls, wire: Any) -> JobRecord:
        w = _map(wire, "job record")
        what = "job record"
        plan = _field(w, "plan", Mapping, what)
        key = w.get("key")
        deadline = w.get("deadline_s")
        if key is not None and not isinstance(key, str):
            raise ProtocolError(f"a worker's job record has a {type(key).__name__} as 'key'")
        if deadline is not None and not isinstance(deadline, (int, float)):
            raise ProtocolError("a worker's job record has a deadline_s that is not a number")
        return cls(
            job=_field(w, "job", str, what),
            workflow=_field(w, "workflow", str, what),
            plan={str(task): str(worker) for task, worker in plan.items()},
            attempts=_field(w, "attempts", int, what),
            key=key,
            priority=_field(w, "priority", int, what) if "priority" in w else 0,
            deadline_s=None if deadline is None else float(deadline),
            ok=_field(w, "ok", bool, what),
            latency_s=float(_field(w, "latency_s", (int, float), what)),
            **_taken(w),
        )

    def to_json(self) -> dict[str, Any]:
        """The record as the worker sent it (a map of its fields)."""
        out = {
            "job": self.job, "workflow": self.workflow, "plan": dict(self.plan),
            "attempts": self.attempts, "key": self.key, "priority": self.priority,
            "deadline_s": self.deadline_s, "ok": self.ok, "latency_s": self.latency_s,
        }  # fmt: skip
        if self.choices or self.taken or self.skipped:
            out |= {"choices": dict(self.choices), "taken": self.taken}
            out["skipped"] = list(self.skipped)
        return out


def _taken(w: Mapping[str, Any]) -> dict[str, Any]:
    """A record's choices, their words and its skipped tasks (absent: a static workflow's
    record, or an older worker's)."""
    choices = w.get("choices", {})
    skipped = w.get("skipped", [])
    if (
        not isinstance(choices, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in choices.items())
        or not isinstance(skipped, list)
        or not all(isinstance(t, str) for t in skipped)
    ):
        raise ProtocolError("a worker's job record has choices or skipped tasks not of names")
    taken = w.get("taken", "")
    if not isinstance(taken, str):
        raise ProtocolError("a worker's job record has a 'taken' that is not a string")
    return {"choices": dict(choices), "taken": taken, "skipped": tuple(skipped)}


def _named_rows(kind: type[_T], fields: Any, rows: Any, what: str) -> list[_T]:
    """``rows`` (lists of values in the order of ``fields``) as ``kind``; fields ``kind`` does
    not know (a newer worker's) are left out, those it lacks take their defaults."""
    if not isinstance(fields, list) or not isinstance(rows, list):
        raise ProtocolError(f"a worker's timeline has no {what} fields and rows")
    known: Sequence[str] = kind._fields  # type: ignore[attr-defined]
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != len(fields):
            raise ProtocolError(f"a worker's timeline has a {what} row of the wrong length")
        values = {f: v for f, v in zip(fields, row, strict=True) if f in known}
        try:
            out.append(kind(**values))
        except TypeError as exc:
            raise ProtocolError(f"a worker's timeline has a malformed {what}: {exc}") from None
    return out


@dataclass(frozen=True, slots=True)
class WorkerTimeline:
    """What ran on a worker lately (:meth:`Client.timeline <compass.Client.timeline>`): its
    task spans (oldest first) and the model loads it keeps, in its wall clock, with what a
    chart of its lanes needs."""

    name: str
    instance: str
    #: the worker's time scale (``--time-scale``: its clock runs in workload time)
    time_scale: float
    lanes: int
    host_lanes: int
    spans: tuple[TaskSpan, ...]
    loads: tuple[LoadSpan, ...]
    #: spans fell off the worker's ring before they were read: the oldest are missing
    lost: bool

    @classmethod
    def from_parts(cls, parts: Iterable[Any]) -> WorkerTimeline:
        """The timeline from the pages a worker answered ``timeline`` requests with, in
        order (each page's spans follow the last one's)."""
        spans: list[TaskSpan] = []
        loads: list[LoadSpan] = []
        lost = False
        last: Mapping[str, Any] | None = None
        for part in parts:
            last = _map(part, "timeline")
            spans += _named_rows(TaskSpan, last.get("span_fields"), last.get("spans"), "span")
            loads = _named_rows(LoadSpan, last.get("load_fields"), last.get("loads"), "load")
            lost = lost or bool(last.get("lost"))
        if last is None:
            raise ProtocolError("a worker's timeline has no part")
        what = "timeline"
        return cls(
            name=_field(last, "name", str, what),
            instance=_field(last, "instance", str, what),
            time_scale=float(_field(last, "time_scale", (int, float), what)),
            lanes=_field(last, "lanes", int, what),
            host_lanes=_field(last, "host_lanes", int, what),
            spans=tuple(spans),
            loads=tuple(loads),
            lost=lost,
        )
