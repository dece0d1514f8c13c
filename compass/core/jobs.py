"""Job bookkeeping, sans-IO: what an ingress remembers of its jobs, and the inbox where a
worker gathers a task's inputs until all of them have arrived (a join waits for every
predecessor).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from compass.core.messages import JOB_INPUTS, FailedMsg, TaskMsg
from compass.errors import CompassError, JobFailed, ProtocolError, WorkersLost, error_from_wire
from compass.objective import NO_OBJECTIVE, Objective
from compass.workflow.dag import Workflow

__all__ = [
    "INBOX_KEEP_S",
    "JOB_INPUTS",
    "Inbox",
    "InboxEntry",
    "IngressJob",
    "JobIds",
    "check_task",
]


class JobIds:
    """The ids of the jobs one worker process takes in: unique in the cluster (worker names
    are) and across restarts under the same name (the process's ``instance`` is in each: the
    count starts again at 1, and peers remember the ids of the last instance's jobs). The
    ingress names a job before its core hears of it (:class:`~compass.core.events.Submit`
    carries the id), so the count is the adapter's (or the simulator's), not the core's."""

    __slots__ = ("_count", "_prefix")

    def __init__(self, name: str, instance: str = "") -> None:
        self._prefix = f"{name}-{instance}-" if instance else f"{name}-"
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count)}"


@dataclass(slots=True)
class IngressJob:
    """A job as its ingress tracks it until it is answered exactly once."""

    job_id: str
    workflow: Workflow
    inputs: dict[str, Any]
    input_bytes: int
    submitted_at: float
    #: wall-clock submit time; travels with every push so that any worker can rank the job's
    #: tasks by job age (oldest job first)
    t0: float = 0.0
    attempt: int = 0
    #: attempts planned again because a worker could not take or pass on a task (bounded)
    refused: int = 0
    #: task -> worker, kept current as workers report moves
    plan: dict[str, str] = field(default_factory=dict)
    #: sink task -> output, for workflows with several sinks
    outputs: dict[str, Any] = field(default_factory=dict)
    #: the client's name for the job (resubmissions of it attach here)
    key: str | None = None
    #: ids of later requests with the same key, answered with this job
    waiters: list[str] = field(default_factory=list)
    #: the request that submitted it stopped waiting (a waiter still does)
    abandoned: bool = False
    #: what it asks for; ``deadline`` is absolute, on the ingress's clock (None: none)
    objective: Objective = NO_OBJECTIVE
    deadline: float | None = None
    #: its caller reads its sinks' partial outputs as they are made
    stream: bool = False
    #: decision task -> the choice it made (a workflow decided at run time), as reported
    choices: dict[str, str] = field(default_factory=dict)

    def involves(self, worker: str) -> bool:
        return worker in self.plan.values()

    def workers(self) -> set[str]:
        return set(self.plan.values())

    def record(self, now: float, *, ok: bool) -> dict[str, Any]:
        """What the ingress keeps of the job answered at ``now`` (its answer record); of a
        workflow decided at run time, also the choices its decision tasks made (``choices``:
        task -> label; ``taken``: the same in words, :meth:`Unfolding.summary
        <compass.workflow.choices.Unfolding.summary>`) and the tasks it skipped."""
        record: dict[str, Any] = {
            "job": self.job_id,
            "workflow": self.workflow.name,
            "plan": dict(self.plan),
            "attempts": self.attempt + 1,
            "key": self.key,  # the client's name for the job: a job run twice shows twice
            "priority": self.objective.priority,
            # seconds the job had from its submission (None: no deadline)
            "deadline_s": None if self.deadline is None else self.deadline - self.submitted_at,
            "ok": ok,
            "latency_s": now - self.submitted_at,
        }
        unfolding = self.workflow.unfold
        if unfolding is not None:  # a workflow decided at run time: what this job took
            record["choices"] = dict(self.choices)
            record["taken"] = unfolding.summary(self.choices)
            record["skipped"] = list(unfolding.skipped_by(self.choices))
        return record


@dataclass(slots=True)
class InboxEntry:
    workflow: str
    needed: frozenset[str]
    plan: dict[str, str]
    ingress: str
    inputs: dict[str, Any] = field(default_factory=dict)
    arrived: set[str] = field(default_factory=set)
    transfer_s: float = 0.0
    first_at: float = 0.0


#: real seconds a task's inputs wait on a worker for the rest, before the job is failed (a
#: lost output, or an end that never came: :meth:`Inbox.expire`); jobs with deadlines end sooner
INBOX_KEEP_S = 600.0

#: what a root task needs: the job's inputs
_ROOT_INPUTS = frozenset({JOB_INPUTS})


