"""Batch profiles: the curve a spec declares, the switches for a whole workload, and what a
worker learns of a batch's cost online."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compass.errors import ConfigError, WorkflowError
from compass.workflow import Profiles, Task, TaskProfile, load_workload, parse_workload
from compass.workflow.batching import apply_batching
from compass.workflow.dag import batch_scale, linear_scale

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"


def spec(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "b",
        "cluster": {
            "workers": 1,
            "gpu_memory_mb": 1000,
            "h2d_gbps": 10,
            "d2h_gbps": 10,
            "net_gbps": 1,
            "net_fixed_us": 0,
        },
        "models": {"m": {"size_mb": 100}},
        "workflows": {"w": {"tasks": {"t": {"model": "m", "output_kb": 1, **task}}}},
    }


def task_of(data: dict[str, Any]) -> Task:
    return parse_workload(spec(data)).workflows["w"].tasks["t"]


def test_a_curve_is_a_per_item_fraction_or_a_per_size_table() -> None:
    item = task_of({"exec_ms": 100, "batch": 4, "batch_item": 0.15})
    assert item.batch == 4
    assert item.profile.batch_ms(3) == pytest.approx(130.0)
    table = task_of({"batch_ms": [100, 110, 125]})
    assert table.batch == 3 and table.profile.exec_ms == 100
    assert table.profile.batch_scale == pytest.approx((1.0, 1.1, 1.25))
    # past the table each item adds its last step
    assert table.profile.batch_ms(5) == pytest.approx(155.0)
    alone = task_of({"exec_ms": 100, "batch": 4})
    assert alone.batch == 4 and alone.profile.batch_ms(4) == pytest.approx(400.0)
    assert task_of({"exec_ms": 100}).batch == 1


@pytest.mark.parametrize(
    ("task", "says"),
    [
        ({"exec_ms": 1, "batch": 0}, "batch: must be >= 1"),
        ({"exec_ms": 1, "batch_item": 1.5}, "batch_item: must be at most 1"),
        ({"batch_ms": [100, 90]}, "batch_ms: must start above 0 and never fall"),
        ({"batch_ms": "fast"}, "batch_ms: expected a list of milliseconds"),
        ({"batch_ms": [1, 2], "batch_item": 0.1}, "give batch_item or batch_ms, not both"),
    ],
)
def test_a_bad_batch_profile_names_its_key(task: dict[str, Any], says: str) -> None:
    with pytest.raises(WorkflowError, match=says):
        task_of(task)


def test_only_a_task_with_a_model_batches_and_a_curve_never_falls() -> None:
    with pytest.raises(WorkflowError, match="only a task with a model batches"):
        Task("t", None, (), TaskProfile(1.0, 0), batch=2)
    with pytest.raises(WorkflowError, match=r"start at 1\.0 and never fall"):
        TaskProfile(1.0, 0, batch_scale=(1.0, 0.9))
    assert batch_scale((), 3) == 3.0 and batch_scale((1.0, 1.5), 1) == 1.0


def test_switches_turn_batching_off_or_give_model_tasks_a_curve() -> None:
    paper = load_workload(PAPER)
    mild = apply_batching(paper, batching=True, gain="mild")
    generate = mild.workflows["translation"].tasks["generate"]
    assert generate.batch == 8 and generate.profile.batch_scale == linear_scale(0.15, 8)
    assert mild.workflows["translation"].tasks["aggregate"].batch == 1  # no model
    off = apply_batching(mild, batching=False)
    assert all(t.batch == 1 for wf in off.workflows.values() for t in wf.tasks.values())
    # a task's own curve wins over the switch's
    own = parse_workload(spec({"exec_ms": 100, "batch": 2, "batch_item": 0.5}))
    kept = apply_batching(own, batching=True, gain="strong").workflows["w"].tasks["t"]
    assert kept.batch == 2 and kept.profile.batch_scale == (1.0, 1.5)
    with pytest.raises(ConfigError, match="unknown batch gain 'huge'"):
        apply_batching(paper, batching=True, gain="huge")


def test_a_worker_learns_a_batch_curve_per_size_and_keeps_it_monotone() -> None:
    workload = parse_workload(spec({"exec_ms": 100, "batch": 4, "batch_item": 0.5}))
    profiles = Profiles.from_workload(workload, alpha=1.0)
    assert profiles.batch_scale("w", "t", "w0") == (1.0, 1.5, 2.0, 2.5)
    profiles.observe_batch("w", "t", "w0", 3, 0.12)  # a batch of 3 took 1.2 runs, not 2
    learned = profiles.batch_scale("w", "t", "w0")
    assert learned[2] == pytest.approx(1.2)
    # the guess for 2 items cannot exceed the measured cost of 3; for 4 it stays declared
    assert learned[1] == pytest.approx(1.2) and learned[3] == pytest.approx(2.5)
    profiles.observe_batch("w", "t", "w0", 4, 0.05)  # noise below a smaller batch's cost
    assert profiles.batch_scale("w", "t", "w0")[3] == pytest.approx(1.2)
    assert profiles.batch_scale("w", "t", "w1") == (1.0, 1.5, 2.0, 2.5)  # per worker
    profiles.observe_batch("w", "t", "w0", 1, 0.2)  # size 1 is a plain measurement
    assert profiles.exec_s("w", "t", "w0") == pytest.approx(0.2)


def test_a_learned_batch_cost_reaches_the_planners_cost_tables() -> None:
    from compass.sched.cost import CostCache

    workload = parse_workload(spec({"exec_ms": 100, "batch": 4, "batch_item": 0.5}))
    profiles = Profiles.from_workload(workload, alpha=1.0)
    wf = workload.workflows["w"]
    cache = CostCache()
    before = cache.get(wf, profiles, ("w0",))
    table = before.batch_scales[0]
    assert table is not None and table[0, 3] == pytest.approx(2.0)  # declared: 3 items, 2 runs
    version = profiles.workflow_version("w")
    profiles.observe_batch("w", "t", "w0", 3, 0.12)  # measured: 1.2 runs
    assert profiles.workflow_version("w") != version
    after = cache.get(wf, profiles, ("w0",))
    table = after.batch_scales[0]
    assert after is not before and table is not None and table[0, 3] == pytest.approx(1.2)
    # a measurement within the tolerance leaves the tables as they are
    version = profiles.workflow_version("w")
    profiles.observe_batch("w", "t", "w0", 3, 0.1201)
    assert profiles.workflow_version("w") == version
    assert cache.get(wf, profiles, ("w0",)) is after
