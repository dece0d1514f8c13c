"""A job's trace as the client gets it: its JSON form, checked; the W3C trace context."""

from __future__ import annotations

import math

import pytest

from compass.errors import ProtocolError
from compass.trace import (
    BREAKDOWN,
    JobTrace,
    TaskTrace,
    TraceParent,
    format_traceparent,
    parse_traceparent,
    seen_by_client,
)

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_traceparent_round_trips_and_a_malformed_one_is_ignored() -> None:
    parent = parse_traceparent(TP)
    assert parent == TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    assert format_traceparent(parent) == TP
    unsampled = parse_traceparent(TP[:-2] + "00")
    assert unsampled is not None and not unsampled.sampled
    for bad in (
        "",
        TP.upper(),  # the standard's hex is lower case
        "01" + TP[2:],  # an unknown version
        TP[:-1],
        "00-" + "0" * 32 + TP[35:],  # an all-zero trace id
        TP[:36] + "0" * 16 + "-01",  # an all-zero span id
        TP.replace("-", "_"),
    ):
        assert parse_traceparent(bad) is None, bad


def task(name: str = "embed", **changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "task": name, "worker": "w1", "planned_worker": "w0", "queued_ms": 2.0,
        "transfer_ms": 1.0, "load_ms": 40.0, "cache_hit": False, "exec_ms": 60.0, "batch": 3,
        "mates": ["w0-x-2", "w0-x-3"], "start": 100.0, "end": 100.1, "attempt": 1,
        "model": "small", "lane": 0, "error": "", "cause": "received:w0-x1/embed<JOB_INPUTS#3",
    }  # fmt: skip
    body.update(changes)
    return body


def job(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "job": "w0-x-1", "workflow": "pair", "latency_ms": 110.0, "tasks": [task()],
        "ingress": "w0", "start": 99.99, "end": 100.11, "ok": True, "error": "", "attempts": 2,
        "retries": 0, "trace_id": "ab" * 16,
        "breakdown_ms": dict.fromkeys(BREAKDOWN, 1.0), "critical_path": ["embed"],
    }  # fmt: skip
    body.update(changes)
    return body


def test_a_trace_round_trips_through_its_json_form() -> None:
    trace = JobTrace.from_json(job())
    assert trace.tasks == (
        TaskTrace("embed", "w1", "w0", 1.0, 2.0, 40.0, False, 60.0, 3, 100.0, 100.1, 1, "small",
                  ("w0-x-2", "w0-x-3"), 0, "", "received:w0-x1/embed<JOB_INPUTS#3"),
    )  # fmt: skip
    assert trace.attempts == 2 and trace.critical_path == ("embed",)
    assert JobTrace.from_json(trace.to_json()) == trace
    assert trace.to_json() == job()
    # the fields compass submit --trace-json promises, per task
    promised = {"task", "worker", "planned_worker", "queued_ms", "transfer_ms", "load_ms",
                "cache_hit", "exec_ms", "batch", "start", "end"}  # fmt: skip
    assert promised <= set(trace.to_json()["tasks"][0])


def test_a_step_wise_task_and_a_streamed_job_round_trip_with_their_steps() -> None:
    steps = task(steps=12, first_step_ms=4.5, waited_ms=20.0)
    body = job(tasks=[steps], first_output_ms=6.0)
    trace = JobTrace.from_json(body)
    (gen,) = trace.tasks
    assert (gen.steps, gen.first_step_ms, gen.waited_ms) == (12, 4.5, 20.0)
    assert trace.first_output_ms == 6.0
    assert trace.to_json() == body
    plain = JobTrace.from_json(job())  # none of them: a plain task, a job not streamed
    assert (plain.tasks[0].steps, plain.tasks[0].first_step_ms, plain.first_output_ms) == (
        0, None, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        job(first_output_ms="6"),
        job(first_output_ms=math.nan),
        job(tasks=[task(steps=-1)]),
        job(tasks=[task(steps=2.0)]),
        job(tasks=[task(steps=2, first_step_ms=math.inf)]),
        job(tasks=[task(steps=2, waited_ms=None)]),
        job(job=None),
        job(latency_ms=math.nan),
        job(latency_ms=True),
        job(tasks={"embed": task()}),
        job(attempts=-1),
        job(ok="yes"),
        job(ok=1),
        job(breakdown_ms={"exec": "1"}),
        job(critical_path=[1]),
        job(tasks=[task(mates=[1])]),
        job(tasks=[task(cache_hit=1)]),
        job(tasks=[task(exec_ms=math.inf)]),
        job(tasks=[task(batch=1.0)]),
        job(tasks=[task(worker=None)]),
        job(tasks=["embed"]),
        [],
    ],
)
def test_a_malformed_trace_is_a_protocol_error(bad: object) -> None:
    with pytest.raises(ProtocolError, match="trace"):
        JobTrace.from_json(bad)


def test_the_client_hop_is_the_client_latency_less_the_ingress_latency() -> None:
    seen = JobTrace.from_json(seen_by_client(job(), latency_ms=113.5, retries=1))
    assert seen.latency_ms == 113.5 and seen.retries == 1
    assert seen.breakdown_ms["client"] == pytest.approx(1.0 + 3.5)
    rest = len(BREAKDOWN) - 1.0  # every part but the client's, 1 ms each
    assert sum(seen.breakdown_ms.values()) - rest == pytest.approx(4.5)  # the rest unchanged


def test_the_clients_import_of_torch_is_named_apart_from_its_hop() -> None:
    seen = JobTrace.from_json(seen_by_client(job(), latency_ms=1113.5, retries=0, import_ms=1000))
    assert seen.breakdown_ms["import"] == pytest.approx(1.0 + 1000.0)
    assert seen.breakdown_ms["client"] == pytest.approx(1.0 + 3.5)  # the hop alone
    assert sum(seen.breakdown_ms.values()) == pytest.approx(len(BREAKDOWN) + 1003.5)