class Inbox:
    """Inputs of tasks whose predecessors have not all reported yet, keyed by job, attempt, task."""

    def __init__(self, keep_s: float = math.inf) -> None:
        #: how long an entry waits for the rest of its inputs (:meth:`expire`)
        self.keep_s = keep_s
        # in the order they were made, which is the order of their ``first_at``
        self._entries: dict[tuple[str, int, str], InboxEntry] = {}
        #: job id -> how many entries it has here (jobs with none are removed), so that a
        #: job's end looks through the entries only when it has some
        self._jobs: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self, msg: TaskMsg, workflow: Workflow, *, transfer_s: float, now: float
    ) -> InboxEntry | None:
        """Record the input ``msg`` carries (for its task of ``workflow``, which it names);
        return the complete entry once every input is here, else ``None``.

        ``msg.source`` is a predecessor's name, or :data:`JOB_INPUTS` for a root task, whose
        value is the mapping of job inputs. A repeated input (a retransmission) replaces the
        earlier one.
        """
        key = (msg.job, msg.attempt, msg.task)
        source = msg.source
        entry = self._entries.get(key)
        stored = entry is not None
        if entry is None:
            # stored only if it waits for more: a task of one input (most are) is whole with
            # its first, so it never is
            preds = workflow.preds(msg.task)
            entry = InboxEntry(
                workflow=workflow.name,
                needed=frozenset(preds) if preds else _ROOT_INPUTS,
                plan=msg.plan,
                ingress=msg.ingress,
                first_at=now,
            )
        else:
            # later pushes may carry fresher placements of tasks further down the DAG
            entry.plan.update(msg.plan)
        if source in entry.needed:
            if source == JOB_INPUTS:
                entry.inputs.update(msg.value)
            else:
                entry.inputs[source] = msg.value
            entry.arrived.add(source)
            entry.transfer_s = max(entry.transfer_s, transfer_s)
            if entry.arrived >= entry.needed:
                if stored:
                    self._remove(key)
                return entry
        if not stored:
            self._entries[key] = entry
            self._jobs[key[0]] = self._jobs.get(key[0], 0) + 1
        return None

    def _remove(self, key: tuple[str, int, str]) -> None:
        del self._entries[key]
        left = self._jobs[key[0]] - 1
        if left:
            self._jobs[key[0]] = left
        else:
            del self._jobs[key[0]]

    def expire(self, now: float) -> list[tuple[tuple[str, int, str], InboxEntry]]:
        """Drop the entries that waited over :attr:`keep_s` for the rest of their inputs (a
        predecessor whose output never came: its worker lost it, or the job's end never reached
        this worker), oldest first; return them, keyed by job, attempt and task. Entries are
        kept in the order they were made, so this looks at the expired ones and one more."""
        expired = []
        before = now - self.keep_s
        for key, entry in self._entries.items():
            if entry.first_at >= before:
                break
            expired.append((key, entry))
        for key, _ in expired:
            self._remove(key)
        return expired

    def drop_ingress(self, ingress: str) -> dict[str, tuple[int, str]]:
        """Drop the inputs of every job whose ingress is ``ingress``; return those jobs, each
        with its highest attempt here and a task of that attempt."""
        stale = [key for key, entry in self._entries.items() if entry.ingress == ingress]
        dropped: dict[str, tuple[int, str]] = {}
        for key in stale:
            self._remove(key)
            job, attempt, task = key
            dropped[job] = max(dropped.get(job, (attempt, task)), (attempt, task))
        return dropped

    def drop_job(self, job_id: str, below_attempt: int | None = None) -> int:
        if job_id not in self._jobs:
            return 0  # what the look through the entries would find
        stale = [
            key
            for key in self._entries
            if key[0] == job_id and (below_attempt is None or key[1] < below_attempt)
        ]
        for key in stale:
            self._remove(key)
        return len(stale)


def failure_of(job: IngressJob, msg: FailedMsg, *, refused: bool) -> CompassError:
    """The error ``job`` is answered with when its task failed (``msg``): :class:`JobFailed`
    naming the task, its worker and traceback; a typed failure (a timeout, a model too large)
    keeps its type for the client, and ``refused`` (a worker refused it too often) says so
    (:class:`WorkersLost`), not that this ingress goes away."""
    detail = {
        "job_id": job.job_id,
        "workflow": job.workflow.name,
        "task": msg.task,
        "worker": msg.worker,
        "code": msg.code,
        "traceback": msg.traceback,
    }
    text = (
        f"task {msg.task!r} of workflow {job.workflow.name!r} failed on {msg.worker}: {msg.message}"
    )
    if msg.code in (JobFailed.code, ProtocolError.code):
        return JobFailed(text, detail=detail)
    return error_from_wire(WorkersLost.code if refused else msg.code, text, detail)


def check_task(workflow: Workflow, msg: TaskMsg) -> None:
    """A task message must name a task of its workflow, one of its inputs, and a plan
    that places it and its successors: anything else would fail later, far from its
    cause."""
    if msg.task not in workflow.tasks:
        raise ProtocolError(f"workflow {workflow.name!r} has no task {msg.task!r}")
    preds = workflow.preds(msg.task)
    if msg.source not in preds and not (msg.source == JOB_INPUTS and not preds):
        raise ProtocolError(f"task {msg.task!r} takes no input from {msg.source!r}")
    if msg.source == JOB_INPUTS and not isinstance(msg.value, dict):
        raise ProtocolError(f"the job inputs of root task {msg.task!r} are not a mapping")
    # the entries this task's run will use: where it runs and where its output goes
    needed = (msg.task, *workflow.succs(msg.task))
    missing = [t for t in needed if not isinstance(msg.plan.get(t), str)]
    if missing:
        raise ProtocolError(f"the plan places no worker for {', '.join(missing)}")
