"""Streamed edges in workload specs and in the simulator: a task's ``streamed`` predecessors,
the successor started at the first step and ended after the last, with the same core."""

from __future__ import annotations

from typing import Any

import pytest

from compass.errors import WorkflowError
from compass.sim import Arrival
from compass.workflow import parse_workload
from compass.workflow.spec import workload_to_dict

from ..sim.test_engine import hand_workload, run


def pipeline(streamed: bool, steps: int = 10, step_ms: float = 10.0) -> dict[str, Any]:
    """generate -> translate -> synthesize, three models, each ``steps`` steps."""
    tasks: dict[str, Any] = {
        "generate": {"model": "g", "steps": steps, "step_ms": step_ms, "output_kb": 10},
        "translate": {"model": "t", "steps": steps, "step_ms": step_ms, "output_kb": 10,
                      "after": ["generate"]},
        "synthesize": {"model": "s", "steps": steps, "step_ms": step_ms, "output_kb": 10,
                       "after": ["translate"]},
    }  # fmt: skip
    if streamed:
        tasks["translate"]["streamed"] = ["generate"]
        tasks["synthesize"]["streamed"] = ["translate"]
    return {"speak": {"tasks": tasks}}


MODELS: dict[str, float] = {"g": 100, "t": 100, "s": 100}


def test_a_spec_declares_streamed_predecessors_and_writes_them_back() -> None:
    workload = hand_workload(MODELS, pipeline(streamed=True))
    flow = workload.workflows["speak"]
    assert flow.tasks["translate"].streamed == {"generate"}
    assert flow.streamed_succs("generate") == ("translate",)
    again = parse_workload(workload_to_dict(workload))
    assert again.workflows["speak"].tasks["synthesize"].streamed == {"translate"}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"streamed": ["nobody"]}, "not in its 'after'"),
        ({"streamed": "generate"}, r"speak\.tasks\.translate\.streamed"),
    ],
)
def test_a_bad_streamed_key_names_what_is_wrong(change: dict[str, Any], match: str) -> None:
    flows = pipeline(streamed=True)
    flows["speak"]["tasks"]["translate"].update(change)
    with pytest.raises(WorkflowError, match=match):
        hand_workload(MODELS, flows)


def test_a_stream_from_a_task_of_one_step_is_refused() -> None:
    flows = pipeline(streamed=True)
    del flows["speak"]["tasks"]["generate"]["steps"]
    flows["speak"]["tasks"]["generate"]["exec_ms"] = 100
    with pytest.raises(WorkflowError, match="does not run in steps"):
        hand_workload(MODELS, flows)


def simulate(streamed: bool) -> Any:
    workload = hand_workload(MODELS, pipeline(streamed))
    # jobs far apart: each runs alone on a warm cluster of three
    arrivals = [Arrival(i * 1.0, "speak", 0) for i in range(4)]
    return run(workload, arrivals, warm_start=True, workers=3)


def test_a_streamed_pipeline_outputs_first_at_the_first_steps_and_ends_after_the_last() -> None:
    streamed, plain = simulate(True), simulate(False)
    assert all(job.latency_s is not None for job in streamed.jobs + plain.jobs)
    for job in plain.jobs:  # three stages one after the other: 300 ms, first output past 200
        assert job.latency_s is not None and job.ttfo_s is not None
        assert job.latency_s > 0.299 and job.ttfo_s > 0.209
    for job in streamed.jobs:
        assert job.latency_s is not None and job.ttfo_s is not None
        # the synthesizer's first step follows the first steps of the two before it...
        assert 0.03 <= job.ttfo_s < 0.06
        # ...and each stage ends one of its steps after the one it reads: 100 + 10 + 10 ms
        assert 0.12 <= job.latency_s < 0.15
        assert job.slowdown is not None and job.slowdown >= 1.0  # its best time knows it
    for record in streamed.tasks:  # each stage ran on a worker of its own, all at once
        assert record.worker in ("w0", "w1", "w2")
    by_job: dict[str, set[str]] = {}
    for record in streamed.tasks:
        by_job.setdefault(record.job_id, set()).add(record.worker)
    assert all(len(workers) == 3 for workers in by_job.values())


def test_streamed_edges_on_one_worker_wait_for_its_lane_and_still_finish() -> None:
    workload = hand_workload(MODELS, pipeline(True))
    arrivals = [Arrival(i * 0.05, "speak", 0) for i in range(6)]
    result = run(workload, arrivals, warm_start=True, workers=1)
    assert [job.outcome for job in result.jobs] == ["ok"] * 6
