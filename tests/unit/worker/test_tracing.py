"""Job traces at the workers, sans-IO: sampling, spans travelling with a job's messages (once
per peer), the trace an ingress assembles, and its bounds. No loop, no sockets."""

from __future__ import annotations

import random
from typing import Any

import pytest

from compass.core.messages import JOB_INPUTS, DoneMsg, ResultMsg, TaskMsg
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.observe.tracing import TRACE_FIELD, Tracer, critical_path, task_span
from compass.trace import JobTrace, parse_traceparent
from compass.workflow import Task, TaskProfile, Workflow

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

# a -> (b, c) -> d: d joins b and c
DIAMOND = Workflow(
    "diamond",
    [
        Task("a", "m", (), TaskProfile(exec_ms=10, output_bytes=8)),
        Task("b", "m", ("a",), TaskProfile(exec_ms=10, output_bytes=8)),
        Task("c", "m", ("a",), TaskProfile(exec_ms=10, output_bytes=8)),
        Task("d", None, ("b", "c"), TaskProfile(exec_ms=10, output_bytes=8)),
    ],
)
PLAN = {"a": "w0", "b": "w1", "c": "w2", "d": "w1"}


def span(
    task: str, worker: str, queued: float, start: float, end: float, **more: Any
) -> dict[str, Any]:
    out = {
        "task": task, "att": 0, "worker": worker, "model": "m", "queued": queued,
        "start": start, "end": end, "transfer_s": 0.0, "load_s": 0.0, "exec_s": end - start,
        "hit": True, "batch": 1, "mates": [], "lane": 0, "error": "", "cause": "",
    }  # fmt: skip
    out.update(more)
    return out


def msg(task: str, source: str, attempt: int = 0) -> TaskMsg:
    return TaskMsg("j", attempt, "diamond", task, source, None, dict(PLAN), "w0")


def test_which_jobs_are_traced() -> None:
    off = Tracer(sample=0.0)
    assert off.start("a", forced=False, traceparent=None, received=0.0) is None
    assert off.start("b", forced=True, traceparent=None, received=0.0) is not None
    # a caller's sampled context traces the job only where spans are exported (follow_caller)
    assert off.start("c", forced=False, traceparent=CALLER, received=0.0) is None
    followed = off.start("d", forced=False, traceparent=CALLER, received=0.0, follow_caller=True)
    assert followed is not None
    unsampled = CALLER[:-2] + "00"
    not_followed = off.start(
        "e", forced=False, traceparent=unsampled, received=0.0, follow_caller=True
    )
    assert not_followed is None
    assert list(off.jobs) == ["b", "d"]
    # the job span joins the caller's trace, as its child
    caller = parse_traceparent(CALLER)
    assert caller is not None and followed.caller == caller
    assert followed.parent.trace_id == caller.trace_id and followed.parent.span_id != caller.span_id
    # sampling draws from the tracer's generator: a fraction of the jobs
    some = Tracer(sample=0.25, rng=random.Random(7))
    traced = sum(
        some.start(f"j{i}", forced=False, traceparent=None, received=0.0) is not None
        for i in range(2000)
    )
    assert 400 < traced < 600


