"""``compass bench e2e --preempt on|off|both`` on real worker processes: the workers it starts
schedule at step boundaries (their status says so, and counts the suspensions they made), the
runs without it are named "NAME (no preemption)" as ``compass sim`` names them, in the same
JSON layout, and a bad value is refused in one line. ``--step-batch`` likewise: the runs named
"NAME (no step batching)" run their generations one job each."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from compass._bench import e2e
from compass.sim.settings import NO_STEP_BATCHING

from ..unit.test_batching_cli import compass
from .test_preempt import step_batched


def step_spec(folder: Path) -> str:
    """One worker, one model: a 10-step generation of 400 ms and a 20 ms task behind it, a
    job of each every 200 ms at load 1 (twice what one lane does: queues form behind the
    generations, which the slowdown rule lets the short jobs cut between two steps)."""
    task = {"model": "m", "output_kb": 1, "after": []}
    spec = {
        "name": "steps",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 10}},
        "workflows": {
            "long": {"tasks": {"gen": {**task, "exec_ms": 400, "steps": 10, "state_kb": 64}}},
            "short": {"tasks": {"det": {**task, "exec_ms": 20}}},
        },
        "arrivals": {"mean_interval_ms_per_client": 200, "jobs": 12},
    }  # fmt: skip
    path = folder / "steps.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.timeout(240)
def test_preempt_both_runs_each_policy_with_and_without_on_the_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    json_path = tmp_path / "e2e.json"
    code, _, err = compass(
        capsys, "bench", "e2e", "--workload", step_spec(tmp_path), "--workers", "1",
        "--policies", "compass", "--jobs", "12", "--arrival", "uniform", "--time-scale", "0.5",
        "--host-lanes", "0", "--preempt", "both", "--json", str(json_path),
    )  # fmt: skip
    assert code == 0, err
    out: dict[str, Any] = json.loads(json_path.read_text())
    assert out["config"]["preempt"] is True
    assert out["config"]["policies"] == ["compass", "compass (no preemption)"]
    results = out["results"]
    assert set(results) == {"compass", "compass (no preemption)"}
    for summary in results.values():
        assert summary["completed"] == 12 and summary["failed"] == 0
    # the count is there only where the workers' status said they preempt
    assert "suspensions" not in results["compass (no preemption)"]
    assert results["compass"]["suspensions"] > 0  # and they did, between steps


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_by_default_the_workers_do_not_preempt(tmp_path: Path) -> None:
    config = e2e.E2EConfig(
        workload=step_spec(tmp_path), workers=1, jobs=4, time_scale=0.5, policies=("compass",),
        host_lanes=0,
    )  # fmt: skip
    assert not config.preempt
    workload = e2e.workload_for(config)
    summary = await e2e.run_policy(config, workload, "compass", e2e.arrivals_for(config, workload))
    assert summary["completed"] == 4
    assert "suspensions" not in summary  # their status said they do not preempt


@pytest.mark.parametrize("flag", ["--preempt", "--step-batch"])
@pytest.mark.parametrize("value", ["sometimes", "ON", ""])
def test_a_bad_preempt_value_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str
) -> None:
    json_path = tmp_path / "never.json"
    code, _, err = compass(
        capsys, "bench", "e2e", flag, value, "--jobs", "5", "--json", str(json_path)
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], err
    assert not json_path.exists()


def overlapping_generations(summary: dict[str, Any]) -> int:
    """How many of the run's generations began while another was running (on one lane, only
    a step batch runs two at once)."""
    (worker,) = summary["timeline"]
    spans = sorted((s["start"], s["end"]) for s in worker["spans"] if s["task"] == "gen")
    return sum(1 for (_, end), (start, _) in itertools.pairwise(spans) if start < end)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_no_step_batching_runs_each_generation_alone_on_the_workers(
    tmp_path: Path,
) -> None:
    config = e2e.E2EConfig(
        workload=step_batched(step_spec(tmp_path)), workers=1, jobs=8, time_scale=0.5, load=4.0,
        arrival="uniform", host_lanes=0,
    )  # fmt: skip
    workload = e2e.workload_for(config)
    arrivals = e2e.arrivals_for(config, workload)
    overlaps = {}
    for policy in ("compass", "compass" + NO_STEP_BATCHING):
        summary = await e2e.run_policy(config, workload, policy, arrivals, timeline=True)
        assert summary["completed"] == 8
        overlaps[policy] = overlapping_generations(summary)
    assert overlaps["compass"] > 0  # generations queued together shared their steps
    assert overlaps["compass" + NO_STEP_BATCHING] == 0  # one at a time on the one lane
