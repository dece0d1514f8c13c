"""Utilization at the objective by cluster size, calibrated in the simulator."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from compass.elastic.capacity import Calibration, DayCheck, day_margin, utilization_by_size
from compass.elastic.rule import ScaleConfig
from compass.errors import ConfigError
from compass.workflow.spec import Workload, load_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
SMALL = Calibration(jobs=150, jobs_per_worker=60, max_jobs=300, steps=3, margin=1.0)


@pytest.fixture(scope="module")
def paper() -> Workload:
    return load_workload(PAPER)


def test_a_larger_cluster_meets_the_objective_at_a_higher_utilization(paper: Workload) -> None:
    """Two workers cannot keep the paper's models resident and queue behind loads; four
    pool their queues: the table rises with the size, and the rule takes it as it is."""
    table = utilization_by_size(paper, (2, 4), config=SMALL)
    assert [n for n, _ in table] == [2, 4]
    (_, small), (_, large) = table
    assert 0 < small < large <= 1
    halved = utilization_by_size(paper, (2, 4), config=replace(SMALL, margin=0.5))
    assert [u for _, u in halved] == pytest.approx([u / 2 for _, u in table])
    assert ScaleConfig(by_size=table).need(1.0, 1.0, 1) >= 2


def test_bad_calibrations_are_refused(paper: Workload) -> None:
    with pytest.raises(ConfigError, match="sizes must be increasing"):
        utilization_by_size(paper, (4, 2))
    with pytest.raises(ConfigError, match="sizes must be increasing"):
        utilization_by_size(paper, ())
    with pytest.raises(ConfigError, match="margin"):
        Calibration(margin=0.0)
    with pytest.raises(ConfigError, match="seed"):
        Calibration(seeds=())


def test_day_margin_tries_margins_largest_first_until_the_day_meets_the_objective(
    paper: Workload,
) -> None:
    """A calibration day: the first margin whose day and burst meet the objective is taken;
    none meeting it (an objective no job can meet), every margin is tried and, none coming
    nearer than another, the largest kept; a smaller margin runs more workers."""
    table = ((2, 0.4), (6, 0.5))
    rule = ScaleConfig(maximum=12, band=0.06, by_size=table)
    check = DayCheck(minutes=40, start_s=5.0, burst_before=1, burst_after=0, share=0.5,
                     burst_share=0.5, margins=(1.0, 0.5))  # fmt: skip
    margin, tried = day_margin(paper, rule, lambda m: (2, 2), check)
    assert margin == 1.0 and [t["margin"] for t in tried] == [1.0]
    assert tried[0]["attainment"] >= 0.5 and tried[0]["burst_attainment"] >= 0.5
    never = replace(check, max_slowdown=0.5)  # below any job's best time
    margin, tried = day_margin(paper, rule, lambda m: (2, 2), never)
    assert margin == 1.0 and [t["margin"] for t in tried] == [1.0, 0.5]
    assert all(t["attainment"] == 0.0 for t in tried)
    assert tried[1]["gpu_hours"] > tried[0]["gpu_hours"]


def test_day_margin_refuses_what_it_cannot_judge(paper: Workload) -> None:
    with pytest.raises(ConfigError, match="by_size"):
        day_margin(paper, ScaleConfig(), lambda m: (1, 1))
    with pytest.raises(ConfigError, match="decreasing"):
        DayCheck(margins=(0.5, 1.0))
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        DayCheck(margins=(1.5,))
