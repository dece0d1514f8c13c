"""Step-wise tasks in workload specs and in the simulator: ``steps`` and ``step_ms`` in a spec,
and a job's time to first output (its step-wise sink's first step, one hop on) in every result.
"""

from __future__ import annotations

from typing import Any

import pytest

from compass.errors import WorkflowError
from compass.sim import Arrival
from compass.workflow import parse_workload
from compass.workflow.spec import workload_to_dict

from .test_engine import hand_workload, run


def generating(steps: int, step_ms: float) -> dict[str, Any]:
    return {
        "gen": {
            "tasks": {
                "prompt": {"model": None, "exec_ms": 1, "output_kb": 1},
                "write": {"model": "lm", "steps": steps, "step_ms": step_ms, "output_kb": 20,
                          "after": ["prompt"]},
            }
        },
        "plain": {
            "tasks": {
                "prompt": {"model": None, "exec_ms": 1, "output_kb": 1},
                "write": {"model": "lm", "exec_ms": steps * step_ms, "output_kb": 20,
                          "after": ["prompt"]},
            }
        },
    }  # fmt: skip


def test_a_spec_gives_a_task_steps_and_step_ms_and_writes_them_back() -> None:
    workload = hand_workload({"lm": 100}, generating(40, 5.0))
    write = workload.workflows["gen"].tasks["write"].profile
    assert write.steps == 40 and write.exec_ms == 200.0 and write.step_ms == 5.0
    assert workload.workflows["plain"].tasks["write"].profile.steps == 1
    again = parse_workload(workload_to_dict(workload))
    assert again.workflows["gen"].tasks["write"].profile == write


def test_a_spec_with_bad_steps_names_the_field() -> None:
    flows = generating(40, 5.0)
    flows["gen"]["tasks"]["write"]["steps"] = 0
    with pytest.raises(WorkflowError, match=r"gen\.tasks\.write\.steps"):
        hand_workload({"lm": 100}, flows)


def test_the_first_output_of_a_step_wise_sink_comes_after_its_first_step() -> None:
    workload = hand_workload({"lm": 100}, generating(40, 5.0))
    arrivals = [Arrival(i * 1.0, wf, 0) for i, wf in enumerate(["gen", "plain"] * 3)]
    result = run(workload, arrivals, warm_start=True)
    by_workflow: dict[str, list[Any]] = {}
    for job in result.jobs:
        by_workflow.setdefault(job.workflow, []).append(job)
    for job in by_workflow["plain"]:  # a plain sink's first output is the answer
        assert job.ttfo_s == job.latency_s
    for job in by_workflow["gen"]:
        assert job.latency_s is not None and job.ttfo_s is not None
        # 200 ms of steps end the job; its first output is out after one 5 ms step
        assert job.latency_s > 0.2 and job.ttfo_s < job.latency_s - 0.19
        assert job.ttfo_s > 0.005
    summary = result.summary()
    assert summary["ttfo_p50_ms"] < summary["p50_ms"]
