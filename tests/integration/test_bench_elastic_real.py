"""``compass bench elastic --real``'s compressed check, on a short curve: real worker
processes sized by the local autoscaler against the simulator on the same arrivals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass._bench.elastic_real import RealConfig, run_real


@pytest.mark.timeout(240)
def test_the_real_run_and_the_simulated_one_answer_every_job_and_are_compared(
    tmp_path: Path,
) -> None:
    """A rise to 3x the rate over 5 s minutes, at most 2 workers: the real cluster grows (the
    autoscaler started a worker), every job is answered on both sides, and the JSON holds
    both sides' GPU-hours and attainment and their ratios."""
    config = RealConfig(minute_s=5.0, curve=(1, 3, 3, 3, 1), base_rate=1.5, maximum=2)
    path = tmp_path / "real.json"
    out = run_real(config, json_path=str(path))
    assert json.loads(path.read_text()) == json.loads(json.dumps(out))
    (part,) = out["workloads"].values()
    sides = part["results"]["autoscale"]
    for side in ("real", "simulated"):
        assert sides[side]["gpu_hours"] > 0 and 0 < sides[side]["attainment"] <= 1
    assert sides["real"]["jobs"] == sides["simulated"]["jobs"] > 0
    assert sides["real"]["answered"] == sides["simulated"]["answered"] == sides["real"]["jobs"]
    assert sides["real"]["starts"] >= 1 and part["measured_start_s"] > 0
    assert any("started w1" in line for line in part["autoscaler_lines"])
    ratio = part["ratios"]["gpu_hours_real_over_sim"]
    assert ratio == sides["real"]["gpu_hours"] / sides["simulated"]["gpu_hours"]
