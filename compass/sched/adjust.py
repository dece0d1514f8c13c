"""Adjustment: a job's plan once one of its tasks finished, and counting a fresh plan.

When a task finishes, :func:`adjust_successors` re-places its successors one after another on
a view that counts the siblings already placed (each busy until the finish the policy expects
of it, so a fan-out does not pile onto one idle worker), and Compass also re-places a join
whose every input comes from those siblings: none of its inputs has been sent yet, so it can
still follow them. What that needs of a policy is part of
:class:`~compass.sched.policy.Policy`.

:func:`record_plan` counts a fresh plan's tasks in the view (a
:class:`~compass.sched.view.ClusterView`, or a worker core's view port), so the next job
planned before the next heartbeats does not pile onto the same workers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from compass.sched.cost import BatchRows
from compass.sched.placement import BatchCurve, Placement
from compass.sched.policy import JobInfo, Policy
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow, batch_key, batch_limit
from compass.workflow.profile import Profiles

__all__ = ["PlacementCounter", "adjust_successors", "batch_curve", "record_plan"]


@dataclass(frozen=True, slots=True)
class _Batchable:
    """A batchable sibling on its worker: its single run there and the largest batch worth
    forming."""

    exec_s: float
    limit: int


class _FanoutView:
    """The view the successors of one finished task are placed on: a snapshot plus the
    siblings placed so far, each busy on its worker until its expected finish and its model
    counted as coming there (and, for a batch-aware policy, leading the next batch of its model
    there, so a later sibling may join it).

    A sibling that joined a queued batch counts the same way, busy until the finish its join
    was ranked by: counting only its share of the batch measured worse (docs/RESULTS.md,
    "Batching")."""

    def __init__(self, view: ViewSnapshot) -> None:
        self.base = view
        self._wait = view.wait_s.copy()
        self._free = view.free_bytes.copy()
        self._resident = dict(view.resident)
        self._batches: dict[str, BatchRows] = dict(view.batches)
        self._own_batches: set[str] = set()
        self._current: ViewSnapshot | None = view

    def snapshot(self) -> ViewSnapshot:
        if self._current is None:
            batches = {
                m: (c.copy(), s.copy()) if m in self._own_batches else (c, s)
                for m, (c, s) in self._batches.items()
            }
            self._current = self.base.counted(
                self._wait.copy(), self._free.copy(), self._resident, batches
            )
        return self._current

    def place(
        self,
        i: int,
        busy_s: float,
        model: str | None,
        model_bytes: int,
        batch: _Batchable | None = None,
    ) -> None:
        """Count a task on worker ``i``'s queue that keeps it busy ``busy_s`` seconds from now
        (until the task's expected finish), and its model as coming there; ``batch``: it may
        batch there, so it leads the next batch of its model there, from its start (unless
        full batches wait ahead of it: they would take it)."""
        if model is not None:
            row = self._resident.get(model)
            if row is None or not row[i]:
                row = np.zeros(len(self.base.names), dtype=np.bool_) if row is None else row.copy()
                row[i] = True
                self._resident[model] = row
                self._free[i] = max(0, int(self._free[i]) - model_bytes)
            if batch is not None:
                rows = self._batches.get(model)
                if rows is None or int(rows[0][i]) < batch.limit:
                    counts, starts = self._own(model)
                    counts[i] = 1
                    starts[i] = max(0.0, busy_s - batch.exec_s)
        # a policy blind to load finishes a task "before" the queue it ignores empties; the
        # queue itself only grows
        self._wait[i] = max(float(self._wait[i]), busy_s)
        self._current = None

    def _own(self, model: str) -> BatchRows:
        rows = self._batches.get(model)
        if rows is None:
            n = len(self.base.names)
            rows = (np.zeros(n, dtype=np.int64), np.zeros(n))
        elif model not in self._own_batches:
            rows = (rows[0].copy(), rows[1].copy())
        self._own_batches.add(model)
        self._batches[model] = rows
        return rows


def adjust_successors(
    policy: Policy,
    job: JobInfo,
    finished: str,
    plan: Mapping[str, str],
    view: ViewSnapshot,
    profiles: Profiles,
    now: float,
) -> dict[str, str]:
    """The job's plan once task ``finished`` is done, before its output is pushed on.

    Each successor of ``finished`` is re-placed by ``policy.adjust`` (see
    :meth:`~compass.sched.policy.Policy.adjust`), highest upward rank first, on a view that
    counts the siblings placed before it, each busy until its
    :meth:`~compass.sched.policy.Policy.finish_times` on its worker (unless
    ``policy.counts_siblings`` is off: then all on ``view``); then ``policy.place_joins``
    re-places the joins those siblings alone feed
    (:meth:`~compass.sched.policy.Policy.joins_fed_by`). Returns the whole plan, with every
    change.
    """
    wf = job.workflow
    succs = wf.succs(finished)
    current = dict(plan)
    if not policy.dynamic or len(succs) < 2:
        # nothing to count between siblings, and a join needs two of them to be fed alone
        for task in succs:
            current[task] = policy.adjust(job, task, current, view, profiles, now)
        return current
    joins = policy.joins_fed_by(wf, finished)
    host_lanes = policy.host_lanes
    profiles.add_workflow(wf)
    ranks = wf.upward_rank(profiles.net_bytes_per_s)
    ordered = sorted(succs, key=lambda task: (-ranks[task], wf.index[task]))
    fanout = _FanoutView(view)
    finish: dict[str, tuple[int, float]] = {}
    last = len(ordered) - 1
    counts = policy.counts_siblings
    for k, task in enumerate(ordered):
        seen = fanout.snapshot() if counts else view
        target = policy.adjust(job, task, current, seen, profiles, now)
        current[task] = target
        i = view.positions.get(target, -1)
        if i < 0 or (k == last and not joins):
            continue
        done = float(policy.finish_times(job, task, current, seen, profiles, now)[i])
        if done == math.inf:
            continue  # its model cannot fit there: no finish to count or to follow
        finish[task] = (i, done)
        model = wf.tasks[task].model
        if counts and (model is not None or not host_lanes):
            size = 0 if model is None else profiles.model_bytes(model)
            batch = _batchable(wf, task, target, profiles) if policy.batch_aware else None
            fanout.place(i, done - now, model, size, batch)
    if joins:
        current.update(
            policy.place_joins(job, finished, current, finish, fanout.snapshot(), profiles, now)
        )
    return current


def _batchable(wf: Workflow, task: str, worker: str, profiles: Profiles) -> _Batchable | None:
    """``task`` on ``worker`` as a batch member, or None where it never batches."""
    curve = batch_curve(wf, task, worker, profiles)
    if curve is None:
        return None
    return _Batchable(profiles.exec_s(wf.name, task, worker), curve.limit)


def batch_curve(wf: Workflow, task: str, worker: str, profiles: Profiles) -> BatchCurve | None:
    """How ``task`` batches on ``worker``, or None where it never does."""
    declared = wf.tasks[task]
    if declared.batch <= 1:
        return None
    scale = profiles.batch_scale(wf.name, task, worker)
    limit = batch_limit(scale, declared.batch)
    if limit <= 1:
        return None
    assert declared.model is not None  # only a task with a model batches
    return BatchCurve(scale, limit, batch_key(declared.model, declared.profile.steps))


class PlacementCounter(Protocol):
    """What :func:`record_plan` counts placements in: a :class:`ClusterView`, or a worker
    core's view port."""

    def note_placement(self, worker: str, placed: Placement, now: float) -> None: ...


def record_plan(
    view: PlacementCounter,
    job: JobInfo,
    plan: Mapping[str, str],
    profiles: Profiles,
    now: float,
    *,
    host_lanes: bool = False,
    planner: str | None = None,
    batch_aware: bool = False,
) -> None:
    """Count every task of a fresh plan in its worker's wait (:meth:`ClusterView.note_placement`),
    so the next job planned before the next heartbeats does not pile onto the same workers.
    With ``host_lanes`` model-less tasks are not counted: they do not use the queue. Tasks placed
    on ``planner`` itself are not counted either: its own state is exact, and counting them too
    would count them twice. Each placement names its job, whose own later re-planning leaves it
    out (:meth:`ClusterView.snapshot`). With ``batch_aware`` a task that may batch counts in its
    model's batches on its worker, as that worker's queue will count it
    (:class:`~compass.sched.placement.PlacedCounts`)."""
    wf = job.workflow
    profiles.add_workflow(wf)
    for task, worker in plan.items():
        if worker == planner:
            continue
        model = wf.tasks[task].model
        if model is None and host_lanes:
            continue
        size = 0 if model is None else profiles.model_bytes(model)
        curve = batch_curve(wf, task, worker, profiles) if batch_aware else None
        seconds = profiles.exec_s(wf.name, task, worker)
        view.note_placement(
            worker, Placement(seconds, model, size, job.job_id, curve, job.priority), now
        )
