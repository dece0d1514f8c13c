"""``bench defaults``: its variants, its summary arithmetic, and a tiny run end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from compass._bench import defaults
from compass._bench.defaults import KNOBS, PAPER_VARIANT, Knob, summarize, variants
from compass.sched.planner import CompassPolicy


def row(group: str, ratios: dict[str, float | None], se: float | None = 0.01) -> dict[str, object]:
    return {
        "group": group,
        "ratio": {"median2": ratios, "p95x3": dict.fromkeys(ratios)},
        "se": {"median2": dict.fromkeys(ratios, se), "p95x3": dict.fromkeys(ratios)},
    }


def test_summary_paper_ratio_generated_median_min_and_noise() -> None:
    rows = [
        row("paper", {"fifo": 0.8, "t1.5": 1.1}, se=0.05),
        row("generated", {"fifo": 1.0, "t1.5": 0.9}),
        row("generated", {"fifo": 0.6, "t1.5": None}),
        row("generated", {"fifo": 1.2, "t1.5": 1.3}),
        row("generated", {"fifo": 0.9, "t1.5": 0.7}, se=0.03),
    ]
    out = summarize(rows, ["fifo", "t1.5"], ["median2", "p95x3"])
    assert out["fifo"]["median2"] == {
        "paper": 0.8,
        "generated_median": pytest.approx(0.95),
        "generated_min": 0.6,
        "noise": 0.01,
    }
    # an undefined ratio is left out of the median and the minimum
    assert out["t1.5"]["median2"]["generated_median"] == pytest.approx(0.9)
    assert out["t1.5"]["median2"]["generated_min"] == 0.7
    assert out["t1.5"]["median2"]["paper"] == 1.1
    # nothing known at this SLO
    assert out["fifo"]["p95x3"] == dict.fromkeys(
        ("paper", "generated_median", "generated_min", "noise")
    )


def test_variants_change_one_knob_at_a_time_plus_the_paper_together() -> None:
    current = defaults.current_settings()
    policy = CompassPolicy()
    assert current["adjust_threshold"] == policy.options.adjust_threshold
    assert current["oldest_job_first"] is policy.oldest_job_first
    found = variants(KNOBS, current)
    for name, (_, settings) in found.items():
        if name == PAPER_VARIANT:
            continue
        assert len(settings) == 1
        ((setting, value),) = settings.items()
        assert value != current[setting]
        assert name == f"{setting}={value}"
    paper = found[PAPER_VARIANT][1]
    assert all(paper[k.setting] == k.paper for k in KNOBS if k.paper != current[k.setting])
    assert all(k.setting not in paper for k in KNOBS if k.paper == current[k.setting])


def test_no_paper_variant_when_it_equals_a_single_one() -> None:
    knob = Knob("queue order", "oldest_job_first", False, (True, False))
    assert variants([knob], {"oldest_job_first": True}) == {
        "oldest_job_first=False": ("queue order", {"oldest_job_first": False})
    }
    assert variants([knob, KNOBS[0]], {"oldest_job_first": False, "adjust_threshold": 1.5}) == {
        "oldest_job_first=True": ("queue order", {"oldest_job_first": True}),
        **{
            f"adjust_threshold={v}": ("threshold", {"adjust_threshold": v})
            for v in KNOBS[0].values
            if v != 1.5
        },
    }


def test_tiny_run_writes_json_with_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "defaults.json"
    knobs = [k for k in KNOBS if k.setting == "warms_cache"]
    out = defaults.run(
        replace(defaults.SEARCH, seeds=(0,), max_load=1.0),
        workloads=1,
        knobs=knobs,
        jobs=20,
        paper_workload=None,
        json_path=str(path),
    )
    written = json.loads(path.read_text())
    assert written["summary"].keys() == {"warms_cache=False"}
    (only,) = written["workloads"]
    assert only["group"] == "generated"
    for slo, ratios in only["ratio"].items():
        ours = only["capacity"][slo]["compass"]
        theirs = only["capacity"][slo]["warms_cache=False"]
        expected = None if not ours else (theirs or 0.0) / ours
        assert ratios["warms_cache=False"] == expected
    assert out["summary"] == written["summary"]
    assert "warming" in capsys.readouterr().out


def test_an_unknown_knob_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        defaults.main(["--knobs", "nonsense", "--workloads", "0"])
    assert "unknown knob 'nonsense'" in capsys.readouterr().err
