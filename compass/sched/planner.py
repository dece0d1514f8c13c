"""Compass planning: place a whole job at its ingress, then adjust as tasks finish.

The planner follows the paper (arXiv 2402.17652, section "Scheduling"): tasks in HEFT
upward-rank order; for each task and each worker ``w``::

    arrive(w) = max over predecessors p of finish(p) + transfer(out_p, worker(p) -> w)
                (a root: the job input's transfer from the ingress)
    fetch(w)  = h2d time of the task's model unless resident, loading, or brought to w by an
                earlier task of this plan; doubled when w's free cache bytes are fewer than the
                model's (the eviction penalty); infinite where the model exceeds w's cache
    start(w)  = max(now + wait(w), arrive(w)) + fetch(w);   finish(w) = start(w) + exec(w)

and the task goes to the smallest finish (ties: fewest bytes to move, then the ingress, then the
lowest index), after which that worker's availability becomes the finish and its free bytes
shrink by what was fetched. Each step is a handful of numpy operations over all workers.

:class:`CompassPolicy` also implements the ablations (no cache term, no load term, no
adjustment), classic HEFT and the ``central`` variant, all by flags on the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError, ModelTooLarge, WorkerUnavailable
from compass.sched.cost import CostCache, WorkflowCosts
from compass.sched.view import ClusterView, ViewSnapshot
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["CompassPolicy", "JobInfo", "Policy", "plan_eft", "record_plan"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]

#: finish times closer than this are a tie (seconds; far below any real task or transfer)
TIE_S = 1e-9


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the planner knows of a job: its id, workflow, ingress worker and input size.

    ``input_bytes`` is the size of the job's inputs, which every root task receives from the
    ingress; 0 means unknown, and the root's declared ``input_bytes`` stands in.
    """

    job_id: str
    workflow: Workflow
    ingress: str
    input_bytes: int


class Policy(Protocol):
    """A placement policy. Every method returns workers that exist in ``view``."""

    name: str
    #: whether :meth:`adjust` may move tasks away from their planned worker
    dynamic: bool

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """Task -> worker for every task of ``job``, at its ingress."""
        ...

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """The worker for successor ``task``, decided when one of its predecessors finishes,
        on the worker where it finished, before that output is sent. ``plan`` is the job's
        current plan (with earlier moves recorded)."""
        ...

    def planner(self, view: ViewSnapshot) -> str | None:
        """The one worker that must plan every job, or None when the ingress plans."""
        ...


