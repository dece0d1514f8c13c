"""``compass bench unfold``: the levers of planning a workflow decided at run time, searched
from the command line; its mistakes are one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compass._cli.main import main

#: a small agent: a model step, then one of two tools, back to the model, 1-3 steps
SPEC: dict[str, Any] = {
    "cluster": {"workers": 2, "gpu_memory_mb": 4000, "h2d_gbps": 10, "d2h_gbps": 10,
                "net_gbps": 10},
    "models": {"lm": {"size_mb": 1000}, "tool": {"size_mb": 200}},
    "workflows": {"agent": {
        "tasks": {
            "lm": {"model": "lm", "exec_ms": 40, "input_kb": 4, "output_kb": 4},
            "look": {"model": "tool", "exec_ms": 10, "output_kb": 4, "after": ["lm"]},
            "act": {"model": "tool", "exec_ms": 20, "output_kb": 4, "after": ["lm"]},
            "answer": {"exec_ms": 1, "output_kb": 1, "after": ["lm"]},
        },
        "branches": {"lm": {"look": 1, "act": 1}},
        "loops": {"think": {"body": ["lm", "look", "act"], "until": "lm", "max_iter": 3}},
    }},
    "arrivals": {"clients": "one per workflow", "mean_interval_ms_per_client": 200,
                 "jobs": 12},
}  # fmt: skip


def test_it_searches_each_variant_and_writes_compass_over_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "agent.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "unfold.json"
    with pytest.raises(SystemExit) as done:
        main(["bench", "unfold", "--workloads", str(spec), "--variants",
              "compass;compass-chained", "--seeds", "0,1", "--jobs", "12",
              "--json", str(out)])  # fmt: skip
    assert done.value.code == 0
    result = json.loads(out.read_text())
    found = result["agent"]["capacity_by_seed"]
    assert set(found) == {"compass", "compass-chained"} and result["seeds"] == [0, 1]
    for variant in found.values():
        assert set(variant) == {"median2", "p95x3", "p99x5"}
        assert all(v is None or v > 0 for values in variant.values() for v in values)
        assert all(len(values) == 2 for values in variant.values())
    assert result["agent"]["compass_over"]["compass"]["median2"] == 1.0
    assert "compass-chained" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--variants", "compass;fastest"], "--variants: unknown 'fastest'"),
        (["--variants", "jit"], "--variants: compass among them"),
        (["--workloads", "nowhere.json"], "nowhere.json"),
        (["--seeds", "2-1"], "seeds '2-1'"),
    ],
)
def test_a_mistake_is_one_line_before_any_search(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "unfold", *argv])
    assert done.value.code != 0
    err = capsys.readouterr().err
    assert problem in err and len(err.strip().splitlines()) == 1


def test_a_variant_with_preemption_runs_the_same_policy_with_it_on() -> None:
    from compass._bench import unfold

    assert unfold.variant("compass") == ("compass", {})
    assert unfold.variant("compass-chained, preempt") == ("compass-chained", {"preempt": True})
    policy, settings = unfold.variant("compass, path yardstick, preempt")
    assert policy == "compass"
    assert settings == {"policy_options": {"rank_yardstick": False}, "preempt": True}
    # the others are compared with compass, with preemption where compass itself is not there
    assert unfold.base_of(["compass-chained", "compass, preempt", "compass"]) == "compass, preempt"
    assert unfold.base_of(["jit"]) is None
