"""Model prefetch on the likely branch of a workflow decided at run time (sans-IO).

A task is queued on a worker only once its inputs are all there, so the look-ahead of the
paper's prefetch (the next ``prefetch_depth`` models the queue will run) never sees the
successors of a decision task until its choice is made: the chosen tool's model, if missing,
was loaded only after the choice, with the successor waiting for it. Here a decision task's
queue entry carries the models of the successors its most likely option runs that its job's
plan puts on this worker (:func:`likely_models`, by the choice weights this worker learned or
heard, as planning uses them); the look-ahead lists them right after the decision task
(:meth:`~compass.core.queue.TaskQueue.look_ahead`), so that while it runs the lanes may load
them (:func:`prefetch_candidate`): within the same ``prefetch_depth``, one load at a time,
and a speculative model takes only free slabs or those of models no running or queued task
needs (it never evicts what the queue needs; with ``prefetch_evicts`` off, free slabs only).
The worker core's lanes follow it on a worker and in the simulator alike. A likely successor
planned on another worker is not prefetched there: nothing tells that worker before the
choice (docs/ARCHITECTURE.md, "Workflows decided at run time").

A static workflow's entries carry no such models, and the rule is then the paper's as it was.
"""

from __future__ import annotations

from collections.abc import Mapping

from compass.cache.policy import CacheCore, LoadPlan
from compass.core.queue import TaskQueue
from compass.errors import CompassError
from compass.workflow.dag import Workflow
from compass.workflow.frequencies import ChoiceFrequencies

__all__ = ["likely_models", "prefetch_candidate"]


def likely_models(
    workflow: Workflow,
    task: str,
    plan: Mapping[str, str],
    worker: str,
    choices: ChoiceFrequencies,
) -> tuple[str, ...]:
    """The models of the successors decision task ``task`` of ``workflow`` runs when it takes
    its most likely option (by ``choices``) that ``plan`` puts on ``worker``, in successor
    order, without ``task``'s own model (it is resident while ``task`` runs); empty for a task
    that makes no choice."""
    unfolding = workflow.unfold
    if unfolding is None or task not in unfolding.points:
        return ()
    tasks = workflow.tasks
    likely = choices.likely_successors(workflow, task)
    models: list[str] = []
    for succ in workflow.succs(task):
        model = tasks[succ].model
        if (
            model is not None
            and succ in likely
            and plan.get(succ) == worker
            and model != tasks[task].model
            and model not in models
        ):
            models.append(model)
    return tuple(models)


def prefetch_candidate(
    cache: CacheCore, queue: TaskQueue, depth: int, *, evict: bool
) -> tuple[str, LoadPlan] | None:
    """The model to prefetch, and its plan, or None: the first of the first ``depth`` models
    of ``queue``'s look-ahead that is neither resident nor loading. A model a queued or
    running task needs follows :meth:`CacheCore.prefetch_candidate` (it may evict models
    needed later than it, or, without ``evict``, only take free slabs); a likely successor's
    takes only free slabs or those of models the queue does not need at all. As in the paper,
    the scan stops at the first missing model the queue needs, whether it fits or not; a likely
    model that does not fit is passed over (it may never be needed)."""
    if not queue.any_likely():  # nothing likely (every static workflow): the paper's rule
        return cache.prefetch_candidate(queue.upcoming_models(), depth, evict=evict)
    ahead = queue.look_ahead()
    upcoming = [model for model, likely in ahead if not likely]
    position = 0  # where in ``upcoming`` the next model the queue needs is
    for name, likely in ahead[: max(depth, 0)]:
        if cache.handle(name) is not None:  # resident or loading
            position += not likely
            continue
        if not likely:  # the first ``position`` needed models are all resident or loading
            return cache.prefetch_candidate(upcoming, position + 1, evict=evict)
        speculative = _speculative(cache, name, upcoming, evict=evict)
        if speculative is not None:
            return speculative
    return None


def _speculative(
    cache: CacheCore, name: str, upcoming: list[str], *, evict: bool
) -> tuple[str, LoadPlan] | None:
    """``name``'s load, if it fits in free slabs or (with ``evict``) by evicting only models
    none of ``upcoming`` needs."""
    if not evict:
        return cache.warm_candidate([name])
    try:
        plan = cache.plan_load(name, upcoming, allow_evict_needed=False)
    except CompassError:  # not a model of this cache's, or one that can never fit
        return None
    return None if plan is None else (name, plan)
