"""The best time a task of a workflow decided at run time is weighed against at a step
boundary (compass.core.estimates, ``rank_yardstick``): the one it ranks by in the queue (the
expected best time of a job that reached it under compass; its step's under compass-chained,
the job a chaining client submitted), or its workflow's likely path's with the knob off (and
for static workflows always)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compass.core.estimates import Estimates
from compass.core.jobs import InboxEntry
from compass.core.messages import TaskMsg
from compass.core.preempt import left_s, preempts
from compass.core.queue import QueuedTask
from compass.core.unfold import ranks_yardstick
from compass.sched import make_policy
from compass.workflow.profile import Profiles
from compass.workflow.spec import load_workload

WORKLOADS = Path(__file__).parents[3] / "bench" / "workloads"
STEPS = WORKLOADS / "agent-loop-steps.json"


def _entry(
    policy: str,
    options: dict[str, Any],
    workflow: str,
    task: str,
    arrival: float,
    spec: Path = STEPS,
) -> QueuedTask:
    """``task``'s queue entry on worker w0 at time ``arrival`` + 1 (its job arrived at
    ``arrival``), every input here."""
    workload = load_workload(spec)
    profiles = Profiles.from_workload(workload)
    estimates = Estimates("w0", make_policy(policy, options=options), profiles, host_lanes=False)
    wf = workload.workflows[workflow]
    plan = dict.fromkeys(wf.order, "w0")
    msg = TaskMsg(job="j", attempt=0, workflow=workflow, task=task, source="x", value=None,
                  plan=plan, ingress="w0")  # fmt: skip
    ready = InboxEntry(workflow=workflow, needed=frozenset(), plan=plan, ingress="w0")
    return estimates.queued(msg, wf, ready, arrival + 1.0, 0.0, arrival)


def test_each_policy_weighs_by_its_rank() -> None:
    assert ranks_yardstick(make_policy("compass"))
    assert ranks_yardstick(make_policy("compass-chained"))
    assert not ranks_yardstick(make_policy("compass", options={"rank_yardstick": False}))
    assert not ranks_yardstick(make_policy("jsq"))


def test_a_deep_step_is_weighed_as_the_long_job_it_is_expected_to_be() -> None:
    first = _entry("compass", {}, "agent", "llm@0", 0.0)
    deep = _entry("compass", {}, "agent", "llm@5", 0.0)
    assert first.steps == 7 and deep.steps == 7  # the LLM steps are step-wise here
    assert first.best_s < deep.best_s
    # a job that reached its sixth LLM step ran at least six of them and five tools
    assert deep.best_s >= 6 * 0.140 + 5 * 0.035
    flat = [_entry("compass", {"rank_yardstick": False}, "agent", t, 0.0)
            for t in ("llm@0", "llm@5")]  # fmt: skip
    assert flat[0].best_s == flat[1].best_s  # the likely path's, whatever the task
    # ranks are unchanged by the knob (it only moves the yardstick)
    assert flat[1].priority == deep.priority


def test_a_chained_step_is_weighed_as_a_job_of_its_own() -> None:
    first = _entry("compass-chained", {}, "agent", "llm@0", 0.0)
    later = _entry("compass-chained", {}, "agent", "llm@1", 0.0)
    assert first.best_s == pytest.approx(0.140)
    assert later.best_s == pytest.approx(0.160 + 0.140)  # the longest tool and the LLM call


def test_a_static_workflow_keeps_its_best_time() -> None:
    """A static workflow's tasks are weighed against its best time whatever the knob (the
    reference simulations with preemption are unchanged)."""
    for options in ({}, {"rank_yardstick": False}):
        for task in ("generate", "marian"):
            entry = _entry(
                "compass", options, "translation", task, 0.0, WORKLOADS / "paper-steps.json"
            )
            assert entry.best_s == pytest.approx(1.365, rel=0.05)


def test_a_short_job_takes_a_deep_agent_steps_lane() -> None:
    """An agent job deep in its loop (arrived 4 s ago, its sixth LLM step running, 2 of 7
    steps done) and a router job's expert waiting: weighed against the likely path's best
    time the agent's slowdown looks the larger and it keeps its lane; weighed as the long job
    a job that reached that step is expected to be, the expert takes the lane."""
    now = 4.0
    decisions = {}
    for label, options in (("rank", {}), ("path", {"rank_yardstick": False})):
        running = _entry("compass", options, "agent", "llm@5", 0.0)
        running.run_s = running.expected_s
        left = left_s(running, 2)
        head = _entry("compass", options, "router", "expert_a", 0.0)
        # the head's job arrived so that its slowdown, waiting for the agent's steps, falls
        # between the agent's two (each measured as the rule does)
        end = now + head.expected_s + left + max(0.0, running.remaining_s - running.expected_s)
        by_rank = end / _entry("compass", {}, "agent", "llm@5", 0.0).best_s
        by_path = end / _entry("compass", {"rank_yardstick": False}, "agent", "llm@5", 0.0).best_s
        assert by_rank < by_path
        waits = now + left + head.remaining_s
        head.arrival = waits - head.best_s * (by_rank + by_path) / 2
        assert head.arrival < now
        decisions[label] = preempts(running, left, head, now)
    assert decisions == {"rank": True, "path": False}
