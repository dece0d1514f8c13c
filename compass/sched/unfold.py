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

from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["shortest_remaining_s"]


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
            chosen = {s for option in point.options for s in option}
            always = [left[s] for s in succs if s not in chosen]
            after = min(
                max([*always, *(left[s] for s in option)], default=0.0) for option in point.options
            )
        left[name] = profiles.exec_s(workflow.name, name, worker) + after
    return left
