"""``compass bench e2e`` with batching: the worker processes run the batched workload the
driver measures against (they read it from the spec file written for them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass._bench import e2e
from compass.errors import ConfigError
from compass.sim.arrivals import Arrival


def tiny(tmp_path: Path) -> str:
    """One 100 ms model task on one worker; the spec declares no batch profile."""
    spec = {
        "name": "tiny",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10},
        "models": {"m": {"size_mb": 10}},
        "workflows": {"f": {"tasks": {
            "t": {"model": "m", "exec_ms": 100, "output_kb": 1, "after": []},
        }}},
    }  # fmt: skip
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.asyncio
@pytest.mark.parametrize(("batching", "gain"), [(True, "mild"), (False, "mild"), (True, None)])
async def test_the_workers_run_the_workload_the_flags_make(
    tmp_path: Path, batching: bool, gain: str | None
) -> None:
    config = e2e.E2EConfig(
        workload=tiny(tmp_path),
        workers=1,
        jobs=8,
        time_scale=0.1,
        policies=("jsq",),
        batching=batching,
        batch_gain=gain,
    )
    workload = e2e.workload_for(config)
    # eight jobs at once: while the first runs, seven wait for the same model
    arrivals = [Arrival(0.0, "f", i) for i in range(8)]
    summary = await e2e.run_policy(config, workload, "jsq", arrivals)
    assert summary["completed"] == 8
    sizes = {int(size): runs for size, runs in summary["batch_sizes"].items()}
    assert sum(size * runs for size, runs in sizes.items()) == 8
    assert (max(sizes) > 1) == (batching and gain == "mild"), sizes


def test_a_bad_batch_gain_is_refused() -> None:
    with pytest.raises(ConfigError, match="--batch-gain 'huge': expected one of none, mild"):
        e2e.E2EConfig(batch_gain="huge")
