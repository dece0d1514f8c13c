"""Job traces at the workers, sans-IO: which jobs are traced, the spans of their tasks as they
travel with the job, and the traces an ingress keeps.

**Which jobs.** The ingress decides when a job is submitted: traced when its client asks
(``trace=True``), when its caller's W3C trace context says the caller sampled it and this
worker exports to OpenTelemetry (parent-based sampling, as OpenTelemetry SDKs do), or with
probability ``sample`` (``--trace-sample``). Untraced jobs cost one test of an empty dict per
message and per task.

**How the spans reach the ingress: with the job's own messages.** Every task, result and
failure message of a traced job carries a ``tr`` field (absent from untraced jobs, ignored by
workers that predate it): the job span's context (``tp``, a ``traceparent``), the plan as the
ingress first made it (``pw``, once per worker and attempt) and the spans of the job's tasks
that the receiver may not have (``spans``). A worker keeps the spans of each traced job it
touches until the job is done, adds its own as its tasks end, and sends a peer only the spans
that peer neither ran nor was sent already, so a long chain carries each span about once
instead of its whole history at every hop. A sink's result thus brings the ingress every span
of the job's attempt: causally, each task ended before its output moved on, so the trace is
complete the moment the job is answered, with no request to any worker afterwards and
nothing lost when a busy worker's timeline ring (:mod:`compass.observe.timeline`) wraps.

**What the ingress keeps.** The assembled trace (the JSON form of
:class:`compass.trace.JobTrace`) goes into a bounded ring of the last ``keep`` traces, read by
``compass status``, the dashboard and :meth:`compass.Client.trace`.

Times: span times are wall-clock seconds and durations real seconds (an emulated worker's
clock runs in workload time; ``scale`` turns its seconds into real ones), as in the timeline.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from compass.config import WorkerConfig
from compass.core.messages import JOB_INPUTS, FailedMsg, PeerMessage, ResultMsg, TaskMsg
from compass.trace import TraceParent, format_traceparent, parse_traceparent

if TYPE_CHECKING:
    from compass.core.outcome import TaskOutcome
    from compass.workflow.dag import Workflow

__all__ = [
    "TRACE_FIELD",
    "Answered",
    "JobTracing",
    "Tracer",
    "assemble",
    "critical_path",
    "task_span",
]

#: the optional field of a task, result or failed message that marks a traced job
TRACE_FIELD = "tr"
#: traced jobs a worker holds spans of at most (the oldest go first: a job whose ``done``
#: never came, its ingress lost)
MAX_JOBS = 4096

#: a span on the wire: key -> the types its value may take
_SPAN_TYPES: dict[str, tuple[type, ...]] = {
    "task": (str,),
    "att": (int,),
    "worker": (str,),
    "model": (str, type(None)),
    "queued": (float, int),
    "start": (float, int),
    "end": (float, int),
    "transfer_s": (float, int),
    "load_s": (float, int),
    "exec_s": (float, int),
    "hit": (bool, type(None)),
    "batch": (int,),
    "mates": (list,),
    "lane": (int,),
    "error": (str,),
    "cause": (str,),
}
#: what a step-wise task's span adds (absent from a plain task's): its steps, the first one's
#: seconds, the seconds its steps waited for the caller to read, and the seconds it waited
#: suspended at step boundaries (between its ``start`` and its ``end``)
_STEP_TYPES: dict[str, tuple[type, ...]] = {
    "steps": (int,),
    "first_s": (float, int),
    "waited_s": (float, int),
    "suspended_s": (float, int),
}

_Key = tuple[str, int]


@dataclass(slots=True, eq=False)
class JobTracing:
    """What a worker holds of one traced job."""

    #: the job span's context: every task span is its child
    parent: TraceParent
    #: task -> worker as the ingress planned the job's attempt :attr:`attempt` (replaced,
    #: never changed in place)
    planned: Mapping[str, str] = field(default_factory=dict)
    attempt: int = -1
    #: (task, attempt) -> its span, as :func:`task_span` makes it
    spans: dict[_Key, dict[str, Any]] = field(default_factory=dict)
    #: peer -> the spans sent to it already, and the attempt whose plan it was told (made
    #: when the job's first message leaves: most traced jobs of a busy ingress never do)
    sent: dict[str, set[_Key]] | None = None
    told: dict[str, int] | None = None
    # at the ingress only:
    #: the caller's span (the job span's parent), if it gave one
    caller: TraceParent | None = None
    #: wall clock: the job arrived; its plan was made
    received: float = 0.0
    planned_at: float = 0.0
    #: wall clock: its first partial output reached its caller's stream (0: none yet)
    first_output: float = 0.0

    @property
    def traceparent(self) -> str:
        return format_traceparent(self.parent)


def task_span(
    outcome: TaskOutcome, worker: str, *, wall: float, now: float, scale: float
) -> dict[str, Any]:
    """The span of a task that ended now: ``wall`` the wall clock, ``now`` the worker's clock
    (whose seconds are ``scale`` real ones)."""
    entry = outcome.entry
    error = outcome.error
    span = {
        "task": entry.task,
        "att": entry.attempt,
        "worker": worker,
        "model": entry.model,
        # first queued, first run (a task suspended and resumed: its span covers both runs)
        "queued": wall - (now - entry.enqueued_at) * scale,
        "start": wall - (now - entry.first_started_at) * scale,
        "end": wall,
        "transfer_s": entry.transfer_s * scale,
        "load_s": outcome.fetch_s * scale,
        "exec_s": outcome.exec_s * scale,
        "hit": None if entry.model is None else outcome.cache_hit,
        "batch": outcome.batch,
        "mates": [e.job_id for e in outcome.run if e is not entry],
        "lane": outcome.lane,
        "error": "" if error is None else type(error).__name__,
        "cause": outcome.cause,
    }
    if outcome.steps:  # a step-wise task: its steps in summary
        first = outcome.first_step_s
        span.update(steps=outcome.steps, first_s=0.0 if first is None else first * scale,
                    waited_s=outcome.waited_s * scale,
                    suspended_s=outcome.suspended_s * scale)  # fmt: skip
    return span


class Tracer:
    """The traced jobs of one worker, and (as an ingress) the traces it keeps.

    ``sample``: the fraction of jobs traced unless their client asks; ``keep``: how many
    assembled traces are kept; ``rng`` draws the samples and the trace and span ids.
    """

    def __init__(
        self,
        *,
        sample: float = 0.0,
        keep: int = WorkerConfig().trace_keep,
        rng: random.Random | None = None,
        max_jobs: int = MAX_JOBS,
    ) -> None:
        self.sample = sample
        self._rng = rng if rng is not None else random.Random()
        self._max_jobs = max_jobs
        self._keep = keep
        #: traced jobs this worker holds something of, oldest first
        self.jobs: OrderedDict[str, JobTracing] = OrderedDict()
        #: the last jobs this ingress answered traced, job id -> the trace's JSON form, or
        #: what it is assembled from when first read (most are never read: assembling them
        #: as they end would cost every traced job)
        self.kept: OrderedDict[str, dict[str, Any] | Answered] = OrderedDict()
        #: traced jobs answered here since the worker started
        self.traced = 0
        #: the last one answered, whatever ``keep`` (with keep 0, a client that asked for its
        #: job's trace still gets it with the answer)
        self._last: tuple[str, Answered] | None = None

    # -- at the ingress -----------------------------------------------------------------------

    def start(
        self, job_id: str, *, forced: bool, traceparent: str | None, received: float,
        follow_caller: bool = False,
    ) -> JobTracing | None:  # fmt: skip
        """Decide whether the job just submitted is traced; its tracing if so.
        ``follow_caller``: a caller's sampled trace context traces it too."""
        caller = parse_traceparent(traceparent) if traceparent else None
        if not (
            forced
            or (follow_caller and caller is not None and caller.sampled)
            or (self.sample > 0 and self._rng.random() < self.sample)
        ):
            return None
        rng = self._rng
        trace_id = caller.trace_id if caller is not None else rng.getrandbits(128) or 1
        tracing = JobTracing(
            TraceParent(trace_id, rng.getrandbits(64) or 1), caller=caller, received=received
        )
        self._hold(job_id, tracing)
        return tracing

    def planned(self, job_id: str, attempt: int, plan: Mapping[str, str], wall: float) -> None:
        """The ingress planned attempt ``attempt`` of the job: ``plan``."""
        tracing = self.jobs.get(job_id)
        if tracing is None or not plan:
            return
        if attempt > tracing.attempt:
            tracing.planned, tracing.attempt = dict(plan), attempt
        if not tracing.planned_at:  # the first plan (its roots may have been sent already)
            tracing.planned_at = wall

    def finish(
        self,
        job_id: str,
        record: Mapping[str, Any],
        workflow: Workflow | None,
        *,
        ingress: str,
        answered: float,
        error: str = "",
    ) -> Answered | None:
        """The job was answered (``record``: the worker core's record of it): its trace is
        kept (:meth:`trace` reads it). What it is assembled from; None when the job was not
        traced."""
        tracing = self.jobs.pop(job_id, None)
        if tracing is None:
            return None
        self.traced += 1
        done = Answered(tracing, record, workflow, ingress, answered, error)
        self._last = (job_id, done)
        if self._keep:
            kept = self.kept
            kept[job_id] = done
            if len(kept) > self._keep:
                kept.popitem(last=False)
        return done

    def trace(self, job_id: str) -> dict[str, Any] | None:
        """A kept trace (the JSON form of :class:`compass.trace.JobTrace`)."""
        kept = self.kept.get(job_id)
        if isinstance(kept, Answered):
            kept = self.kept[job_id] = kept.assemble(job_id)
        elif kept is None and self._last is not None and self._last[0] == job_id:
            return self._last[1].assemble(job_id)
        return kept

    def recent(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` kept traces, oldest first."""
        jobs: list[str] = []
        for job_id in reversed(self.kept):
            if len(jobs) >= limit:
                break
            jobs.append(job_id)
        return [trace for job_id in jobs[::-1] if (trace := self.trace(job_id)) is not None]

    # -- every worker -------------------------------------------------------------------------

    def outgoing(self, msg: PeerMessage, peer: str) -> dict[str, Any] | None:
        """The trace field of ``msg`` to ``peer``; None when its job is not traced."""
        if not isinstance(msg, TaskMsg | ResultMsg | FailedMsg):
            return None
        tracing = self.jobs.get(msg.job)
        if tracing is None:
            return None
        out: dict[str, Any] = {"tp": tracing.traceparent}
        if isinstance(msg, TaskMsg):
            if msg.source == JOB_INPUTS and msg.attempt > tracing.attempt:
                # a root the ingress sends: its plan is the attempt's plan as made
                tracing.planned, tracing.attempt = dict(msg.plan), msg.attempt
            told = tracing.told
            if told is None:
                told = tracing.told = {}
            if tracing.planned and told.get(peer, -1) < tracing.attempt:
                told[peer] = tracing.attempt
                out["pw"] = tracing.planned
                out["pa"] = tracing.attempt
        if tracing.sent is None:
            tracing.sent = {}
        sent = tracing.sent.setdefault(peer, set())
        spans = [
            span for key, span in tracing.spans.items()
            if key not in sent and span["worker"] != peer
        ]  # fmt: skip
        if spans:
            sent.update((span["task"], span["att"]) for span in spans)
            out["spans"] = spans
        return out

    def incoming(self, job_id: str, body: Any) -> bool:
        """The trace field of a message of ``job_id``: the job is traced; what it brings is
        kept. False (and nothing kept) when it is malformed."""
        if not isinstance(body, dict):
            return False
        parent = parse_traceparent(body.get("tp", ""))
        spans = body.get("spans", [])
        planned = body.get("pw")
        attempt = body.get("pa", 0)
        if (
            parent is None
            or not isinstance(spans, list)
            or not all(_well_formed(span) for span in spans)
            or not (planned is None or _plan(planned))
            or isinstance(attempt, bool)
            or not isinstance(attempt, int)
        ):
            return False
        tracing = self.jobs.get(job_id)
        if tracing is None:
            tracing = JobTracing(parent)
            self._hold(job_id, tracing)
        if planned is not None and attempt > tracing.attempt:
            tracing.planned, tracing.attempt = dict(planned), attempt
        for span in spans:
            tracing.spans[span["task"], span["att"]] = span
        return True

    def first_output(self, job_id: str, wall: float) -> None:
        """Traced job ``job_id``'s first partial output reached its caller at ``wall``."""
        tracing = self.jobs.get(job_id)
        if tracing is not None and not tracing.first_output:
            tracing.first_output = wall

    def task_ended(self, job_id: str, span: dict[str, Any]) -> JobTracing | None:
        """Keep ``span`` (:func:`task_span`) of a task of ``job_id`` that ended here; the
        job's tracing, None when it is not traced (and nothing is kept)."""
        tracing = self.jobs.get(job_id)
        if tracing is not None:
            tracing.spans[span["task"], span["att"]] = span
        return tracing

    def forget(self, job_id: str) -> None:
        """The job is done (or was never accepted): drop what is held of it."""
        self.jobs.pop(job_id, None)

    def _hold(self, job_id: str, tracing: JobTracing) -> None:
        self.jobs[job_id] = tracing
        while len(self.jobs) > self._max_jobs:
            self.jobs.popitem(last=False)


def _well_formed(span: Any) -> bool:
    if not isinstance(span, dict):
        return False
    for key, kinds in _SPAN_TYPES.items():
        value = span.get(key, _MISSING)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
    for key, kinds in _STEP_TYPES.items():
        value = span.get(key, 0)
        if type(value) not in kinds or not math.isfinite(value) or value < 0:
            return False
    return all(isinstance(mate, str) for mate in span["mates"])


def _plan(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


_MISSING = object()


class Answered(NamedTuple):
    """An answered traced job: what its trace is assembled from (when first read). (A named
    tuple: one is made per traced job.)"""

    tracing: JobTracing
    record: Mapping[str, Any]
    workflow: Workflow | None
    ingress: str
    answered: float
    error: str

    def assemble(self, job_id: str) -> dict[str, Any]:
        return assemble(
            self.tracing, job_id, self.record, self.workflow, self.ingress, self.answered,
            self.error,
        )  # fmt: skip


def assemble(
    tracing: JobTracing,
    job_id: str,
    record: Mapping[str, Any],
    workflow: Workflow | None,
    ingress: str,
    answered: float,
    error: str,
) -> dict[str, Any]:
    """The JSON form of :class:`compass.trace.JobTrace` of an answered job."""
    attempt = int(record.get("attempts", 1)) - 1
    final_plan: Mapping[str, str] = record.get("plan") or {}
    planned = tracing.planned if tracing.attempt == attempt else final_plan
    spans = sorted(tracing.spans.values(), key=lambda s: (s["att"], s["start"], s["task"]))
    tasks = [
        {
            "task": s["task"],
            "worker": s["worker"],
            "planned_worker": planned.get(s["task"], s["worker"]),
            "queued_ms": (s["start"] - s["queued"]) * 1000.0,
            "transfer_ms": s["transfer_s"] * 1000.0,
            "load_ms": s["load_s"] * 1000.0,
            "cache_hit": s["hit"],
            "exec_ms": s["exec_s"] * 1000.0,
            "batch": s["batch"],
            "mates": s["mates"],
            "start": s["start"],
            "end": s["end"],
            "attempt": s["att"],
            "model": s["model"],
            "lane": s["lane"],
            "error": s["error"],
            "cause": s["cause"],
            **_steps_ms(s),
        }
        for s in spans
    ]
    received = tracing.received
    planned_at = tracing.planned_at or received
    final = {s["task"]: s for s in spans if s["att"] == attempt}
    path = critical_path(workflow, final) if workflow is not None else []
    # a root at the ingress is queued, and its model load begun, while the job is still being
    # planned (the core does both in one step): each part counts from the plan on, or
    # planning would count twice
    since = planned_at
    transfer = queue = load = run = 0.0
    for name in path:
        s = final[name]
        queued, start, end = s["queued"], s["start"], s["end"]
        transfer += max(0.0, queued - max(queued - s["transfer_s"], since))
        queue += max(0.0, start - max(queued, since)) + s.get("suspended_s", 0.0)
        load += max(0.0, start + s["load_s"] - max(start, since))
        run += max(0.0, end - max(end - s["exec_s"], since))
    result = answered - final[path[-1]]["end"] if path else 0.0
    latency = answered - received
    planning = planned_at - received
    other = latency - (planning + transfer + queue + load + run + result)
    breakdown = {
        "client": 0.0,
        "import": 0.0,  # the client's, as client (compass.trace.seen_by_client)
        "planning": planning * 1000.0,
        "transfer": transfer * 1000.0,
        "queue": queue * 1000.0,
        "load": load * 1000.0,
        "exec": run * 1000.0,
        "result": result * 1000.0,
        "other": other * 1000.0,
    }
    trace = {
        "job": job_id,
        "workflow": str(record.get("workflow", "")),
        "latency_ms": latency * 1000.0,
        "tasks": tasks,
        "ingress": ingress,
        "start": received,
        "end": answered,
        "ok": bool(record.get("ok", not error)),
        "error": error,
        "attempts": attempt + 1,
        "retries": 0,
        "trace_id": f"{tracing.parent.trace_id:032x}",
        "breakdown_ms": breakdown,
        "critical_path": path,
    }
    if tracing.first_output:  # a streamed job's: its time to first output
        trace["first_output_ms"] = (tracing.first_output - received) * 1000.0
    return trace


def _steps_ms(span: Mapping[str, Any]) -> dict[str, Any]:
    """A step-wise task's steps in its trace (nothing for a plain task's span)."""
    steps = span.get("steps", 0)
    if not steps:
        return {}
    out = {"steps": steps, "first_step_ms": span["first_s"] * 1000.0,
           "waited_ms": span["waited_s"] * 1000.0}  # fmt: skip
    if suspended := span.get("suspended_s", 0.0):  # only a task that was suspended says so
        out["suspended_ms"] = suspended * 1000.0
    return out


def critical_path(workflow: Workflow, spans: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The tasks a job's latency went through: from the sink that ended last, back through
    the predecessor that ended last (the input its task waited for), to a root."""
    sinks = [s for s in workflow.sinks if s in spans]
    if not sinks:
        return []
    task = max(sinks, key=lambda t: spans[t]["end"])
    path = [task]
    while True:
        preds = [p for p in workflow.preds(task) if p in spans]
        if not preds:
            return path[::-1]
        task = max(preds, key=lambda t: spans[t]["end"])
        path.append(task)
