"""``compass bench e2e --preempt on|off|both`` on real worker processes: the workers it starts
schedule at step boundaries (their status says so, and counts the suspensions they made), the
runs without it are named "NAME (no preemption)" as ``compass sim`` names them, in the same
JSON layout, and a bad value is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compass._bench import e2e

from ..unit.test_batching_cli import compass


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


@pytest.mark.parametrize("value", ["sometimes", "ON", ""])
def test_a_bad_preempt_value_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str
) -> None:
    json_path = tmp_path / "never.json"
    code, _, err = compass(
        capsys, "bench", "e2e", "--preempt", value, "--jobs", "5", "--json", str(json_path)
    )
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--preempt" in lines[0], err
    assert not json_path.exists()