def test_spans_travel_with_the_job_once_per_peer_and_reach_the_ingress() -> None:
    w0, w1, w2 = Tracer(), Tracer(), Tracer()
    ingress = w0.start("j", forced=True, traceparent=None, received=10.0)
    assert ingress is not None
    root = w0.outgoing(msg("a", JOB_INPUTS), "w0")  # to itself: a local root never leaves
    assert root is not None and root["pw"] == PLAN and "spans" not in root
    w0.planned("j", 0, PLAN, 10.001)
    w0.task_ended("j", span("a", "w0", 10.001, 10.001, 10.011))
    # a's output to b (w1) and c (w2): a's span goes to each, with the plan and the context
    to_w1, to_w2 = w0.outgoing(msg("b", "a"), "w1"), w0.outgoing(msg("c", "a"), "w2")
    assert to_w1 is not None and to_w2 is not None
    assert [s["task"] for s in to_w1["spans"]] == ["a"] and to_w1["pw"] == PLAN
    assert to_w1["tp"] == ingress.traceparent
    assert w1.incoming("j", to_w1) and w2.incoming("j", to_w2)
    assert w1.jobs["j"].planned == PLAN and w1.jobs["j"].parent == ingress.parent
    w1.task_ended("j", span("b", "w1", 10.012, 10.012, 10.022))
    w2.task_ended("j", span("c", "w2", 10.012, 10.012, 10.030))
    # c's output to the join on w1: w2 has not sent w1 anything, so a's span goes again (a
    # fan-in gets a span once per branch), never b's, which w1 ran
    c_out = w2.outgoing(msg("d", "c"), "w1")
    assert c_out is not None and [s["task"] for s in c_out["spans"]] == ["a", "c"]
    assert w1.incoming("j", c_out)
    # a second message to the same peer carries neither the plan nor a span again
    c_again = w2.outgoing(msg("d", "c"), "w1")
    assert c_again == {"tp": ingress.traceparent}
    w1.task_ended("j", span("d", "w1", 10.031, 10.031, 10.035, model=None, hit=None))
    # the sink's result to the ingress: b, c and d (w0 ran a itself), and nothing twice
    result = w1.outgoing(ResultMsg("j", 0, "d", None), "w0")
    assert result is not None and sorted(s["task"] for s in result["spans"]) == ["b", "c", "d"]
    again = w1.outgoing(ResultMsg("j", 0, "d", None), "w0")
    assert again is not None and "spans" not in again
    assert w0.incoming("j", result)
    record = {"workflow": "diamond", "plan": PLAN, "attempts": 1, "ok": True}
    done = w0.finish("j", record, DIAMOND, ingress="w0", answered=10.036)
    assert done is not None and "j" not in w0.jobs
    trace = JobTrace.from_json(w0.trace("j"))
    assert [t.task for t in trace.tasks] == ["a", "b", "c", "d"]
    assert {t.task: t.worker for t in trace.tasks} == PLAN
    assert trace.critical_path == ("a", "c", "d")  # c ended after b: the join waited for it
    assert trace.latency_ms == pytest.approx(36.0)
    # untraced messages carry nothing, and a done job is forgotten
    assert w2.outgoing(DoneMsg("j"), "w1") is None
    assert Tracer().outgoing(msg("b", "a"), "w1") is None
    w1.forget("j")
    assert "j" not in w1.jobs


def test_the_breakdown_adds_up_and_counts_planning_once() -> None:
    tracer = Tracer()
    tracing = tracer.start("j", forced=True, traceparent=None, received=100.0)
    assert tracing is not None
    # a local root: queued (and its model load begun) at submit, while the job was planned
    tracer.planned("j", 0, PLAN, 100.002)
    tracer.task_ended("j", span("a", "w0", 100.0, 100.0, 100.040, load_s=0.030, exec_s=0.010))
    b = span("b", "w1", 100.045, 100.050, 100.060, transfer_s=0.004, exec_s=0.010)
    tracer.task_ended("j", b)
    tracer.task_ended("j", span("c", "w0", 100.041, 100.041, 100.051, exec_s=0.010, att=1))
    tracer.task_ended("j", span("c", "w2", 100.041, 100.041, 100.051, exec_s=0.010))
    d = span("d", "w2", 100.062, 100.062, 100.070, transfer_s=0.001, exec_s=0.008)
    tracer.task_ended("j", d)
    moved = dict(PLAN, d="w1")  # planned on w1, moved to w2 by adjustment
    tracer.planned("j", 0, moved, 100.003)  # the plan as first made stays
    record = {"workflow": "diamond", "plan": {**PLAN, "d": "w2"}, "attempts": 1, "ok": True}
    tracer.finish("j", record, DIAMOND, ingress="w0", answered=100.072)
    trace = tracer.trace("j")
    assert trace is not None
    parts = trace["breakdown_ms"]
    assert trace["critical_path"] == ["a", "b", "d"]
    assert parts["planning"] == pytest.approx(2.0)
    assert parts["load"] == pytest.approx(28.0)  # 30 ms, less the 2 planning overlapped
    assert parts["queue"] == pytest.approx(5.0) and parts["transfer"] == pytest.approx(5.0)
    assert parts["exec"] == pytest.approx(28.0) and parts["result"] == pytest.approx(2.0)
    assert sum(parts.values()) == pytest.approx(trace["latency_ms"]) == pytest.approx(72.0)
    assert parts["other"] == pytest.approx(2.0)  # a's end to b's send, and the like
    by_task = {(t["task"], t["attempt"]): t for t in trace["tasks"]}
    assert by_task["d", 0]["planned_worker"] == "w1" and by_task["d", 0]["worker"] == "w2"
    # a span of another attempt is shown with its attempt, outside the breakdown
    assert by_task["c", 1]["worker"] == "w0"


