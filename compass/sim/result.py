"""What a simulation run produced: per-job and per-task records, per-worker totals, a summary.

:meth:`SimResult.summary` has the keys the end-to-end benchmark of the real cluster reports, so
a simulated and a measured run can be compared line by line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.records import record

__all__ = ["JobRecord", "SimResult", "TaskRecord"]


# made for every job and task: records, frozen by convention (:mod:`compass.records`)
@record
class JobRecord:
    """One job. ``finish``, ``latency_s`` and ``slowdown`` are None for a failed job.

    ``slowdown`` is the latency over the workflow's best execution time; ``plan`` is where each
    task actually ran (the ingress plan with every dynamic move applied).
    """

    id: str
    workflow: str
    client: int
    arrival: float
    finish: float | None
    latency_s: float | None
    slowdown: float | None
    plan: Mapping[str, str]
    error: str = ""
    #: the job's priority and deadline (seconds from its arrival; None: none)
    priority: int = 0
    deadline_s: float | None = None
    #: "ok", "failed", or, for a job with a deadline, "unreachable" (refused at its ingress),
    #: "dropped" (a task started too late) or "late" (finished past it, with
    #: ``on_miss="drop"``: answered DeadlineExceeded, its latency kept)
    outcome: str = "ok"
    #: arrival to its first output at its ingress: a step-wise sink's first step, one hop
    #: later; the whole job otherwise (None for a failed job)
    ttfo_s: float | None = None

    @property
    def met(self) -> bool:
        """Answered, and within its deadline (a job without one: answered)."""
        if self.latency_s is None:
            return False
        return self.deadline_s is None or self.latency_s <= self.deadline_s


@record
class TaskRecord:
    """One task run: where, and where its time went (seconds).

    ``queue_s``: ready to popped by a lane; ``fetch_s``: waiting for its model (0 on a hit);
    ``transfer_s``: the slowest of its inputs on the wire; ``cache_hit``: None for a task
    without a model; ``batch``: how many tasks its run took (1: it ran alone). A step-wise
    task suspended at a step boundary has a record for each of its runs: its first's
    ``queue_s`` is its wait before its first step, a later one's ``suspended_s`` its wait
    from its suspension to that run (the other 0), so a task's records add up to its whole
    wait (:meth:`QueuedTask.run_waits <compass.core.queue.QueuedTask.run_waits>`).
    """

    job_id: str
    task: str
    worker: str
    queue_s: float
    fetch_s: float
    transfer_s: float
    exec_s: float
    cache_hit: bool | None
    batch: int = 1
    suspended_s: float = 0.0


@dataclass(slots=True)
class SimResult:
    """Everything one :func:`~compass.sim.engine.simulate` run measured.

    ``busy_s`` is lane-seconds each worker spent on tasks (fetching their model or running);
    ``horizon_s`` is the virtual time of the last event. ``events`` counts simulator events.
    With a bounded view, ``scoped_views`` counts the snapshots taken for a job and
    ``scoped_workers`` the workers they showed in all (both 0 with the mesh); and the
    messages its real workers would send (:mod:`compass.sim.traffic`, all 0 with the mesh):
    ``view_asks`` watch asks, ``view_pushes`` states pushed to watchers, ``cache_changes``
    rumors started of a changed cache.
    """

    policy: str
    workers: tuple[str, ...]
    lanes: int
    jobs: list[JobRecord]
    tasks: list[TaskRecord]
    busy_s: dict[str, float]
    horizon_s: float
    model_bytes_loaded: int
    loads: int
    prefetches: int
    evictions: int
    moves: int
    events: int
    wall_s: float
    scoped_views: int = 0
    scoped_workers: int = 0
    view_asks: int = 0
    view_pushes: int = 0
    cache_changes: int = 0
    #: copies of hot models begun ahead of need (``SimSettings.replicate``)
    replicas: int = 0

    def utilization(self) -> dict[str, float]:
        """Fraction of the run each worker's lanes were busy."""
        span = self.horizon_s * self.lanes
        return {w: (b / span if span > 0 else 0.0) for w, b in self.busy_s.items()}

    def summary(self) -> dict[str, Any]:
        """The benchmark's keys: completed, failed, p50/p95/p99_ms, ttfo_p50/p99_ms (time to
        first output), median and mean slowdown,
        cache_hit_rate, model_gb_loaded, utilization, breakdown_ms (mean per task) and
        slowdown_by_workflow (median). Statistics of an empty set are None."""
        done = [j for j in self.jobs if j.latency_s is not None]
        latency_ms = np.array([j.latency_s for j in done], dtype=np.float64) * 1000.0
        ttfo_ms = np.array([j.ttfo_s for j in done], dtype=np.float64) * 1000.0
        slowdown = np.array([j.slowdown for j in done], dtype=np.float64)
        with_model = [t.cache_hit for t in self.tasks if t.cache_hit is not None]
        by_workflow: dict[str, list[float]] = {}
        for j in done:
            assert j.slowdown is not None
            by_workflow.setdefault(j.workflow, []).append(j.slowdown)
        n_tasks = len(self.tasks)

        def mean_ms(values: list[float]) -> float | None:
            return float(np.mean(values)) * 1000.0 if values else None

        return {
            "completed": len(done),
            "failed": len(self.jobs) - len(done),
            "p50_ms": _stat(np.percentile, latency_ms, 50),
            "p95_ms": _stat(np.percentile, latency_ms, 95),
            "p99_ms": _stat(np.percentile, latency_ms, 99),
            "ttfo_p50_ms": _stat(np.percentile, ttfo_ms, 50),
            "ttfo_p99_ms": _stat(np.percentile, ttfo_ms, 99),
            "median_slowdown": _stat(np.median, slowdown),
            "mean_slowdown": _stat(np.mean, slowdown),
            "cache_hit_rate": (sum(with_model) / len(with_model)) if with_model else None,
            "model_gb_loaded": self.model_bytes_loaded / 1e9,
            "utilization": self.utilization(),
            "breakdown_ms": {
                # waiting for a lane in all: before the first step, and suspended
                "queue": mean_ms([t.queue_s + t.suspended_s for t in self.tasks])
                if n_tasks
                else None,
                "fetch": mean_ms([t.fetch_s for t in self.tasks]) if n_tasks else None,
                "transfer": mean_ms([t.transfer_s for t in self.tasks]) if n_tasks else None,
                "exec": mean_ms([t.exec_s for t in self.tasks]) if n_tasks else None,
            },
            "slowdown_by_workflow": {
                wf: float(np.median(values)) for wf, values in sorted(by_workflow.items())
            },
        }


def _stat(fn: Any, values: np.ndarray[Any, Any], *args: Any) -> float | None:
    return float(fn(values, *args)) if len(values) else None
