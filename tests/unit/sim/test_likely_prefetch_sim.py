"""The simulator prefetches on the likely branch with the worker's core (compass.core.likely):
where a cache holds the router and one of two tools, the likely tool's model loads while the
router runs, so the tool waits less for it than with the prefetch switched off, on the same
jobs."""

from __future__ import annotations

from typing import Any

import pytest

from compass.sim.arrivals import job_arrivals
from compass.sim.engine import simulate
from compass.sim.result import SimResult
from compass.sim.settings import SimSettings
from compass.workflow.spec import parse_workload

#: one worker whose cache holds two of three 1 GB models: the router's and one tool's
SPEC: dict[str, Any] = {
    "name": "pick-a-tool",
    "cluster": {"workers": 1, "gpu_memory_mb": 2100, "h2d_gbps": 10, "d2h_gbps": 10,
                "net_gbps": 10},
    "models": {"router": {"size_mb": 1000}, "a": {"size_mb": 1000}, "b": {"size_mb": 1000}},
    "workflows": {"pick": {
        "tasks": {
            "route": {"model": "router", "exec_ms": 60, "output_kb": 1},
            "tool_a": {"model": "a", "exec_ms": 30, "output_kb": 1, "after": ["route"]},
            "tool_b": {"model": "b", "exec_ms": 30, "output_kb": 1, "after": ["route"]},
        },
        "branches": {"route": {"tool_a": 0.8, "tool_b": 0.2}},
    }},
}  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict[str, SimResult]:
    workload = parse_workload(SPEC, source="pick.json")
    arrivals = job_arrivals(
        list(workload.workflows), 60, process="poisson", mean_interval_s=1.0, load=1.0, seed=3,
    )  # fmt: skip
    settings = {
        side: SimSettings(
            workers=1, policy="compass", seed=3, policy_options={"likely_prefetch": side == "on"}
        )
        for side in ("on", "off")
    }
    return {side: simulate(workload, s, arrivals) for side, s in settings.items()}


def _tool_fetch_s(result: SimResult, tool: str) -> list[float]:
    return [t.fetch_s for t in result.tasks if t.task == tool]


def test_the_same_jobs_take_the_same_branches_both_ways(runs: dict[str, SimResult]) -> None:
    ran = {side: sorted((t.job_id, t.task) for t in r.tasks) for side, r in runs.items()}
    assert ran["on"] == ran["off"]
    assert len(runs["on"].jobs) == 60 and all(j.latency_s is not None for j in runs["on"].jobs)


def test_the_likely_tool_s_model_loads_while_the_router_runs(runs: dict[str, SimResult]) -> None:
    on, off = _tool_fetch_s(runs["on"], "tool_a"), _tool_fetch_s(runs["off"], "tool_a")
    # off, a job after a tool_b job loads a only once the router chose it: 0.1 s of copying;
    # on, that copy began with the router's 60 ms run
    assert max(off) == pytest.approx(0.1, rel=0.05)
    assert max(on) < 0.05
    assert sum(on) < 0.5 * sum(off)
    assert runs["on"].prefetches > runs["off"].prefetches


def test_the_unlikely_tool_gains_nothing(runs: dict[str, SimResult]) -> None:
    """tool_b's model is not the likely one: it still loads after the choice."""
    on, off = _tool_fetch_s(runs["on"], "tool_b"), _tool_fetch_s(runs["off"], "tool_b")
    assert len(on) == len(off) > 0
    assert sum(on) >= 0.9 * sum(off) > 0
