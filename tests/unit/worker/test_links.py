"""A link that breaks may have lost what was on the way: the jobs of those messages are planned
again (issue 24's hang: a worker declared dead discards nothing it sends, the peer that
declared it does, and the job's ingress, which lost neither, waited forever)."""

from __future__ import annotations

from compass.errors import JobFailed, WorkerUnavailable
from compass.worker.events import PeerJoined, PeerLost, RunTask, Send, TaskDone, TaskFailed
from compass.worker.messages import DoneMsg, FailedMsg, ResultMsg, TaskMsg
from compass.worker.sent import SentLog
from compass.worker.state import WorkerCore

from .test_state import core, of, one, received, submit, task_msg

#: job w9-1's plan: its root a runs here (b), its sink b on c; w9 is its ingress
PLAN = {"a": "b", "b": "c"}


def _pushed(c: WorkerCore) -> None:
    """Worker b runs w9-1's root and pushes its output on to c."""
    run = one(RunTask, c.handle(received(task_msg(plan=PLAN), 0.0)))
    (push,) = of(Send, c.handle(TaskDone(0.5, run.entry, "out-a")))
    assert push.peer == "c" and isinstance(push.msg, TaskMsg) and push.msg.task == "b"


def test_a_push_on_a_link_that_broke_has_the_ingress_plan_the_job_again() -> None:
    # the events of the hang, at the worker that pushed: c declared b dead (a false suspicion
    # on a starved machine) and closed their connection; b, slow to notice, pushed w9-1's
    # output on it, which c discarded; then b reconnected to c. The ingress w9 lost neither
    c, _ = core("b", ("b", "c", "w9"), policy="round_robin")
    _pushed(c)
    steps = c.handle(PeerJoined(2.0, "c", "same-process"))
    (report,) = of(Send, steps)
    assert report.peer == "w9"
    msg = report.msg
    assert isinstance(msg, FailedMsg) and msg.code == WorkerUnavailable.code
    assert (msg.job, msg.attempt, msg.task, msg.worker) == ("w9-1", 0, "a", "b")
    assert c.handle(PeerJoined(3.0, "c", "same-process")) == []  # told once


def test_so_does_a_push_to_a_peer_declared_dead_here() -> None:
    c, _ = core("b", ("b", "c", "w9"), policy="round_robin")
    _pushed(c)
    (report,) = of(Send, c.handle(PeerLost(2.0, "c")))
    assert report.peer == "w9" and isinstance(report.msg, FailedMsg)
    assert report.msg.code == WorkerUnavailable.code


def test_a_job_done_or_planned_again_is_not_reported() -> None:
    c, _ = core("b", ("b", "c", "w9"), policy="round_robin")
    _pushed(c)
    c.handle(received(DoneMsg("w9-1", None), 1.0))  # answered
    assert c.handle(PeerJoined(2.0, "c", "same-process")) == []
    assert len(c.sent) == 0
    c2, _ = core("b", ("b", "c", "w9"), policy="round_robin")
    _pushed(c2)
    c2.handle(received(DoneMsg("w9-1", 1), 1.0))  # attempt 0 was planned again
    assert c2.handle(PeerJoined(2.0, "c", "same-process")) == []


def test_a_root_an_ingress_sent_on_a_link_that_broke_is_planned_again() -> None:
    # the other hung job: the ingress sent a re-planned root to b just after b had declared it
    # dead; b discarded it, and came back. The ingress plans the job once more
    c, view = core("a", ("a", "b"))
    view.waits["a"] = 100.0  # busy: the root goes to b
    job = submit(c)
    steps = c.handle(PeerJoined(2.0, "b", "same-process"))
    assert c.jobs[job].attempt == 1
    roots = [s.msg for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]
    assert [(m.job, m.attempt, m.task) for m in roots] == [(job, 1, "a")]


def test_a_result_sent_to_an_ingress_declared_dead_is_reported_when_it_comes_back() -> None:
    # the ingress is the peer: nobody to tell while it is gone, so it hears on its return
    c, _ = core("b", ("b", "w9"), policy="round_robin")
    run = one(RunTask, c.handle(received(task_msg(task="b", source="a", value=1.0,
                                                  plan={"a": "w9", "b": "b"}), 0.0)))  # fmt: skip
    (result,) = of(Send, c.handle(TaskDone(0.5, run.entry, "out-b")))
    assert isinstance(result.msg, ResultMsg) and result.peer == "w9"
    assert c.handle(PeerLost(1.0, "w9")) == []
    (report,) = of(Send, c.handle(PeerJoined(2.0, "w9", "same-process")))
    assert report.peer == "w9" and isinstance(report.msg, FailedMsg)
    assert (report.msg.job, report.msg.task, report.msg.code) == ("w9-1", "b", "unavailable")


def test_a_failure_report_on_a_link_that_broke_is_sent_again_as_it_was() -> None:
    # a task's own failure must still fail its job, not have it planned again
    c, _ = core("b", ("b", "w9"), policy="round_robin")
    run = one(RunTask, c.handle(received(task_msg(plan={"a": "b", "b": "b"}), 0.0)))
    (failed,) = of(Send, c.handle(TaskFailed(0.5, run.entry, "ValueError: boom")))
    steps = c.handle(PeerJoined(2.0, "w9", "same-process"))
    assert [(s.peer, s.msg) for s in of(Send, steps)] == [("w9", failed.msg)]
    assert failed.msg.code == JobFailed.code


def test_the_log_keeps_the_newest_attempt_of_a_job_a_peer_and_forgets_by_attempt() -> None:
    log = SentLog(limit=2)
    log.note("c", task_msg(job="j", attempt=0, task="b", source="a", value=1))
    log.note("c", task_msg(job="j", attempt=1, task="b", source="a", value=1))
    log.note("d", ResultMsg("j", 1, "b", 1))
    log.forget("j", 1)  # below attempt 1: nothing of the newest goes
    assert [(s.job, s.attempt, s.task, s.ingress) for s in log.take("c")] == [("j", 1, "a", "w9")]
    log.forget("j")
    assert log.take("d") == [] and len(log) == 0
    for job in ("j1", "j2", "j3"):  # bounded: the oldest job goes first
        log.note("c", task_msg(job=job))
    assert [s.job for s in log.take("c")] == ["j2", "j3"]