def plan_eft(
    job: JobInfo,
    view: ViewSnapshot,
    costs: WorkflowCosts,
    now: float,
    *,
    use_load: bool = True,
    use_cache: bool = True,
) -> dict[str, str]:
    """Place every task of ``job`` at its earliest estimated finish (see the module docstring).

    ``use_load=False`` treats every worker as idle at ``now``; ``use_cache=False`` drops the
    model fetch term. Raises :class:`WorkerUnavailable` on an empty view and
    :class:`ModelTooLarge` when a model fits in no worker's cache.
    """
    n_workers = len(view.names)
    if n_workers == 0:
        raise WorkerUnavailable(f"no workers in the view to plan job {job.job_id!r} on")
    n_tasks = len(costs.preds)
    avail = view.wait_s + now if use_load else np.full(n_workers, now)
    free = view.free_bytes
    free_is_mine = False
    brought: dict[str, BoolArray] = {}
    placed = [0] * n_tasks
    finish = [0.0] * n_tasks
    ingress = view.positions.get(job.ingress, -1)
    check_capacity = use_cache and costs.max_model_bytes > view.min_capacity_bytes
    row = costs.transfer.row
    preds_of = costs.preds
    out_bytes = costs.out_bytes

    for t in costs.rank_order:
        preds = preds_of[t]
        if preds:
            p = preds[0]
            arrive = row(placed[p], out_bytes[p], finish[p])
            for p in preds[1:]:
                np.maximum(arrive, row(placed[p], out_bytes[p], finish[p]), out=arrive)
            root_bytes = 0
        else:
            root_bytes = job.input_bytes or costs.input_bytes[t]
            arrive = row(ingress, root_bytes, now)
        np.maximum(arrive, avail, out=arrive)
        model = costs.models[t]
        have: BoolArray | None = None
        size = costs.model_bytes[t]
        if use_cache and model is not None:
            have = brought.get(model)
            if have is None:
                have = view.holds(model)
            fetch1 = costs.fetch_rows[t]
            fetch2 = costs.fetch2_rows[t]
            assert fetch1 is not None
            assert fetch2 is not None
            fetch = np.where(have, 0.0, np.where(free < size, fetch2, fetch1))
            if check_capacity and size > view.min_capacity_bytes:
                fetch[view.capacity_bytes < size] = np.inf
            arrive += fetch
        arrive += costs.exec_rows[t]
        j = int(arrive.argmin())
        best = float(arrive[j])
        if best == math.inf:
            raise ModelTooLarge(
                f"job {job.job_id!r}: model {model!r} of task {job.workflow.order[t]!r} "
                f"({size} B) fits in no worker's cache "
                f"(largest: {int(view.capacity_bytes.max())} B)",
                detail={"model": model, "bytes": size},
            )
        ties = np.flatnonzero(arrive <= best + TIE_S)
        if len(ties) > 1:
            sources = [placed[p] for p in preds]
            j = _fewest_bytes(ties, costs, t, sources, ingress, root_bytes, have, ingress)
        placed[t] = j
        finish[t] = float(arrive[j])
        avail[j] = finish[t]
        if have is not None and not have[j]:
            assert model is not None
            mine = have.copy()
            mine[j] = True
            brought[model] = mine
            if not free_is_mine:
                free = free.copy()
                free_is_mine = True
            free[j] -= size

    names = view.names
    order = job.workflow.order
    return {order[t]: names[placed[t]] for t in range(n_tasks)}


def _fewest_bytes(
    ties: IntpArray,
    costs: WorkflowCosts,
    t: int,
    sources: list[int],
    ingress: int,
    root_bytes: int,
    have: BoolArray | None,
    prefer: int,
) -> int:
    """Among tied workers, the one moving the fewest bytes (inputs plus a model fetch); then
    ``prefer`` if it is among them; then the lowest index."""
    moved = np.zeros(len(ties))
    preds = costs.preds[t]
    if preds:
        for p, src in zip(preds, sources, strict=True):
            moved += costs.out_bytes[p] * (ties != src)
    elif root_bytes:
        moved += float(root_bytes) * (ties != ingress)
    if have is not None:
        moved += float(costs.model_bytes[t]) * ~have[ties]
    keep = ties[moved <= moved.min()]
    if prefer >= 0 and bool((keep == prefer).any()):
        return prefer
    return int(keep[0])


