"""Batching switches for a whole workload: turn it off, or give every model task a curve.

Batched execution is a worker feature (every policy gets it); these transform a parsed
:class:`~compass.workflow.spec.Workload` so that ``compass sim`` and ``compass bench e2e`` can
run the same workload with batching off and on, under a chosen batch curve:

========  ==================================================  =====================
gain      a batch of ``b`` costs (multiples of one run)       where it comes from
========  ==================================================  =====================
none      ``b``                                               no gain at all
mild      ``1 + 0.15 (b - 1)``                                each extra item +15%
strong    ``1 + 0.05 (b - 1)``                                each extra item +5%
========  ==================================================  =====================

A curve applies to every model task whose spec gives no batch profile of its own (no
``batch_item`` or ``batch_ms``), with at most :data:`MAX_BATCH` items a run unless the task
declares its own ``batch``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from compass.errors import ConfigError
from compass.workflow.dag import Task, Workflow, linear_scale
from compass.workflow.spec import Workload
from compass.workflow.unfold import Declared

__all__ = ["BATCH_GAINS", "MAX_BATCH", "apply_batching", "without_step_batches"]

#: the per-item cost of each named curve, as a fraction of one run
BATCH_GAINS = {"none": 1.0, "mild": 0.15, "strong": 0.05}

#: the largest batch a curve applies to, where the task declares none
MAX_BATCH = 8


def apply_batching(workload: Workload, *, batching: bool, gain: str | None = None) -> Workload:
    """``workload`` with batching off (every task runs one item at a time), or on with the
    named ``gain`` curve (:data:`BATCH_GAINS`) for model tasks that declare no curve (None:
    only tasks that declare one batch). A step-wise task never batches its calls: it is left
    as it is."""
    if gain is not None and gain not in BATCH_GAINS:
        raise ConfigError(f"unknown batch gain {gain!r} (one of: {', '.join(BATCH_GAINS)})")
    workflows = {
        name: _rebuild(wf, lambda task: _batched(task, batching, gain))
        for name, wf in workload.workflows.items()
    }
    return dataclasses.replace(workload, workflows=workflows)


def without_step_batches(workload: Workload) -> Workload:
    """``workload`` with its step-wise tasks' batches off: each runs one job at a time (what
    ``--step-batch off`` compares continuous batching with)."""

    def alone(task: Task) -> Task:
        if task.profile.steps > 1 and task.batch > 1:
            return dataclasses.replace(task, batch=1)
        return task

    workflows = {name: _rebuild(wf, alone) for name, wf in workload.workflows.items()}
    return dataclasses.replace(workload, workflows=workflows)


def _batched(task: Task, batching: bool, gain: str | None) -> Task:
    if not batching:
        return task if task.batch == 1 else dataclasses.replace(task, batch=1)
    if task.model is None or task.profile.batch_scale or gain is None or task.profile.steps > 1:
        return task
    size = task.batch if task.batch > 1 else MAX_BATCH
    profile = dataclasses.replace(
        task.profile, batch_scale=linear_scale(BATCH_GAINS[gain], max(size, 2))
    )
    return dataclasses.replace(task, batch=size, profile=profile)


def _rebuild(wf: Workflow, change: Callable[[Task], Task]) -> Workflow:
    tasks = [change(wf.tasks[name]) for name in wf.order]
    declared = None if wf.unfold is None else wf.unfold.declared
    if isinstance(declared, Declared):  # unrolled again from its changed declaration
        return declared.unfold(wf, change)
    return Workflow(wf.name, tasks, inputs=wf.inputs, best_ms=wf.best_ms)
