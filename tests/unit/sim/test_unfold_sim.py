"""The simulator runs workflows decided at run time with the worker's core: the agent-loop
workload's jobs all finish, take the same draws under every policy, and are measured against
the tasks they ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from compass.sim.arrivals import job_arrivals
from compass.sim.engine import simulate
from compass.sim.result import JobRecord
from compass.sim.settings import SimSettings
from compass.workflow.spec import load_workload

AGENT_LOOP = Path(__file__).parents[3] / "bench" / "workloads" / "agent-loop.json"


@pytest.fixture(scope="module")
def runs() -> dict[str, list[JobRecord]]:
    workload = load_workload(AGENT_LOOP)
    arrivals = job_arrivals(
        list(workload.workflows), 90, process="poisson", mean_interval_s=2.0, load=2.0,
        seed=1, weights=workload.weight_list(),
    )  # fmt: skip
    return {
        policy: simulate(workload, SimSettings(workers=6, policy=policy, seed=1), arrivals).jobs
        for policy in ("compass", "compass-chained", "jit", "jsq")
    }


def test_every_job_finishes_under_every_policy(runs: dict[str, list[JobRecord]]) -> None:
    for policy, jobs in runs.items():
        assert len(jobs) == 90 and all(j.latency_s is not None for j in jobs), policy


def test_a_job_makes_the_same_choices_whatever_the_policy(runs: dict[str, list[JobRecord]]) -> None:
    ran = {p: {j.id: sorted(j.plan) for j in jobs} for p, jobs in runs.items()}
    assert ran["compass"] == ran["compass-chained"] == ran["jit"] == ran["jsq"]
    agents = [tasks for tasks in ran["compass"].values() if "answer" in tasks]
    # the loop ran a different number of times for different jobs, each within its bound
    steps = {sum(t.startswith("llm@") for t in tasks) for tasks in agents}
    assert len(steps) > 1 and steps <= set(range(2, 8))


def test_a_job_is_measured_against_the_tasks_it_ran(runs: dict[str, list[JobRecord]]) -> None:
    for jobs in runs.values():
        assert all(j.slowdown is not None and j.slowdown >= 1.0 for j in jobs)
    # a short agent job's best time is its own, not that of the longest loop
    best = {
        len(j.plan): j.latency_s / j.slowdown
        for j in runs["compass"]
        if "answer" in j.plan and j.latency_s is not None and j.slowdown is not None
    }
    assert best[min(best)] < 0.8 * best[max(best)]


def test_an_agent_at_its_bound_runs_no_tool_after_its_last_step(
    runs: dict[str, list[JobRecord]],
) -> None:
    """Each tool call is followed by an LLM step: an agent runs one tool fewer than LLM
    steps, those that reached the loop's bound (7 LLM steps) included."""
    tools = ("search@", "code@", "vision@")
    for policy, jobs in runs.items():
        agents = [j.plan for j in jobs if "answer" in j.plan]
        steps = [sum(t.startswith("llm@") for t in plan) for plan in agents]
        called = [sum(t.startswith(tools) for t in plan) for plan in agents]
        assert called == [n - 1 for n in steps], policy
        assert 7 in steps, policy  # some reached the bound
