"""Planning workflows decided at run time (sans-IO): what the deadline rules assume of the
choices still to be made.

A lane drops a task whose job cannot finish in time (:func:`~compass.sched.deadline.remaining_s`);
for a workflow with choices the work left after a task is unknown until they are made, so
the rule takes the shortest way out: at each choice the option whose path is shortest (a loop
stops now, a fan-out is as narrow as declared possible). A job is then dropped exactly when
not even that can make its deadline: a loop that can no longer make it ends at the next
iteration's start, not at its first.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Sequence

from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["RANK_SAMPLES", "expected_best_s", "shortest_remaining_s", "step_best_s"]


def shortest_remaining_s(workflow: Workflow, profiles: Profiles, worker: str) -> dict[str, float]:
    """For each task of unrolled ``workflow``, the least work left on the job's path once it
    starts: its own expected time plus, after a choice, the option whose longest path is
    shortest (successors in no option always run), on ``worker``'s profiles."""
    unfolding = workflow.unfold
    assert unfolding is not None
    left: dict[str, float] = {}
    for name in reversed(workflow.order):
        succs = workflow.succs(name)
        point = unfolding.points.get(name)
        if point is None:
            after = max((left[s] for s in succs), default=0.0)
        else:
            after = min(
                max((left[s] for s in unfolding.runs(name, i)), default=0.0)
                for i in range(len(point.options))
            )
        left[name] = profiles.exec_s(workflow.name, name, worker) + after
    return left


#: jobs drawn to estimate a task's job's best time (:func:`expected_best_s`): fixed draws, so
#: the same figures every time
RANK_SAMPLES = 400


def expected_best_s(
    workflow: Workflow,
    profiles: Profiles,
    worker: str,
    weights: Callable[[str], Sequence[float]],
    samples: int = RANK_SAMPLES,
) -> dict[str, float]:
    """For each task of unrolled ``workflow``, the best time a job that runs it is expected to
    have (the mean over ``samples`` jobs drawn with decision task ``t``'s options weighing
    ``weights(t)``, of the longest path of what each ran, on ``worker``'s profiles): what a
    job's slowdown is measured against, as far as the tasks it has reached tell. A job deep in
    a loop is expected to take longer than one at its first step, so its deadline in the queue
    comes later (program-level least attained service, as Autellix ranks an agent's calls)."""
    unfolding = workflow.unfold
    assert unfolding is not None
    exec_s = {t: profiles.exec_s(workflow.name, t, worker) for t in workflow.order}
    succs = {t: frozenset(workflow.succs(t)) for t in workflow.order}
    options: dict[str, list[frozenset[str]]] = {}
    cumulative: dict[str, list[float]] = {}
    for t, point in unfolding.points.items():
        options[t] = [unfolding.runs(t, i) for i in range(len(point.options))]
        cumulative[t] = list(itertools.accumulate(weights(t)))
    rng = random.Random(0)
    total = dict.fromkeys(workflow.order, 0.0)
    count = dict.fromkeys(workflow.order, 0)
    for _ in range(samples):
        live: set[str] = set()
        done: dict[str, float] = {}  # each task run: when it ends, its inputs on time
        for t in workflow.order:
            preds = workflow.preds(t)
            if preds and t not in live:
                continue
            done[t] = max((done[p] for p in preds if p in done), default=0.0) + exec_s[t]
            acc = cumulative.get(t)
            if acc is None:
                live |= succs[t]
            elif acc[-1] > 0:
                live |= options[t][bisect.bisect(acc, rng.random() * acc[-1])]
        best = max(done.values(), default=0.0)
        for t in done:
            total[t] += best
            count[t] += 1
    return {t: total[t] / count[t] if count[t] else 0.0 for t in workflow.order}


def step_best_s(workflow: Workflow, profiles: Profiles, worker: str) -> dict[str, float]:
    """For each task of unrolled ``workflow``, the best time of the step it belongs to when a
    user runs each step as a job of its own (``compass-chained``): a step starts at a root or
    at the successors of a choice and ends at the next choice (a decision task is the last of
    its step); the longest path through the task within its step, on ``worker``'s profiles."""
    unfolding = workflow.unfold
    assert unfolding is not None
    points = unfolding.points
    exec_s = {t: profiles.exec_s(workflow.name, t, worker) for t in workflow.order}
    up: dict[str, float] = {}  # from the step's start to the task's end
    for t in workflow.order:
        within = [up[p] for p in workflow.preds(t) if p not in points]
        up[t] = exec_s[t] + max(within, default=0.0)
    down: dict[str, float] = {}  # from the task's start to the step's end
    for t in reversed(workflow.order):
        after = () if t in points else workflow.succs(t)
        down[t] = exec_s[t] + max((down[s] for s in after), default=0.0)
    return {t: up[t] + down[t] - exec_s[t] for t in workflow.order}
