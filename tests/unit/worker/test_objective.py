"""A job's objective in the worker core, without a loop: refused when no plan meets its
deadline, its tasks ranked by priority and deadline, dropped (and the job answered, its other
work cleaned up) when a task would start too late, and the budget carried from hop to hop."""

from __future__ import annotations

import math
from typing import Any

import pytest

from compass.core.events import Answer, Received, RunTask, Send, Submit, TaskDone
from compass.core.messages import DoneMsg, FailedMsg, TaskMsg, decode
from compass.errors import (
    DeadlineExceeded,
    DeadlineUnreachable,
    InvalidInputs,
    ProtocolError,
    WorkflowError,
)
from compass.objective import NO_OBJECTIVE, Objective, check_objective

from .test_state import core, new_job_id, of, one, received, task_msg

# a chain of two 100 ms tasks: at least 0.2 s from submission to answer
CHAIN_S = 0.2


def submit_with(c: Any, objective: Objective, now: float = 0.0) -> tuple[str, list[Any]]:
    job = new_job_id(c)
    return job, c.handle(Submit(now, job, "chain", {"x": 1}, 8, now, None, objective))


def test_a_job_no_plan_can_finish_in_time_is_refused_at_once_with_the_estimate() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=5.0, b=5.0)  # every worker busy for 5 s
    job, steps = submit_with(c, Objective(deadline_s=1.0))
    answer = one(Answer, steps)
    assert isinstance(answer.error, DeadlineUnreachable)
    assert answer.error.job_id == job and answer.error.detail["deadline_ms"] == pytest.approx(1000)
    assert answer.error.detail["estimate_ms"] >= 5000 + CHAIN_S * 1000 - 1e-6
    assert "5" in answer.error.message and "1000.0 ms" in answer.error.message
    assert of(Send, steps) == [] and of(RunTask, steps) == []  # nothing of it ran
    assert not c.ingress.jobs and c.stats.jobs_unreachable == 1


def test_a_generous_deadline_runs_the_job_exactly_as_without_one() -> None:
    plain, _ = core("a", ("a", "b"))
    given, _ = core("a", ("a", "b"))
    _, without = submit_with(plain, NO_OBJECTIVE)
    _, within = submit_with(given, Objective(deadline_s=60.0))
    assert [type(s) for s in without] == [type(s) for s in within]
    (run,) = of(RunTask, within)
    assert run.entry.deadline == pytest.approx(60.0) and run.entry.level == 0


def test_finish_on_miss_skips_the_refusal() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=5.0, b=5.0)
    _, steps = submit_with(c, Objective(deadline_s=1.0, finish=True))
    assert of(Answer, steps) == [] and c.ingress.jobs


def _task_with_budget(budget_s: float | None, finish: bool = False, priority: int = 0) -> Any:
    msg = task_msg(plan={"a": "a", "b": "a"})
    return TaskMsg(
        msg.job, msg.attempt, msg.workflow, msg.task, msg.source, msg.value, msg.plan,
        msg.ingress, priority=priority, budget_s=budget_s, finish=finish,
    )  # fmt: skip


def test_a_task_that_would_start_too_late_is_dropped_and_its_ingress_told() -> None:
    c, _ = core("a", ("a", "w9"))
    # 0.15 s left, 0.2 s of critical path from this task on: the job cannot make it
    steps = c.handle(received(_task_with_budget(0.15), 1.0))
    assert of(RunTask, steps) == []
    (send,) = of(Send, steps)
    assert send.peer == "w9" and isinstance(send.msg, FailedMsg)
    assert send.msg.code == DeadlineExceeded.code and "too late" in send.msg.message
    assert c.stats.tasks_shed == 1 and c.lanes.shed == 1 and c.lanes.busy == 0
    # enough budget: it runs; asked to finish regardless: it runs too
    assert of(RunTask, c.handle(received(_task_with_budget(0.25), 2.0)))
    assert of(RunTask, c.handle(received(_task_with_budget(0.01, finish=True), 3.0)))


def test_the_budget_is_rebased_on_arrival_and_passed_on_less_the_time_spent() -> None:
    c, _ = core("a", ("a", "w9"))
    msg = _task_with_budget(5.0)
    (run,) = of(RunTask, c.handle(Received(10.0, "w9", msg, 0.5)))  # 0.5 s on the wire
    assert run.entry.deadline == pytest.approx(10.0 + 5.0 - 0.5)
    steps = c.handle(TaskDone(11.0, run.entry, "out-a"))  # b runs here too: passed to itself
    (run_b,) = of(RunTask, steps)
    assert run_b.entry.deadline == pytest.approx(14.5) and run_b.entry.task == "b"


