"""Writing a workload back as a spec: parse_workload of what workload_to_dict writes gives back
every field exactly, batch curves included."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from compass.errors import WorkflowError
from compass.workflow.batching import apply_batching
from compass.workflow.dag import Task, TaskProfile, Workflow
from compass.workflow.generate import generate_workload
from compass.workflow.spec import (
    Workload,
    load_workload,
    parse_workload,
    workload_to_dict,
    write_workload,
)

ROOT = Path(__file__).resolve().parents[3]
WORKLOADS = ROOT / "bench" / "workloads"


def assert_same(a: Workload, b: Workload) -> None:
    """Field for field (a Workflow compares by identity, so its parts are compared)."""
    assert (a.name, a.about, a.cluster, a.arrivals) == (b.name, b.about, b.cluster, b.arrivals)
    assert dict(a.models) == dict(b.models)
    assert dict(a.weights) == dict(b.weights)
    assert list(a.workflows) == list(b.workflows)
    for name, wf in a.workflows.items():
        other = b.workflows[name]
        assert (wf.order, wf.best_ms, wf.inputs) == (other.order, other.best_ms, other.inputs)
        assert (wf.slo_ms, wf.slo_x) == (other.slo_ms, other.slo_x)
        assert dict(wf.tasks) == dict(other.tasks), name


def round_trip(workload: Workload) -> Workload:
    # through JSON text, as a worker process reads it
    return parse_workload(json.loads(json.dumps(workload_to_dict(workload))), source="written")


def batch_spec() -> dict[str, Any]:
    """Every batch form, a timeout, a weight, a declared best time and awkward floats."""
    task = {"output_kb": 1.5, "after": []}
    return {
        "name": "batchy",
        "about": "every key the writer must carry",
        "cluster": {
            "workers": 3,
            "gpu_memory_mb": 1234.567,
            "h2d_gbps": 9.7,
            "d2h_gbps": 0.3,
            "net_gbps": 12.1,
            "net_fixed_us": 2.7,
        },
        "models": {"a": {"size_mb": 100.0001}, "b": {"size_mb": 7}},
        "workflows": {
            "f": {
                "weight": 0.3,
                "best_ms": 400.5,
                "slo_x": 4.5,
                "tasks": {
                    "item": {"model": "a", "exec_ms": 100.1, "batch_item": 0.07, **task},
                    "sized": {
                        "model": "a",
                        "exec_ms": 33.3,
                        "batch": 5,
                        "batch_item": 0.15,
                        **task,
                        "after": ["item"],
                    },
                    "table": {
                        "model": "b",
                        "batch_ms": [70.3, 91.1, 107.9],
                        "input_kb": 0,
                        **task,
                        "after": ["item"],
                    },
                    "longer": {
                        "model": "b",
                        "exec_ms": 20,
                        "batch": 6,
                        "batch_ms": [20, 23, 25.5],
                        **task,
                        "after": ["item"],
                    },
                    "plain": {"model": "b", "exec_ms": 5, "batch": 3, **task, "after": ["item"]},
                    "join": {
                        "model": None,
                        "exec_ms": 0.2,
                        "timeout_ms": 1500,
                        **task,
                        "after": ["sized", "table", "longer", "plain"],
                    },
                },
            },
            "g": {
                "slo_ms": 250.25,
                "tasks": {"one": {"model": "a", "exec_ms": 0, "input_kb": 3.3, **task}},
            },
        },
        "arrivals": {
            "mean_interval_ms_per_client": 333.3,
            "jobs": 77,
            "processes": ["gamma"],
            "gamma_cv": 2.5,
        },
    }


def test_every_batch_form_and_field_round_trips() -> None:
    workload = parse_workload(batch_spec(), source="batchy.json")
    tasks = workload.workflows["f"].tasks
    # the forms the writer has to reproduce: a linear curve, a table, a table shorter than batch
    assert tasks["item"].batch == 8 and len(tasks["item"].profile.batch_scale) == 8
    assert tasks["table"].profile.batch_scale[1] == pytest.approx(91.1 / 70.3)
    assert tasks["longer"].batch == 6 and len(tasks["longer"].profile.batch_scale) == 3
    assert tasks["plain"].batch == 3 and tasks["plain"].profile.batch_scale == ()
    # the workflows' default objectives
    assert (workload.workflows["f"].slo_x, workload.workflows["g"].slo_ms) == (4.5, 250.25)
    assert_same(workload, round_trip(workload))


def test_a_zero_ms_task_keeps_its_batch_curve() -> None:
    spec = batch_spec()
    spec["workflows"]["g"]["tasks"]["one"]["batch_item"] = 0.15
    workload = parse_workload(spec)
    assert workload.workflows["g"].tasks["one"].profile.exec_ms == 0
    # a curve the linear form cannot give back, on a task no table in ms can describe
    one = workload.workflows["g"].tasks["one"]
    odd = dataclasses.replace(one, profile=dataclasses.replace(one.profile, batch_scale=(1.0, 1.3)))
    flows = dict(workload.workflows)
    flows["g"] = Workflow("g", [odd])
    changed = dataclasses.replace(workload, workflows=flows)
    assert_same(changed, round_trip(changed))


@pytest.mark.parametrize("path", sorted(WORKLOADS.glob("*.json")), ids=lambda p: p.name)
@pytest.mark.parametrize("gain", [None, "none", "mild", "strong"])
def test_shipped_workloads_round_trip_with_every_curve(path: Path, gain: str | None) -> None:
    workload = apply_batching(load_workload(path), batching=True, gain=gain)
    assert_same(workload, round_trip(workload))


def test_generated_workloads_round_trip_batched_and_not() -> None:
    for seed in range(12):
        workload = generate_workload(seed)
        for changed in (
            apply_batching(workload, batching=False),
            apply_batching(workload, batching=True, gain="mild"),
        ):
            assert_same(changed, round_trip(changed))


def test_write_workload_gives_a_file_load_workload_reads_back(tmp_path: Path) -> None:
    workload = apply_batching(parse_workload(batch_spec()), batching=True, gain="strong")
    path = tmp_path / "written.json"
    write_workload(workload, path)
    assert_same(workload, load_workload(path))
    # the batch keys are the spec's own, readable by a person
    written = json.loads(path.read_text())["workflows"]["f"]["tasks"]
    assert written["item"]["batch_item"] == 0.07
    assert written["table"]["batch_ms"] == [70.3, 91.1, 107.9]


def test_a_task_with_a_function_has_no_spec_form() -> None:
    workload = parse_workload(batch_spec())
    real = Task("real", None, (), TaskProfile(1.0, 10), fn=lambda module, **kw: None)
    flows = {"f": Workflow("f", [real])}
    with pytest.raises(WorkflowError, match="'real' has a function"):
        workload_to_dict(dataclasses.replace(workload, workflows=flows))
