"""Utilization at the objective by cluster size, calibrated in the simulator."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from compass.elastic.capacity import Calibration, utilization_by_size
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