class CompassPolicy:
    """The paper's planner and dynamic adjustment, with switches for the ablations.

    ``use_load``: count queue waits (off: every worker idle); ``use_cache``: count model
    fetches; ``dynamic``: let :meth:`adjust` move tasks; ``central``: one fixed worker (the
    lowest name) plans every job.

    Adjustment, on the worker where a predecessor finished: keep the planned worker when the
    successor is a join (its inputs must meet), or when that worker's wait is at most
    ``adjust_threshold`` x the successor's expected execution time; otherwise move it to the
    worker where it would finish first, ``max(wait, input transfer) + fetch + exec``. The
    paper's rule is the smallest ``wait + fetch``; counting the transfer of the finished
    output from this worker (and the execution time, for unequal GPUs) is our addition, so a
    3 MB output does not chase a queue a few microseconds shorter across a slow network.
    """

    def __init__(
        self,
        name: str = "compass",
        *,
        use_load: bool = True,
        use_cache: bool = True,
        dynamic: bool = True,
        adjust_threshold: float = 1.5,
        central: bool = False,
    ) -> None:
        if not isinstance(adjust_threshold, int | float) or not adjust_threshold > 0:
            raise ConfigError(f"adjust_threshold must be > 0, got {adjust_threshold!r}")
        self.name = name
        self.use_load = use_load
        self.use_cache = use_cache
        self.dynamic = dynamic
        self.adjust_threshold = float(adjust_threshold)
        self.central = central
        self._costs = CostCache()

    def __repr__(self) -> str:
        return f"CompassPolicy({self.name!r})"

    def costs(self, workflow: Workflow, profiles: Profiles, view: ViewSnapshot) -> WorkflowCosts:
        """The (cached) cost table of ``workflow`` over ``view``'s workers."""
        return self._costs.get(workflow, profiles, view.names)

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`Policy`."""
        costs = self._costs.get(job.workflow, profiles, view.names)
        return plan_eft(job, view, costs, now, use_load=self.use_load, use_cache=self.use_cache)

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """See :class:`Policy` and the class docstring."""
        wf = job.workflow
        profiles.add_workflow(wf)  # this worker may not have planned a job of it yet
        planned = plan.get(task)
        i = -1 if planned is None else view.positions.get(planned, -1)
        if i >= 0:
            assert planned is not None
            if not self.dynamic or not self.use_load or wf.is_join(task):
                return planned
            if float(view.wait_s[i]) <= self.adjust_threshold * profiles.exec_s(
                wf.name, task, planned
            ):
                return planned
        return self.best_worker(job, task, plan, view, profiles, prefer=i)

    def best_worker(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        *,
        prefer: int = -1,
    ) -> str:
        """Where ``task`` would finish first given its inputs' current workers in ``plan``
        (ties: ``prefer``, then fewest bytes moved, then the lowest index)."""
        if not view.names:
            raise WorkerUnavailable(f"no workers in the view to place task {task!r} on")
        costs = self._costs.get(job.workflow, profiles, view.names)
        t = job.workflow.index[task]
        row = costs.transfer.row
        preds = costs.preds[t]
        order = job.workflow.order
        sources = [view.positions.get(plan.get(order[p], ""), -1) for p in preds]
        ingress = view.positions.get(job.ingress, -1)
        root_bytes = 0
        if preds:
            start = row(sources[0], costs.out_bytes[preds[0]], 0.0)
            for p, src in zip(preds[1:], sources[1:], strict=True):
                np.maximum(start, row(src, costs.out_bytes[p], 0.0), out=start)
        else:
            root_bytes = job.input_bytes or costs.input_bytes[t]
            start = row(ingress, root_bytes, 0.0)
        if self.use_load:
            np.maximum(start, view.wait_s, out=start)
        have: BoolArray | None = None
        model = costs.models[t]
        if self.use_cache and model is not None:
            size = costs.model_bytes[t]
            have = view.holds(model)
            fetch1, fetch2 = costs.fetch_rows[t], costs.fetch2_rows[t]
            assert fetch1 is not None
            assert fetch2 is not None
            fetch = np.where(have, 0.0, np.where(view.free_bytes < size, fetch2, fetch1))
            fetch[view.capacity_bytes < size] = np.inf
            start += fetch
        start += costs.exec_rows[t]
        j = int(start.argmin())
        best = float(start[j])
        if best == math.inf:
            raise ModelTooLarge(
                f"job {job.job_id!r}: model {model!r} of task {task!r} fits in no worker's cache",
                detail={"model": model},
            )
        if prefer >= 0 and float(start[prefer]) <= best + TIE_S:
            return view.names[prefer]
        ties = np.flatnonzero(start <= best + TIE_S)
        if len(ties) > 1:
            finisher = next((s for s in sources if s >= 0), ingress)
            j = _fewest_bytes(ties, costs, t, sources, ingress, root_bytes, have, finisher)
        return view.names[j]

    def planner(self, view: ViewSnapshot) -> str | None:
        """The lowest-named worker for ``central``; None (the ingress plans) otherwise."""
        if self.central and view.names:
            return view.names[0]
        return None


def record_plan(
    view: ClusterView, job: JobInfo, plan: Mapping[str, str], profiles: Profiles, now: float
) -> None:
    """Count every task of a fresh plan in its worker's wait (:meth:`ClusterView.note_placement`),
    so the next job planned before the next heartbeats does not pile onto the same workers."""
    wf = job.workflow
    profiles.add_workflow(wf)
    for task, worker in plan.items():
        model = wf.tasks[task].model
        size = 0 if model is None else profiles.model_bytes(model)
        view.note_placement(worker, profiles.exec_s(wf.name, task, worker), model, size, now)
