"""Scheduling at step boundaries, sans-IO: the one rule that decides whether a queued task runs
before the rest of a running step-wise one, and when a step-wise task is past saving.

A step-wise task (a generator: each ``yield`` ends a step) gives its lane a chance between two
steps; a plain task never does, so it is never preempted. When a step ends, the lanes
(:meth:`Lanes.stepped <compass.core.lanes.Lanes.stepped>`) ask :func:`preempts` whether the
queue's head should run first; if so the task is suspended (its state and its model kept on the
worker, back in the queue with the steps it has left), the head takes the lane, and the task
resumes on the first lane that frees after it, before anything else queued. The rule is the
same for every policy (it is the core's) and looks only at what the worker itself knows: the
two tasks, the time, and what switching costs.

The rule, in order:

1. **Priority.** A head of a higher priority level preempts, whatever else (a level is what
   the caller asked for); one of a lower level never does.
2. **A deadline.** A head whose job has a deadline (and does not finish past it) preempts
   when it would miss it by waiting for the running task's remaining steps and would make it
   by starting now (after the switch: its model's load, when it is not resident).
3. **Slowdown.** Otherwise the head preempts when its job's slowdown (time from its arrival
   to its end, over its best time) would be higher if it waited for the running task than the
   running job's would be if it waited for the head: the larger of the two slowdowns is the
   smaller. A short job stuck behind a long generation is the case; a long job preempted
   gains weight as it waits, so it is not starved.

In 2 and 3 the running task's own job must still make its deadline, where it has one, after
the head's run. In all three, a head whose job cannot make its deadline even starting now never
preempts: it is shed, and the task it would have suspended would resume at once. A worker holds
at most one suspended run per lane, so preemptions do not nest. A step batch is one run:
:func:`preempts_batch` weighs its members together, and it is suspended whole.
A suspended task's state costs memory (a KV cache for an LLM): its step profile declares the
bytes per step (``state_bytes``); the lanes take them from the cache's free slabs
(:meth:`CacheCore.hold_state <compass.cache.policy.CacheCore.hold_state>`), and refuse the
preemption when they, or the head's model beside the task's own, do not fit.

:func:`past_saving` is the step-level shedding rule: a running step-wise task whose job can no
longer make its deadline, even if every step left and its successors ran at once, is stopped at
this boundary rather than run to its end (its job is answered ``DeadlineExceeded``): its lane
goes to work that can still make it.

Measured in docs/RESULTS.md ("Preemption at step boundaries"), against the same core without
it, on the paper's workload with steps and on generated ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from compass.core.queue import QueuedTask

__all__ = ["after_s", "left_s", "past_saving", "preempts", "preempts_batch"]


def left_s(entry: QueuedTask, done: int) -> float:
    """Expected seconds of the steps ``entry`` has left after ``done`` of its run's steps:
    its run's share of its expected steps (a resumed run's steps are the rest of the task's)."""
    steps = max(1, entry.steps - entry.done_steps)
    return entry.run_s * max(0, steps - done) / steps


def after_s(entry: QueuedTask) -> float:
    """Expected seconds of its job's critical path after ``entry`` (its successors')."""
    return max(0.0, entry.remaining_s - entry.expected_s)


def preempts(
    running: QueuedTask, left: float, head: QueuedTask, now: float, *, switch_s: float = 0.0
) -> bool:
    """Whether ``head`` (the queue's next task) runs before the rest of ``running``, which has
    ``left`` expected seconds of steps to go at this boundary (``now``); ``switch_s``: what
    starting ``head`` costs first (its model's load). See the module docstring."""
    return preempts_batch(((running, left),), head, now, switch_s=switch_s)


def preempts_batch(
    members: Sequence[tuple[QueuedTask, float]],
    head: QueuedTask,
    now: float,
    *,
    switch_s: float = 0.0,
) -> bool:
    """Whether ``head`` runs before the rest of a run of ``members`` (a step batch's, each
    with the expected seconds of steps it has left; a lone task is a run of one): the rule of
    :func:`preempts` over the run. Its lane frees when the last member ends, so the head
    would wait for the longest; each member's job would wait for the head's run. Priority is
    against the highest level among the members; the deadline and slowdown rules weigh the
    members of the head's level (a lower level gives way to it anyway): each must still make
    its own deadline, and the head's slowdown waiting is set against the largest of theirs."""
    start = now + switch_s
    deadline = head.deadline
    if deadline is not None and not head.finish and start + head.remaining_s > deadline:
        return False  # past saving itself: shed, not run
    top = max(m.level for m, _ in members)
    if head.level != top:
        return head.level > top
    # when each job would end: the head after the run's steps, or right away; each member's
    # after the head's run
    head_waits = now + max(left for _, left in members) + head.remaining_s
    head_now = start + head.remaining_s
    waits = [(m, start + head.expected_s + left + after_s(m)) for m, left in members
             if m.level == top]  # fmt: skip
    for m, end in waits:
        if m.deadline is not None and not m.finish and end > m.deadline:
            return False  # a member's own deadline comes first
    if deadline is not None and not head.finish:
        return head_waits > deadline >= head_now
    if head.best_s <= 0.0 or any(m.best_s <= 0.0 for m, _ in waits):
        return False  # no yardstick (no profile yet): no switch
    head_slowdown = (head_waits - head.arrival) / head.best_s
    return head_slowdown > max((end - m.arrival) / m.best_s for m, end in waits)


def past_saving(running: QueuedTask, left: float, now: float) -> bool:
    """Whether ``running``'s job misses its deadline even if its ``left`` seconds of steps and
    its successors ran from ``now`` without a wait (a job that finishes anyway never is)."""
    deadline = running.deadline
    if deadline is None or running.finish:
        return False
    return now + left + after_s(running) > deadline
