"""The worker core's stimulus log: every event it handles, with its cause id and what it
decided, kept in a bounded ring and read back by job (``story(job_id)``)."""

from __future__ import annotations

from compass.core.events import Answer, Heard, Received, RunTask, Send, Submit, TaskDone, Tick
from compass.core.messages import ResultMsg
from compass.sched import Heartbeat

from .test_state import GB, core, new_job_id, of, run_locally


def test_the_story_of_a_job_is_every_event_that_touched_it_with_what_it_decided() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=100.0)  # a's queue is long: the job's tasks go to b
    job = new_job_id(c)
    other = new_job_id(c)
    sent = c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0, cause="client-7"))
    c.handle(Submit(0.5, other, "chain", {"x": 2}, 8, 0.5))
    (send,) = of(Send, sent)
    (answer,) = of(Answer, c.handle(Received(2.0, "b", ResultMsg(job, 0, "b", "B"))))
    story = c.story(job)
    # its submit (the client's cause id kept), then the result that answered it; not the
    # other job's events
    assert [s.cause for s in story] == ["client-7", f"received:result:{job}#3"]
    first, last = story
    assert first.event == f"submit:{job}#1" and first.now == 0.0
    assert first.did == (f"send task {job}/a to b",) and send.peer == "b"
    assert {job, "b"} <= set(first.about) and other not in first.about
    # the job is done: b is told to drop it, and the client gets its one answer
    assert last.did == (f"send done {job} to b", f"answer {job}: ok") and answer.value == "B"
    # a cause id seen in a log line finds its event; so does the peer the job went to
    assert c.story("client-7") == [first]
    assert first in c.story("b") and all(other not in s.about for s in c.story(job))


def test_the_log_is_bounded_and_skips_heartbeats_and_ticks_that_decided_nothing() -> None:
    c, _ = core("a", ("a",), keep_stimuli=4)
    for i in range(6):
        c.handle(Heard(float(i), Heartbeat("b", 0.0, frozenset(), 10 * GB, 10 * GB)))
        c.handle(Tick(float(i)))
    assert len(c.log) == 0  # nothing decided, nothing about any job
    jobs = [new_job_id(c) for _ in range(3)]
    for i, job in enumerate(jobs):
        run_locally(c, c.handle(Submit(10.0 + i, job, "chain", {"x": i}, 8, 10.0 + i)), 11.0)
    # each job: its submit, then two tasks done: 9 events, of which the last 4 are kept
    assert len(c.log) == 4
    assert c.story(jobs[0]) == []  # pushed out of the ring
    kept = c.story(jobs[2])
    assert [s.event.split(":")[0] for s in kept] == ["submit", "done", "done"]
    assert kept[-1].did == (f"answer {jobs[2]}: ok",)
    assert any(d.startswith(f"run {jobs[2]}/a") for d in kept[0].did)


def test_a_fault_is_in_the_story_of_the_event_that_raised() -> None:
    c, _ = core("a", ("a",))
    job = new_job_id(c)
    (run,) = of(RunTask, c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0)))

    def broken(*_: object) -> None:
        raise IndexError("a bug")

    c._pass_on = broken  # type: ignore[method-assign,assignment]
    c.handle(TaskDone(1.0, run.entry, "out"))
    (done,) = [s for s in c.story(job) if s.event.startswith("done:")]
    assert done.did[-1] == "fault: IndexError: a bug"


def test_a_core_that_keeps_no_log_decides_the_same() -> None:
    def replay(keep: int) -> list[str]:
        c, _ = core("a", ("a",), keep_stimuli=keep)
        steps = c.handle(Submit(0.0, new_job_id(c), "diamond", {"x": 1}, 8, 0.0))
        return [repr(s) for s in run_locally(c, steps, 1.0)]

    assert replay(0) == replay(2)
