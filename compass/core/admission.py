"""What an ingress refuses, and how it says so: a job whose inputs are larger than it takes for
one job, a job past what it holds of all (jobs in flight, bytes of their inputs), a job whose
best plan already misses its deadline. Pure: the worker core counts and answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from compass.core.jobs import IngressJob
from compass.errors import CompassError, DeadlineUnreachable, JobTooLarge, Overloaded

__all__ = ["Admission", "unreachable"]

MiB = 1 << 20


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
