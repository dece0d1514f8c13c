"""`compass sim`: the comparison (compass.sim.compare) and its report (bench/sim_report.py):
JSON, PNG, the servers sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass._bench.sim_report import run_cli
from compass.errors import ConfigError
from compass.sim.compare import SimConfig, fewest_workers

PAPER = str(Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json")


def test_fewest_workers_bisects_to_the_first_that_meets_the_target() -> None:
    calls: list[int] = []

    def slowdown(n: int) -> float:
        calls.append(n)
        return 100.0 / n

    needed, seen = fewest_workers(slowdown, 1, 100, 4.0)
    assert needed == 25
    above = seen[24]
    assert seen[25] == 4.0 and above is not None and above > 4.0
    assert len(calls) == len(set(calls)) < 20  # no point computed twice, far fewer than 100


def test_fewest_workers_none_when_nothing_meets_the_target() -> None:
    needed, seen = fewest_workers(lambda n: None if n < 3 else 10.0, 1, 5, 2.0)
    assert needed is None
    assert set(seen) == {1, 2, 3, 4, 5}


def test_fewest_workers_when_the_lowest_already_meets_it() -> None:
    assert fewest_workers(lambda n: 1.0, 7, 40, 2.0)[0] == 7


def test_run_cli_writes_json_and_a_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    json_path = tmp_path / "out" / "sim.json"
    plot_path = tmp_path / "out" / "sim.png"
    config = SimConfig(
        PAPER, 5, ("compass", "hash"), jobs=120, servers_sweep=(2, 6), target_slowdown=3.0
    )
    out = run_cli(config, str(json_path), str(plot_path))
    written = json.loads(json_path.read_text())
    assert written["config"]["policies"] == ["compass", "hash"]
    assert written["config"]["jobs"] == 120
    assert set(written["results"]) == {"compass", "hash"}
    for summary in written["results"].values():
        assert summary["completed"] == 120
        assert "median_slowdown" in summary and "slowdown_by_workflow" in summary
    assert set(written["servers_needed"]) == {"compass", "hash"}
    for policy, needed in written["servers_needed"].items():
        assert needed is None or 2 <= needed <= 6
        if needed is not None:
            assert written["sweep"][policy][str(needed)] <= 3.0
    assert out["results"]["compass"] == written["results"]["compass"]
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "compass on 5 workers" in printed and "hash on 5 workers" in printed


def test_sim_config_rejects_unknown_names() -> None:
    with pytest.raises(ConfigError, match="unknown policy 'fastest'"):
        SimConfig(PAPER, 5, ("fastest",), jobs=10)
    with pytest.raises(ConfigError, match="unknown arrival process"):
        SimConfig(PAPER, 5, ("hash",), arrival="bursty", jobs=10)