def test_malformed_trace_fields_are_ignored() -> None:
    tracer = Tracer()
    good = {"tp": CALLER}
    for bad in (
        "x",
        {"tp": "nope"},
        {**good, "spans": [{"task": "a"}]},
        {**good, "spans": [span("a", "w0", 0.0, 0.0, float("nan"))]},
        {**good, "spans": [span("a", "w0", 0.0, 0.0, 1.0, batch=True)]},
        {**good, "spans": [span("a", "w0", 0.0, 0.0, 1.0, steps="3")]},
        {**good, "spans": [span("a", "w0", 0.0, 0.0, 1.0, steps=3, first_s=-1.0)]},
        {**good, "spans": [span("a", "w0", 0.0, 0.0, 1.0, steps=3, waited_s=float("inf"))]},
        {**good, "pw": {"a": 1}},
        {**good, "pa": "0"},
    ):
        assert not tracer.incoming("j", bad), bad
    assert not tracer.jobs
    assert tracer.incoming("j", good) and list(tracer.jobs) == ["j"]


def test_what_a_worker_holds_is_bounded() -> None:
    tracer = Tracer(keep=2, max_jobs=3)
    for i in range(5):
        tracer.start(f"j{i}", forced=True, traceparent=None, received=float(i))
    assert list(tracer.jobs) == ["j2", "j3", "j4"]  # the oldest go: their done never came
    record = {"workflow": "diamond", "plan": PLAN, "attempts": 1, "ok": True}
    for job in ("j2", "j3", "j4"):
        tracer.finish(job, record, DIAMOND, ingress="w0", answered=10.0)
    assert list(tracer.kept) == ["j3", "j4"] and tracer.traced == 3
    assert [t["job"] for t in tracer.recent(5)] == ["j3", "j4"]
    assert tracer.recent(1)[0]["job"] == "j4" and tracer.recent(0) == []
    assert tracer.trace("j2") is None
    # keeping none, the last one answered is still there for the client that asked for it
    none = Tracer(keep=0)
    none.start("j", forced=True, traceparent=None, received=0.0)
    none.finish("j", record, DIAMOND, ingress="w0", answered=1.0)
    assert not none.kept and none.recent(5) == []
    last = none.trace("j")
    assert last is not None and last["job"] == "j"


def test_a_task_span_holds_wall_times_real_seconds_and_its_batch_mates() -> None:
    def entry(job: str) -> QueuedTask:
        return QueuedTask(
            job_id=job, attempt=0, workflow="diamond", task="b", model="m", expected_s=0.01,
            inputs={}, plan=PLAN, ingress="w0", enqueued_at=10.0, started_at=12.0,
            transfer_s=0.5,
        )  # fmt: skip

    run = (entry("j1"), entry("j2"), entry("j3"))
    outcome = TaskOutcome(run[1], exec_s=0.5, fetch_s=0.25, cache_hit=False, batch=3, run=run,
                          lane=1)  # fmt: skip
    # an emulated worker at time scale 0.1: its clock's seconds are 0.1 real ones
    made = task_span(outcome, "w1", wall=1000.0, now=13.0, scale=0.1)
    assert made["mates"] == ["j1", "j3"] and made["batch"] == 3 and made["lane"] == 1
    assert made["queued"] == pytest.approx(999.7) and made["start"] == pytest.approx(999.9)
    assert made["exec_s"] == pytest.approx(0.05) and made["load_s"] == pytest.approx(0.025)
    assert made["transfer_s"] == pytest.approx(0.05) and made["hit"] is False
    assert critical_path(DIAMOND, {}) == []


