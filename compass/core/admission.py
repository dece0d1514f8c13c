"""What an ingress refuses, and how it says so: a job whose inputs are larger than it takes for
one job, a job past what it holds of all (jobs in flight, bytes of their inputs), a job whose
best plan already misses its deadline, and, with learned admission, a job of a kind too many of
which were dropped after they were admitted (:class:`AdmittedShare`). Pure: the worker core
counts and answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compass.core.jobs import IngressJob
from compass.errors import CompassError, DeadlineUnreachable, JobTooLarge, Overloaded
from compass.workflow.dag import Workflow

__all__ = ["DROPS_TARGET", "Admission", "AdmittedShare", "unreachable", "work_before"]

MiB = 1 << 20

#: learned admission: the share of the work of the admitted jobs of a kind that may be lost to
#: jobs dropped on the way (or answered late) before the ingress admits fewer of that kind
#: (docs/RESULTS.md, "Admission that learns what its jobs suffer")
DROPS_TARGET = 0.1
#: how far one outcome moves a kind's admitted share (a job dropped after all its work ran
#: takes it down by this much)
SHARE_STEP = 0.05
#: the least share of a kind admitted: some of its jobs always run, so its share can recover
MIN_SHARE = 0.05
#: kinds (workflow, priority) remembered at most (past it, all are forgotten at once)
KINDS_KEPT = 1024


@dataclass(frozen=True, slots=True)
class Admission:
    """Worker ``worker``'s limits as an ingress: ``max_jobs`` in flight, ``max_job_bytes`` of
    one job's inputs (within what one frame carries: :attr:`WorkerConfig.job_bytes
    <compass.config.WorkerConfig.job_bytes>`), and ``max_held_bytes`` of all its jobs' inputs
    together."""

    worker: str
    max_jobs: int
    max_job_bytes: int
    max_held_bytes: int

    def refusal(
        self, job_id: str, input_bytes: int, *, in_flight: int, held_bytes: int
    ) -> CompassError | None:
        """Why job ``job_id`` of ``input_bytes`` is refused while ``in_flight`` jobs hold
        ``held_bytes``; None: it is taken."""
        if input_bytes > self.max_job_bytes:
            return JobTooLarge(
                f"job {job_id}: its inputs take {input_bytes} bytes, more than worker "
                f"{self.worker} takes for one job (its --max-job-mb is "
                f"{self.max_job_bytes / MiB:g} MiB); send smaller inputs or raise the limit",
                detail={
                    "job_id": job_id,
                    "input_bytes": input_bytes,
                    "max_job_bytes": self.max_job_bytes,
                },
            )
        if in_flight >= self.max_jobs or held_bytes + input_bytes > self.max_held_bytes:
            return Overloaded(
                f"worker {self.worker} already holds {in_flight} jobs in flight with "
                f"{held_bytes} bytes of inputs (its --max-jobs is {self.max_jobs}, its "
                f"--max-held-mb {self.max_held_bytes / MiB:g} MiB); retry later or submit to "
                "another worker",
                detail={
                    "job_id": job_id,
                    "jobs_in_flight": in_flight,
                    "max_jobs": self.max_jobs,
                    "held_bytes": held_bytes,
                    "input_bytes": input_bytes,
                    "max_held_bytes": self.max_held_bytes,
                },
            )
        return None


def unreachable(job: IngressJob, finish: float) -> DeadlineUnreachable | None:
    """Why ``job``, whose best plan finishes at ``finish``, is refused (its deadline is
    before); None: it can make it."""
    assert job.deadline is not None
    if finish <= job.deadline:
        return None
    deadline_ms = (job.deadline - job.submitted_at) * 1000
    estimate_ms = (finish - job.submitted_at) * 1000
    return DeadlineUnreachable(
        f"job {job.job_id} ({job.workflow.name}) cannot meet its deadline of "
        f"{deadline_ms:.1f} ms: its best plan finishes in {estimate_ms:.1f} ms",
        detail={"job_id": job.job_id, "deadline_ms": deadline_ms, "estimate_ms": estimate_ms},
    )


class AdmittedShare:
    """Learned admission: the share of each kind of job (its workflow and priority) an ingress
    admits, learned from what became of the jobs of that kind it admitted.

    A job's plan estimate sees the queues as they are when it arrives, not the work that will
    overtake it afterwards: a higher priority's jobs, and, in a queue ordered by deadline,
    later jobs whose deadlines come sooner. Past capacity most of the jobs admitted at the
    lowest priority are dropped on the way, after part of their work ran, and their estimates
    at admission do not tell them apart from the ones that make it (docs/RESULTS.md). What the
    ingress can learn is how much of the work of the jobs of a kind it admitted was lost: the
    share it admits falls by :data:`SHARE_STEP` times the share of a dropped job's work that
    had run (:func:`work_before`: a job dropped at its first task lost nothing; one answered
    late, all of it) and rises by ``SHARE_STEP * target / (1 - target)`` at each one answered
    in time, so it settles where about ``target`` of the admitted work is lost (an integral
    controller; where less is, it stays at 1 and admission is the plan's alone). The jobs
    admitted are spread evenly: a kind's credit grows by its share at each arrival and a job
    is admitted when it reaches 1. Deterministic (no randomness), bounded
    (:data:`KINDS_KEPT`)."""

    __slots__ = ("_credit", "_share", "target")

    def __init__(self, target: float = DROPS_TARGET) -> None:
        if not 0.0 < target < 1.0:
            raise ValueError(f"the share of admitted jobs dropped must be in (0, 1), got {target}")
        self.target = target
        #: kind -> the share of its jobs admitted (absent: all)
        self._share: dict[tuple[str, int], float] = {}
        #: kind -> its credit towards the next job admitted
        self._credit: dict[tuple[str, int], float] = {}

    def share(self, workflow: str, priority: int) -> float:
        """The share of ``workflow``'s jobs of ``priority`` admitted now."""
        return self._share.get((workflow, priority), 1.0)

    def admits(self, workflow: str, priority: int) -> bool:
        """Whether the next job of this kind is admitted (its plan makes its deadline)."""
        kind = (workflow, priority)
        share = self._share.get(kind)
        if share is None:
            return True
        credit = self._credit.get(kind, 1.0 - share) + share
        if credit < 1.0 - 1e-9:  # (a share's float drift must not skip a job)
            self._credit[kind] = credit
            return False
        self._credit[kind] = credit - 1.0
        return True

    def observe(self, workflow: str, priority: int, *, dropped: bool, lost: float = 1.0) -> None:
        """A job of this kind that was admitted was answered: in time, or ``dropped`` (its
        deadline missed on the way, or answered late) with the share ``lost`` of its work run
        (0: dropped before any ran, a lesson of nothing)."""
        kind = (workflow, priority)
        share = self._share.get(kind, 1.0)
        if dropped:
            if lost <= 0.0:
                return
            share = max(MIN_SHARE, share - SHARE_STEP * min(1.0, lost))
        else:
            share += SHARE_STEP * self.target / (1.0 - self.target)
        if share >= 1.0:
            self._share.pop(kind, None)
            self._credit.pop(kind, None)
            return
        if kind not in self._share and len(self._share) >= KINDS_KEPT:
            self._share.clear()  # kinds come and go with workflows: start afresh
            self._credit.clear()
        self._share[kind] = share

    def refusal(self, job: IngressJob) -> DeadlineUnreachable:
        """Why ``job`` is refused by its kind's share."""
        priority = job.objective.priority
        share = self.share(job.workflow.name, priority)
        deadline_s = (job.deadline or job.submitted_at) - job.submitted_at
        return DeadlineUnreachable(
            f"job {job.job_id} ({job.workflow.name}, priority {priority}) refused: of the jobs "
            f"of its workflow and priority this ingress admitted lately, more than "
            f"{self.target:.0%} were dropped before their deadline, so it admits "
            f"{share:.0%} of them now; retry later, raise its priority or its deadline",
            detail={"job_id": job.job_id, "deadline_ms": deadline_s * 1000, "share": share},
        )


def work_before(workflow: Workflow, task: str | None, exec_s: Callable[[str], float]) -> float:
    """The share of a job's work (its tasks' expected seconds, ``exec_s``) that ran before its
    task ``task`` was dropped: that of the tasks it waits for, directly or not. ``task`` None
    or not of ``workflow`` (the job was answered late): all of it."""
    if task is None or task not in workflow.tasks:
        return 1.0
    seen: set[str] = set()
    todo = list(workflow.preds(task))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(workflow.preds(name))
    total = sum(exec_s(t) for t in workflow.tasks)
    return sum(exec_s(t) for t in seen) / total if total > 0 else 0.0
