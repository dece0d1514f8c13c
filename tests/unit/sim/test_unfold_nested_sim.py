"""The simulator runs a workload with a nested loop (a spec's inner loop inside an outer loop's
body) with the worker's core: every job finishes, takes the same draws under every policy, and
runs, in each outer iteration, as many inner iterations as the spec's counts allow."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from compass.sim.arrivals import job_arrivals
from compass.sim.engine import simulate
from compass.sim.result import JobRecord
from compass.sim.settings import SimSettings
from compass.workflow.spec import parse_workload

SPEC: dict[str, Any] = {
    "cluster": {"workers": 3, "gpu_memory_mb": 8000, "h2d_gbps": 10, "d2h_gbps": 10,
                "net_gbps": 10},
    "models": {"planner": {"size_mb": 200}, "writer": {"size_mb": 400},
               "critic": {"size_mb": 100}},
    "workflows": {
        "refine": {
            "weight": 1,
            "tasks": {
                "plan": {"model": "planner", "exec_ms": 10, "input_kb": 4, "output_kb": 4},
                "draft": {"model": "writer", "exec_ms": 40, "output_kb": 8, "after": ["plan"]},
                "check": {"model": "critic", "exec_ms": 8, "output_kb": 1,
                          "after": ["draft", "plan"]},
                "judge": {"model": "planner", "exec_ms": 10, "output_kb": 1, "after": ["check"]},
                "answer": {"exec_ms": 1, "output_kb": 1, "after": ["judge"]},
            },
            "loops": {
                "outer": {"body": ["plan", "draft", "check", "judge"], "until": "judge",
                          "max_iter": 3, "counts": [1, 3]},
                "inner": {"body": ["draft", "check"], "until": "check", "max_iter": 4,
                          "counts": {"1": 1, "2": 1, "3": 1}},
            },
        },
        "single": {
            "weight": 1,
            "tasks": {"ask": {"model": "critic", "exec_ms": 8, "input_kb": 4, "output_kb": 1}},
        },
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict[str, list[JobRecord]]:
    workload = parse_workload(SPEC, source="nested.json")
    arrivals = job_arrivals(
        list(workload.workflows), 60, process="poisson", mean_interval_s=0.5, load=1.0,
        seed=3, weights=workload.weight_list(),
    )  # fmt: skip
    return {
        policy: simulate(workload, SimSettings(workers=3, policy=policy, seed=3), arrivals).jobs
        for policy in ("compass", "jsq")
    }


def test_every_nested_loop_job_finishes_with_the_same_draws_under_every_policy(
    runs: dict[str, list[JobRecord]],
) -> None:
    for policy, jobs in runs.items():
        assert len(jobs) == 60 and all(j.latency_s is not None for j in jobs), policy
    ran = {p: {j.id: sorted(j.plan) for j in jobs} for p, jobs in runs.items()}
    assert ran["compass"] == ran["jsq"]


def test_each_outer_iteration_runs_its_own_drawn_count_of_inner_iterations(
    runs: dict[str, list[JobRecord]],
) -> None:
    inner_counts: Counter[int] = Counter()
    outer_counts: Counter[int] = Counter()
    for job in runs["compass"]:
        if "answer" not in job.plan:
            continue
        drafts: dict[int, list[int]] = {}
        for task in job.plan:
            found = re.fullmatch(r"draft@(\d+)\.(\d+)", task)
            if found:
                drafts.setdefault(int(found[1]), []).append(int(found[2]))
        outer = len(drafts)
        outer_counts[outer] += 1
        assert sorted(drafts) == list(range(outer))  # the outer iterations ran in turn
        for i, inner in drafts.items():
            # the inner loop ran from its first iteration on, never past the counts declared
            assert sorted(inner) == list(range(len(inner))) and 1 <= len(inner) <= 3
            assert f"check@{i}.{len(inner) - 1}" in job.plan
            assert f"check@{i}.{len(inner)}" not in job.plan
            inner_counts[len(inner)] += 1
        assert f"judge@{outer - 1}" in job.plan and f"plan@{outer}" not in job.plan
    # the draws vary, per job and per outer iteration
    assert set(inner_counts) == {1, 2, 3} and len(outer_counts) > 1