def test_the_ingress_answers_a_dropped_job_once_and_tells_every_worker() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=100.0, b=0.0)  # planned on b
    job, steps = submit_with(c, Objective(deadline_s=30.0, priority=2))
    (sent,) = [s.msg for s in of(Send, steps)]
    assert isinstance(sent, TaskMsg) and sent.priority == 2
    assert sent.budget_s == pytest.approx(30.0) and not sent.finish
    why = "DeadlineExceeded: job x: task 'b' would start 12.0 ms too late; dropped"
    steps = c.handle(received(FailedMsg(job, 0, "b", "b", why, "", "deadline_exceeded"), 5.0, "b"))
    answer = one(Answer, steps)
    assert isinstance(answer.error, DeadlineExceeded) and answer.error.job_id == job
    assert answer.error.message.startswith("job x: task 'b'")
    dones = [s for s in of(Send, steps) if isinstance(s.msg, DoneMsg)]
    assert [s.peer for s in dones] == ["b"] and dones[0].msg.below is None
    assert c.stats.jobs_dropped == 1 and not c.ingress.jobs


def test_the_objective_travels_only_when_there_is_one_and_is_checked() -> None:
    plain = task_msg().to_wire()
    assert not {"pri", "dl", "fin"} & set(plain)
    wire = _task_with_budget(1.5, finish=True, priority=3).to_wire()
    back = decode("task", wire)
    assert isinstance(back, TaskMsg)
    assert (back.priority, back.budget_s, back.finish) == (3, 1.5, True)
    for key, bad in (("dl", math.nan), ("dl", "soon"), ("pri", 1.5), ("fin", 1)):
        with pytest.raises(ProtocolError, match=key):
            decode("task", {**plain, key: bad})


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"deadline_ms": 0}, "deadline_ms"),
        ({"deadline_ms": -5}, "deadline_ms"),
        ({"deadline_ms": math.inf}, "deadline_ms"),
        ({"deadline_ms": True}, "deadline_ms"),
        ({"priority": 10}, "priority"),
        ({"priority": -1}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"on_miss": "retry"}, "on_miss"),
    ],
)
def test_a_bad_objective_is_invalid_inputs(body: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInputs, match=error):
        Objective.from_wire(body)
    with pytest.raises(InvalidInputs, match=error):
        check_objective(
            body.get("deadline_ms"), body.get("priority", 0), body.get("on_miss", "drop")
        )


def test_an_emulated_worker_keeps_the_deadline_in_workload_time() -> None:
    assert Objective.from_wire({}) is NO_OBJECTIVE
    fast = Objective.from_wire({"deadline_ms": 100, "priority": 1, "on_miss": "finish"}, 0.5)
    assert fast == Objective(deadline_s=0.2, priority=1, finish=True)


def test_a_workflow_s_objective_is_the_deadline_of_a_job_without_one() -> None:
    from compass.workflow import Task, TaskProfile, Workflow

    from . import test_state

    tasks = [Task("a", "m", (), TaskProfile(exec_ms=100, output_bytes=10))]
    with pytest.raises(WorkflowError, match="slo_ms or slo_x"):
        Workflow("w", tasks, slo_ms=100, slo_x=2)
    with pytest.raises(WorkflowError, match="slo_x must be >= 1"):
        Workflow("w", tasks, slo_x=0.5)
    with pytest.raises(WorkflowError, match="slo_ms must be a number > 0"):
        Workflow("w", tasks, slo_ms=-1)
    timed = Workflow("timed", tasks, slo_x=3)
    test_state.WORKFLOWS["timed"] = timed
    try:
        c, _ = core("a", ("a",))
        job = new_job_id(c)
        c.handle(Submit(1.0, job, "timed", {"x": 1}, 8, 1.0))
        assert c.ingress.jobs[job].deadline == pytest.approx(1.0 + 3 * 0.1)  # 3x its best time
        own = new_job_id(c)
        c.handle(Submit(1.0, own, "timed", {"x": 1}, 8, 1.0, None, Objective(deadline_s=2.0)))
        assert c.ingress.jobs[own].deadline == pytest.approx(3.0)  # the job's own wins
    finally:
        del test_state.WORKFLOWS["timed"]


def test_a_higher_priority_job_is_admitted_by_the_waits_of_its_own_level() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=5.0, b=5.0)  # 5 s queued on each worker...
    view.lifted.update(a=(0.1,), b=(0.1,))  # ...but only 0.1 s runs before a level-1 task
    job, steps = submit_with(c, Objective(deadline_s=1.0, priority=1))
    assert of(Answer, steps) == [] and job in c.ingress.jobs  # admitted: it overtakes those queues
    assert view.priorities[-1] == 1  # planned and admitted on its level's waits
    (run,) = of(RunTask, steps)
    assert run.entry.level == 1
    _, steps = submit_with(c, Objective(deadline_s=1.0))  # the same deadline at level 0
    assert isinstance(one(Answer, steps).error, DeadlineUnreachable)
    view.lifted.update(a=(2.0,), b=(2.0,))  # 2 s of work of level 1 and above queued
    _, steps = submit_with(c, Objective(deadline_s=1.0, priority=1))
    assert isinstance(one(Answer, steps).error, DeadlineUnreachable)
