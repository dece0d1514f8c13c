"""A job's trace: where each of its tasks ran and where its time went.

A traced job (``Client.submit_job(..., trace=True)``, or one its ingress sampled with
``--trace-sample``) comes back with a :class:`JobTrace`: per task, the worker that ran it and
the one its plan named, its input transfer, its queue wait, its model load (and whether the
model was resident), its execution, its batch (size and the jobs batched with it), its attempt,
and its wall-clock start and end; per job, its latency and that latency split along its
critical path (:attr:`JobTrace.breakdown_ms`), so the parts add up to the whole. A step-wise
task's trace sums up its steps (how many, the first one's time, the time they waited for a
slow caller), and a streamed job's gives its time to first output.

The trace's JSON form (:meth:`JobTrace.to_json`, what ``compass submit --trace-json`` writes)
is also its wire form, checked by :meth:`JobTrace.from_json`. Times are real milliseconds, and
wall-clock seconds since the epoch, also on an emulated worker (``--time-scale``), whose own
clock runs in workload time. Sans-IO.

W3C trace context: :func:`parse_traceparent` and :func:`format_traceparent` read and write the
``traceparent`` header value (``00-<trace id>-<span id>-<flags>``) a job carries from its
caller, so a caller's span (a web request's) is the parent of the job's span in OpenTelemetry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from compass.errors import ProtocolError

__all__ = [
    "BREAKDOWN",
    "JobTrace",
    "TaskTrace",
    "TraceParent",
    "format_traceparent",
    "parse_traceparent",
    "seen_by_client",
]

#: the parts of a job's latency, in the order they happen: the client's hop to the ingress
#: and back, the client's import of torch to rebuild the first tensor it received (``import``:
#: a second or more, once per process that had not imported it), planning at the ingress,
#: then along the critical path the tasks' input transfers, queue waits, model loads and
#: executions, the last task's output to the ingress and its answer (``result``), and what
#: none of those covers (``other``: the gaps between them, a task's hand-off to the next)
BREAKDOWN = (
    "client", "import", "planning", "transfer", "queue", "load", "exec", "result", "other"
)  # fmt: skip

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class TraceParent(NamedTuple):
    """A W3C trace context: a trace id (128 bits), a span id (64 bits), and whether the
    caller's tracing sampled it. (A named tuple: one is made per traced job.)"""

    trace_id: int
    span_id: int
    sampled: bool = True


def parse_traceparent(text: str) -> TraceParent | None:
    """``text`` as a W3C ``traceparent`` value (version 00), or None when it is not one (the
    standard says to ignore a malformed header, not to fail the request)."""
    if not isinstance(text, str) or len(text) != 55:
        return None
    found = _TRACEPARENT.fullmatch(text)
    if found is None:
        return None
    trace_id, span_id = int(found[1], 16), int(found[2], 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, bool(int(found[3], 16) & 1))


def format_traceparent(parent: TraceParent) -> str:
    """``parent`` as a ``traceparent`` value."""
    flags = "01" if parent.sampled else "00"
    return f"00-{parent.trace_id:032x}-{parent.span_id:016x}-{flags}"


