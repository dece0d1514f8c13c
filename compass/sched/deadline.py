"""Deadlines, sans-IO: when a plan would finish a job, and how much work is left after a task.

Both are estimates from the same terms the planner uses (profiled execution times, queue waits,
transfers, model fetches) and both are policy-free: the ingress refuses a job whose plan
already finishes after its deadline, and a lane drops a task whose job cannot finish in time
when it starts now, whichever policy made the plan, so comparisons between policies stay fair.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from compass.sched.cost import WorkflowCosts, finish_row
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["plan_finish_s", "remaining_s"]


def plan_finish_s(
    costs: WorkflowCosts,
    plan: Mapping[str, str],
    view: ViewSnapshot,
    now: float,
    *,
    ingress: str,
    input_bytes: int = 0,
    host_lanes: bool = False,
    use_load: bool = True,
) -> float:
    """When the last sink of a job planned as ``plan`` is expected to finish, in absolute
    seconds on the caller's clock: :func:`~compass.sched.cost.finish_row`'s terms, each task on
    the worker ``plan`` names (one the view does not hold: its best worker, an optimistic
    guess), a worker's lane busy until the task placed there before ends, and a model fetched
    once per worker. ``use_load=False``: every worker idle at ``now`` (the queues left out)."""
    order = costs.workflow.order
    positions = view.positions
    avail = view.wait_s + now if use_load else np.full(len(view.names), now)
    free, capacity, min_capacity = view.free_bytes, view.capacity_bytes, view.min_capacity_bytes
    brought: dict[str, np.ndarray] = {}
    placed = [-1] * len(order)
    finish = [now] * len(order)
    source = positions.get(ingress, -1)
    for t in costs.rank_order:  # predecessors first
        preds = costs.preds[t]
        if preds:
            sources = [placed[p] for p in preds]
            ready = [finish[p] for p in preds]
            root_bytes = 0
        else:
            sources, ready = [source], [now]
            root_bytes = input_bytes or costs.input_bytes[t]
        model = costs.models[t]
        on_lane = model is not None or not host_lanes
        have = None
        if model is not None:
            have = brought.get(model)
            if have is None:
                have = view.holds(model)
        fetch = None if have is None else (have, free, capacity, min_capacity)
        eft, _ = finish_row(
            costs, t, sources, ready, avail.copy() if on_lane else None, fetch, root_bytes
        )
        j = positions.get(plan.get(order[t], ""), -1)
        if j < 0:
            j = int(eft.argmin())
        placed[t], finish[t] = j, float(eft[j])
        if on_lane:
            avail[j] = finish[t]
        if model is not None and have is not None and not have[j]:
            have = have.copy()
            have[j] = True
            brought[model] = have
    return max(finish[costs.workflow.index[s]] for s in costs.workflow.sinks)


def remaining_s(workflow: Workflow, profiles: Profiles, worker: str) -> dict[str, float]:
    """For each task, the seconds of work left on the job's critical path once it starts: its
    own expected time plus the longest such path among its successors (on ``worker``'s
    profiles; no waits and no transfers, so a task found late by it is late for certain)."""
    left: dict[str, float] = {}
    for name in reversed(workflow.order):
        after = max((left[s] for s in workflow.succs(name)), default=0.0)
        left[name] = profiles.exec_s(workflow.name, name, worker) + after
    return left