def test_the_trace_field_name_is_short_and_optional() -> None:
    # a message of an untraced job is exactly what it was before tracing existed
    assert TRACE_FIELD not in msg("a", JOB_INPUTS).to_wire()
    assert TaskMsg.from_wire({**msg("a", JOB_INPUTS).to_wire(), TRACE_FIELD: {}}) == msg(
        "a", JOB_INPUTS
    )


def test_a_step_wise_task_span_sums_up_its_steps_and_the_trace_its_first_output() -> None:
    tracer = Tracer()
    tracer.start("j", forced=True, traceparent=None, received=100.0)
    entry = QueuedTask(
        job_id="j", attempt=0, workflow="diamond", task="a", model="m", expected_s=0.01,
        inputs={}, plan=PLAN, ingress="w0", enqueued_at=10.0, started_at=10.0,
    )  # fmt: skip
    outcome = TaskOutcome(entry, exec_s=0.5, steps=10, first_step_s=0.05, waited_s=0.2)
    made = task_span(outcome, "w0", wall=100.6, now=10.5, scale=2.0)  # real: twice the clock
    assert (made["steps"], made["first_s"], made["waited_s"]) == (10, 0.1, 0.4)
    assert "steps" not in task_span(TaskOutcome(entry, exec_s=0.5), "w0", wall=1, now=1, scale=1)
    tracer.task_ended("j", made)
    tracer.first_output("j", 100.3)
    tracer.first_output("j", 100.5)  # the first one counts
    record = {"workflow": "diamond", "plan": PLAN, "attempts": 1, "ok": True}
    tracer.finish("j", record, DIAMOND, ingress="w0", answered=101.0)
    trace = JobTrace.from_json(tracer.trace("j"))
    assert trace.first_output_ms == pytest.approx(300.0)
    (a,) = trace.tasks
    assert a.steps == 10 and a.first_step_ms == pytest.approx(100.0)
    assert a.waited_ms == pytest.approx(400.0)


def test_a_suspended_task_span_runs_from_its_first_start_and_counts_its_suspension() -> None:
    # queued at 10.0, first run from 10.2, suspended at 10.4 and resumed at 10.5, ended at
    # 11.0: its span covers both runs, its queue is its first wait, its suspension is apart
    tracer = Tracer()
    tracer.start("j", forced=True, traceparent=None, received=100.0)
    entry = QueuedTask(
        job_id="j", attempt=0, workflow="diamond", task="a", model="m", expected_s=0.01,
        inputs={}, plan=PLAN, ingress="w0", enqueued_at=10.0,
    )  # fmt: skip
    entry.begin(10.2)
    entry.suspended_at = 10.4
    entry.begin(10.5)
    outcome = TaskOutcome(entry, exec_s=0.4, steps=10, first_step_s=0.05)
    made = task_span(outcome, "w0", wall=101.0, now=11.0, scale=1.0)
    assert made["queued"] == pytest.approx(100.0) and made["start"] == pytest.approx(100.2)
    assert made["suspended_s"] == pytest.approx(0.1)
    tracer.task_ended("j", made)
    one = Workflow("one", [Task("a", "m", (), TaskProfile(exec_ms=10, output_bytes=8))])
    record = {"workflow": "one", "plan": {"a": "w0"}, "attempts": 1, "ok": True}
    tracer.finish("j", record, one, ingress="w0", answered=101.0)
    trace = JobTrace.from_json(tracer.trace("j"))
    (a,) = trace.tasks
    assert a.queued_ms == pytest.approx(200.0) and a.suspended_ms == pytest.approx(100.0)
    assert JobTrace.from_json(trace.to_json()).tasks[0].suspended_ms == pytest.approx(100.0)
    # waiting for a lane in all: 0.2 s before its first step, 0.1 s suspended
    assert trace.breakdown_ms["queue"] == pytest.approx(300.0)