@dataclass(frozen=True, slots=True)
class TaskTrace:
    """One task of a traced job: where it ran and where its time went (milliseconds)."""

    task: str
    #: the worker that ran it, and the one the job's plan named (dynamic adjustment moves a
    #: task when a better worker appears after its predecessor finished)
    worker: str
    planned_worker: str
    #: its inputs on the wire (the slowest, for a join)
    transfer_ms: float
    #: in the worker's queue, from its last input's arrival to a lane taking it
    queued_ms: float
    #: on the lane, waiting for its model to be copied in (0 when it was resident)
    load_ms: float
    #: whether its model was resident when it asked (None: a task without a model)
    cache_hit: bool | None
    exec_ms: float
    #: tasks in its run: 1 alone, more in a batch with :attr:`mates` (their job ids)
    batch: int
    #: wall clock (seconds since the epoch): a lane took it, it ended
    start: float
    end: float
    #: the job's attempt it ran in (a job is planned again, as attempt 1, 2..., when a
    #: worker of its plan is lost)
    attempt: int = 0
    model: str | None = None
    mates: tuple[str, ...] = ()
    lane: int = 0
    #: "" when it succeeded, else its error's type
    error: str = ""
    #: the id of the worker core's event that made a lane take it (``received:...``: its
    #: last input arrived; ``done:...``: another task ended and freed the lane; ``loaded:...``:
    #: its model was copied in)
    cause: str = ""
    #: a step-wise task's steps in summary: how many it took, the first one's time (the basis
    #: of its job's time to first output) and how long its steps waited for a slow caller to
    #: read (backpressure); 0, None and 0 for a plain task
    steps: int = 0
    first_step_ms: float | None = None
    waited_ms: float = 0.0
    #: how long it waited suspended at step boundaries, between :attr:`start` and :attr:`end`
    #: (a more urgent task had its lane; in :attr:`JobTrace.breakdown_ms`'s ``queue``); 0
    #: for a task never suspended
    suspended_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        steps = {} if not self.steps else {
            "steps": self.steps, "first_step_ms": self.first_step_ms,
            "waited_ms": self.waited_ms,
        }  # fmt: skip
        if self.suspended_ms:  # only a task that was suspended says so
            steps["suspended_ms"] = self.suspended_ms
        return {
            "task": self.task,
            "worker": self.worker,
            "planned_worker": self.planned_worker,
            "queued_ms": self.queued_ms,
            "transfer_ms": self.transfer_ms,
            "load_ms": self.load_ms,
            "cache_hit": self.cache_hit,
            "exec_ms": self.exec_ms,
            "batch": self.batch,
            "mates": list(self.mates),
            "start": self.start,
            "end": self.end,
            "attempt": self.attempt,
            "model": self.model,
            "lane": self.lane,
            "error": self.error,
            "cause": self.cause,
            **steps,
        }

    @classmethod
    def from_json(cls, body: Any) -> TaskTrace:
        """A task of a trace from its JSON form; :class:`ProtocolError` when malformed."""
        if not isinstance(body, Mapping):
            raise ProtocolError(f"a task of a trace must be a map, got {type(body).__name__}")
        get = body.get
        numbers: list[Any] = [get(key) for key in _TASK_NUMBERS]
        counts: tuple[Any, ...] = (get("batch", 1), get("attempt", 0), get("lane", 0))
        names: tuple[Any, ...] = (get("task"), get("worker"), get("planned_worker"),
                                  get("error", ""), get("cause", ""))  # fmt: skip
        mates, hit, model = get("mates", ()), get("cache_hit"), get("model")
        steps, first, waited = get("steps", 0), get("first_step_ms"), get("waited_ms", 0.0)
        suspended = get("suspended_ms", 0.0)
        # the checks are set operations on types, done in C: a trace is read per traced job
        if (
            not set(map(type, numbers)) <= _NUMBER_TYPES
            or not all(map(math.isfinite, numbers))
            or set(map(type, counts)) != _INT
            or min(counts) < 0
            or set(map(type, names)) != _STR
            or type(mates) not in _SEQUENCES
            or not set(map(type, mates)) <= _STR
            or type(hit) not in _MAYBE_BOOL
            or type(model) not in _MAYBE_STR
            or type(steps) is not int
            or steps < 0
            or not (first is None or _number(first))
            or not _number(waited)
            or not _number(suspended)
        ):
            raise ProtocolError(f"a task of a trace is malformed: {dict(body)!r:.300}")
        transfer, queued, load, exec_, start, end = numbers
        return cls(
            names[0], names[1], names[2], transfer, queued, load, hit, exec_, counts[0], start,
            end, counts[1], model, tuple(mates), counts[2], names[3], names[4], steps, first,
            waited, suspended,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobTrace:
    """A traced job: its tasks (:class:`TaskTrace`, in the order they started) and its
    latency with where it went.

    ``latency_ms`` is what the client measured (the ingress's own measure, submit to answer,
    where the trace was read later with :meth:`Client.trace`); ``breakdown_ms`` splits it into
    :data:`BREAKDOWN`: its parts add up to ``latency_ms``, ``other`` being what no part covers.
    ``critical_path`` names the tasks the breakdown follows: from the sink that finished last,
    back through the predecessor that finished last. ``attempts`` counts the ingress's plans
    of the job (more than one: it was planned again after a lost worker), ``retries`` the
    client's resubmissions to another worker.
    """

    job: str
    workflow: str
    latency_ms: float
    tasks: tuple[TaskTrace, ...]
    #: the ingress: the worker the job was submitted to
    ingress: str = ""
    #: wall clock (seconds since the epoch): the ingress received the job, answered it
    start: float = 0.0
    end: float = 0.0
    ok: bool = True
    #: "" when it succeeded, else its error's type
    error: str = ""
    attempts: int = 1
    retries: int = 0
    #: the W3C trace id its OpenTelemetry spans carry (32 hex digits)
    trace_id: str = ""
    breakdown_ms: Mapping[str, float] = field(default_factory=dict)
    critical_path: tuple[str, ...] = ()
    #: a streamed job's time to first output: its ingress received it, then its first partial
    #: output went to its caller (None: not streamed, or no partial output)
    first_output_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The trace as JSON: ``{"job", "workflow", "latency_ms", "tasks": [...], ...}``."""
        return {
            "job": self.job,
            "workflow": self.workflow,
            "latency_ms": self.latency_ms,
            "tasks": [task.to_json() for task in self.tasks],
            "ingress": self.ingress,
            "start": self.start,
            "end": self.end,
            "ok": self.ok,
            "error": self.error,
            "attempts": self.attempts,
            "retries": self.retries,
            "trace_id": self.trace_id,
            "breakdown_ms": dict(self.breakdown_ms),
            "critical_path": list(self.critical_path),
            **({} if self.first_output_ms is None else {"first_output_ms": self.first_output_ms}),
        }

    @classmethod
    def from_json(cls, body: Any) -> JobTrace:
        """A trace from its JSON (or wire) form; :class:`ProtocolError` when malformed."""
        if not isinstance(body, Mapping):
            raise ProtocolError(f"a trace must be a map, got {type(body).__name__}")
        get = body.get
        tasks: Any = get("tasks")
        breakdown = get("breakdown_ms", {})
        path = get("critical_path", ())
        numbers: list[Any] = [get("latency_ms"), get("start", 0.0), get("end", 0.0)]
        counts: tuple[Any, ...] = (get("attempts", 1), get("retries", 0))
        names: tuple[Any, ...] = (get("job"), get("workflow"), get("ingress", ""),
                                  get("error", ""), get("trace_id", ""))  # fmt: skip
        if (
            type(tasks) not in _SEQUENCES
            or not isinstance(breakdown, Mapping)
            or not set(map(type, breakdown)) <= _STR
            or not set(map(type, breakdown.values())) <= _NUMBER_TYPES
            or not all(map(math.isfinite, breakdown.values()))
            or type(path) not in _SEQUENCES
            or not set(map(type, path)) <= _STR
            or not set(map(type, numbers)) <= _NUMBER_TYPES
            or not all(map(math.isfinite, numbers))
            or set(map(type, counts)) != _INT
            or min(counts) < 0
            or set(map(type, names)) != _STR
            or type(get("ok", True)) is not bool
            or not (get("first_output_ms") is None or _number(get("first_output_ms")))
        ):
            raise ProtocolError(f"a trace is malformed: {dict(body)!r:.300}")
        return cls(
            job=names[0],
            workflow=names[1],
            latency_ms=numbers[0],
            tasks=tuple(TaskTrace.from_json(task) for task in tasks),
            ingress=names[2],
            start=numbers[1],
            end=numbers[2],
            ok=get("ok", True),
            error=names[3],
            attempts=counts[0],
            retries=counts[1],
            trace_id=names[4],
            breakdown_ms=dict(breakdown),
            critical_path=tuple(path),
            first_output_ms=get("first_output_ms"),
        )


def seen_by_client(
    trace: Mapping[str, Any], latency_ms: float, retries: int, import_ms: float = 0.0
) -> dict[str, Any]:
    """The JSON form of a trace as the ingress assembled it, with the latency its client
    measured: the difference from the ingress's own is the client's hop
    (``breakdown_ms["client"]``), less the ``import_ms`` the client spent importing torch to
    rebuild a tensor of the answer (``breakdown_ms["import"]``: named, since it is no hop)."""
    out = dict(trace)
    breakdown = dict(out.get("breakdown_ms") or {})
    ingress_ms = out.get("latency_ms")
    if _number(ingress_ms):
        breakdown["client"] = breakdown.get("client", 0.0) + latency_ms - ingress_ms - import_ms
        breakdown["import"] = breakdown.get("import", 0.0) + import_ms
    out.update(latency_ms=latency_ms, retries=retries, breakdown_ms=breakdown)
    return out


_NUMBER_TYPES = frozenset((int, float))
_INT, _STR = {int}, {str}
_SEQUENCES = (list, tuple)
_MAYBE_BOOL = (bool, type(None))
_MAYBE_STR = (str, type(None))
#: a task's numbers, in the order of :class:`TaskTrace`'s fields
_TASK_NUMBERS = ("transfer_ms", "queued_ms", "load_ms", "exec_ms", "start", "end")


def _number(value: Any) -> bool:
    return type(value) in _NUMBER_TYPES and math.isfinite(value)
