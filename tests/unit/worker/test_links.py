"""A link that breaks may have lost what was on the way: the jobs of those messages are planned
again (issue 24's hang: a worker declared dead loses what it sends to the peer that declared
it, and the job's ingress, which lost neither, waited forever). Those re-plans, like a lost
peer's, use up none of a job's attempts; a job that did use them up is answered
:class:`WorkersLost`, which its client does not submit again elsewhere."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from compass.core.events import (
    Answer,
    Instruction,
    PeerJoined,
    PeerLost,
    Received,
    RunTask,
    Send,
    Submit,
    TaskDone,
    TaskFailed,
    Undeliverable,
)
from compass.core.ingress import MAX_ATTEMPTS
from compass.core.links import Links
from compass.core.messages import LINK_LOST, DoneMsg, FailedMsg, PlacedMsg, ResultMsg, TaskMsg
from compass.core.state import WorkerCore
from compass.errors import JobFailed, WorkersLost, WorkerUnavailable

from .test_state import _job_on_peer, core, new_job_id, of, one, received, submit, task_msg

#: job w9-1's plan: its root a runs here (b), its sink b on c; w9 is its ingress
PLAN = {"a": "b", "b": "c"}


def _pushed(c: WorkerCore) -> None:
    """Worker b runs w9-1's root and pushes its output on to c."""
    run = one(RunTask, c.handle(received(task_msg(plan=PLAN), 0.0)))
    (push,) = of(Send, c.handle(TaskDone(0.5, run.entry, "out-a")))
    assert push.peer == "c" and isinstance(push.msg, TaskMsg) and push.msg.task == "b"


def _carry(
    cores: Mapping[str, WorkerCore],
    sender: str,
    steps: Iterable[Instruction],
    now: float,
    *,
    lost: frozenset[tuple[str, str]] = frozenset(),
) -> list[Answer]:
    """Carry ``sender``'s instructions out across ``cores``: each message to its core (those on
    a link in ``lost``, (from, to), discarded), each task run at once; the answers."""
    pending = [(sender, s) for s in steps]
    answers: list[Answer] = []
    for _ in range(200):  # bounded: a job of two tasks takes a dozen steps
        if not pending:
            return answers
        at, step = pending.pop(0)
        if isinstance(step, Answer):
            answers.append(step)
        elif isinstance(step, RunTask):
            done = TaskDone(now, step.entry, f"out-{step.entry.task}")
            pending += [(at, s) for s in cores[at].handle(done)]
        elif isinstance(step, Send) and (at, step.peer) not in lost:
            received_there = cores[step.peer].handle(Received(now, at, step.msg))
            pending += [(step.peer, s) for s in received_there]
    raise AssertionError(f"still carrying out {pending[:3]}")


def test_a_push_lost_between_two_workers_is_planned_again_by_the_ingress_that_lost_neither() -> (
    None
):
    # the events of the hang: c declared b dead (a false suspicion of a starved machine) and
    # closed their link; b, slow to notice, pushed w9-1's output on it, which c discarded;
    # then b reconnected to c. The ingress w9 lost neither: without the report it waits forever
    names = ("w9", "b", "c")
    cores = {name: core(name, names)[0] for name in names}
    for c in cores.values():  # a busy ingress, and b: the root goes to b, its successor to c
        c.view.waits.update(w9=100.0, b=0.0, c=0.5)  # type: ignore[attr-defined]
    job = new_job_id(cores["w9"])
    (root,) = of(Send, cores["w9"].handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0)))
    assert root.peer == "b"
    cores["b"].view.waits.update(b=100.0, c=0.0)  # type: ignore[attr-defined]
    run = one(RunTask, cores["b"].handle(Received(0.1, "w9", root.msg)))
    cut = frozenset({("b", "c")})
    assert _carry(cores, "c", cores["c"].handle(PeerLost(0.2, "b")), 0.2) == []
    done = cores["b"].handle(TaskDone(0.3, run.entry, "out-a"))
    assert _carry(cores, "b", done, 0.3, lost=cut) == []
    assert (
        job in cores["w9"].ingress.jobs and cores["w9"].ingress.jobs[job].plan == PLAN
    )  # waiting on c
    # b is back at c: b tells w9, which plans the job again, and it is answered, once
    joined = cores["b"].handle(PeerJoined(1.0, "c", "same-process"))
    assert [(s.peer, s.msg.code) for s in of(Send, joined)] == [("w9", LINK_LOST)]
    (answer,) = _carry(cores, "b", joined, 1.0)
    assert answer.job_id == job and answer.error is None and answer.value == "out-b"
    assert answer.record is not None and answer.record["attempts"] == 2
    assert cores["b"].handle(PeerJoined(2.0, "c", "same-process")) == []  # told once


def test_so_does_a_push_to_a_peer_declared_dead_here() -> None:
    c, _ = core("b", ("b", "c", "w9"), policy="round_robin")
    _pushed(c)
    (report,) = of(Send, c.handle(PeerLost(2.0, "c")))
    assert report.peer == "w9" and isinstance(report.msg, FailedMsg)
    assert (report.msg.job, report.msg.attempt, report.msg.task) == ("w9-1", 0, "a")
    assert report.msg.code == LINK_LOST and report.msg.worker == "b"


def test_a_job_done_or_planned_again_is_not_reported() -> None:
    c, _ = core("b", ("b", "c", "w9"), policy="round_robin")
    _pushed(c)
    c.handle(received(DoneMsg("w9-1", None), 1.0))  # answered
    assert c.handle(PeerJoined(2.0, "c", "same-process")) == []
    assert len(c.links) == 0
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
    assert c.ingress.jobs[job].attempt == 1
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
    assert (report.msg.job, report.msg.task, report.msg.code) == ("w9-1", "b", LINK_LOST)


def test_a_failure_report_on_a_link_that_broke_is_sent_again_as_it_was() -> None:
    # a task's own failure must still fail its job, not have it planned again
    c, _ = core("b", ("b", "w9"), policy="round_robin")
    run = one(RunTask, c.handle(received(task_msg(plan={"a": "b", "b": "b"}), 0.0)))
    (failed,) = of(Send, c.handle(TaskFailed(0.5, run.entry, "ValueError: boom")))
    steps = c.handle(PeerJoined(2.0, "w9", "same-process"))
    assert [(s.peer, s.msg) for s in of(Send, steps)] == [("w9", failed.msg)]
    assert failed.msg.code == JobFailed.code
    # and so is one that could not be sent to an ingress lost meanwhile, on its return
    c.handle(Undeliverable(3.0, "w9", failed.msg, "no connection to w9", unreachable=True))
    c.handle(PeerLost(4.0, "w9"))
    steps = c.handle(PeerJoined(5.0, "w9", "same-process"))
    assert [(s.peer, s.msg) for s in of(Send, steps)] == [("w9", failed.msg)]


def test_broken_links_use_up_no_attempts_and_refusals_end_in_workers_lost() -> None:
    c, view = core("a", ("a", "b", "c"))
    job, _ = _job_on_peer(c, view, "b")
    for attempt in range(2 * MAX_ATTEMPTS):  # a flapping link: planned again every time
        lost = FailedMsg(job, attempt, "a", "b", "the link broke", "", LINK_LOST)
        steps = c.handle(received(lost, 1.0 + attempt, "b"))
        assert of(Answer, steps) == [] and c.ingress.jobs[job].attempt == attempt + 1
    first = c.ingress.jobs[job].attempt
    for attempt in range(first, first + MAX_ATTEMPTS - 1):  # refusals: a bounded number
        refused = FailedMsg(job, attempt, "a", "b", "no connection to c", "", "unavailable")
        assert of(Answer, c.handle(received(refused, 20.0 + attempt, "b"))) == []
    last = FailedMsg(job, first + MAX_ATTEMPTS - 1, "a", "b", "no connection to c", "",
                     "unavailable")  # fmt: skip
    (answer,) = of(Answer, c.handle(received(last, 30.0, "b")))
    # answered here, the ingress going nowhere: its client does not submit it elsewhere
    assert type(answer.error) is WorkersLost and isinstance(answer.error, WorkerUnavailable)
    assert answer.error.job_id == job and "no connection to c" in answer.error.message


def test_a_job_with_no_worker_left_to_plan_it_again_is_workers_lost() -> None:
    c, _ = core("a", ("b",))  # the ingress runs nothing itself: b is its only worker
    job = submit(c)
    (answer,) = of(Answer, c.handle(PeerLost(1.0, "b")))
    assert type(answer.error) is WorkersLost and answer.error.job_id == job


def test_the_log_keeps_the_newest_attempt_of_a_job_a_peer_and_forgets_by_attempt() -> None:
    links = Links("b", limit=2)
    links.note("c", task_msg(job="j", attempt=0, task="b", source="a", value=1))
    links.note("c", task_msg(job="j", attempt=1, task="b", source="a", value=1))
    links.note("d", ResultMsg("j", 1, "b", 1))
    links.forget("j", 1)  # below attempt 1: nothing of the newest goes
    (report,) = links.lost("c", lambda job, attempt, ingress: False)
    assert report[0] == "w9" and (report[1].job, report[1].attempt, report[1].task) == ("j", 1, "a")
    links.forget("j")
    assert links.lost("d", lambda job, attempt, ingress: False) == [] and len(links) == 0
    for job in ("j1", "j2", "j3"):  # bounded: the oldest job goes first
        links.note("c", task_msg(job=job))
    assert [m.job for _, m in links.joined("c", lambda job, attempt, ingress: False)] == [
        "j2",
        "j3",
    ]


def test_the_jobs_of_ingresses_that_never_come_back_are_forgotten_past_a_bound() -> None:
    """Ingresses replaced under new names (pods of a Deployment) never rejoin to hear what was
    dropped of their jobs: a worker keeps that for the last ``max_orphaned`` lost ones only,
    and the one that does come back still hears."""
    from compass.core.links import Sent

    links = Links("b", limit=8, max_orphaned=4)
    for n in range(100):
        for job in range(10):
            links.orphan(f"pod-{n}", Sent(f"pod-{n}-{job}", 0, "a", f"pod-{n}"))
    assert links.orphaned == 4 * 8  # 4 ingresses of 8 jobs each, not 100 of 10
    reports = links.joined("pod-99", lambda job, attempt, ingress: False)
    assert len(reports) == 8 and all(to == "pod-99" for to, _ in reports)
    assert links.joined("pod-0", lambda job, attempt, ingress: False) == []
    assert links.orphaned == 3 * 8


def test_a_worker_lost_by_the_ingress_hears_its_attempt_is_stale_when_it_is_back() -> None:
    """A worker its ingress lost (a false suspicion, a cut link) may be alive and hold the
    inputs of an attempt planned again elsewhere: nothing told it (Done went to the others),
    and the entry waited for ever, a drain holding it for its whole timeout. When it is back,
    the ingress tells it; it drops what it held, and hears nothing of jobs it did not hold."""
    a, view = core("a", ("a", "b", "c"))
    job, root = _job_on_peer(a, view, "b")
    other, _ = _job_on_peer(a, view, "c")
    b, _ = core("b", ("a", "b", "c"), lanes=1)
    one(RunTask, b.handle(received(task_msg(job="w9-1", ingress="w9"), 0.0)))  # its lane busy
    b.handle(received(root, 0.1, "a"))
    assert len(b.lanes.queue) == 1  # a's root waits there
    view.waits.update(a=100.0, b=100.0, c=0.0)
    steps = a.handle(PeerLost(1.0, "b"))  # b's job is planned again on c; b hears nothing
    assert a.ingress.jobs[job].attempt == 1
    assert all(s.peer != "b" for s in of(Send, steps))
    back = of(Send, a.handle(PeerJoined(2.0, "b", "i2")))
    assert [(s.peer, s.msg) for s in back] == [("b", DoneMsg(job, 1))]
    b.handle(received(back[0].msg, 2.1, "a"))
    assert len(b.lanes.queue) == 0 and b.is_done(job, 0) and not b.is_done(other, 0)
    assert a.handle(PeerJoined(3.0, "b", "i2")) == []  # told once


def test_a_move_heard_after_its_job_ended_tells_the_worker_it_moved_to_that_the_job_is_done() -> (
    None
):
    # the soak's slow growth of the links: b ran w9's root and moved its sink from c to d, and
    # told w9 (PlacedMsg); d ran the sink and sent the result, which reached w9 first (another
    # link). w9 answered and told the plan it knew, b and c: d, which noted its result for w9,
    # never heard the job end, and kept that note until its per-peer bound pushed it out
    names = ("w9", "b", "c", "d")
    ingress, view = core("w9", names)
    job, root = _job_on_peer(ingress, view, peer="b")
    assert root.plan["a"] == "b"
    ingress.ingress.jobs[job].plan["b"] = "c"  # as planned: the sink on c
    sink = core("d", names)[0]
    moved = {**root.plan, "b": "d"}
    run = one(RunTask, sink.handle(received(task_msg(job, 0, "b", "a", "out-a", moved), 0.1, "b")))
    (result,) = of(Send, sink.handle(TaskDone(0.2, run.entry, "out-b")))
    assert result.peer == "w9" and len(sink.links) == 1  # d notes its result for w9

    answered = ingress.handle(received(result.msg, 0.3, sender="d"))
    told = {s.peer for s in of(Send, answered) if isinstance(s.msg, DoneMsg)}
    assert one(Answer, answered).value == "out-b" and "d" not in told

    late = ingress.handle(received(PlacedMsg(job, 0, "b", "d"), 0.4, sender="b"))
    (done,) = of(Send, late)
    assert done.peer == "d" and done.msg == DoneMsg(job, None)
    sink.handle(received(done.msg, 0.5, sender="w9"))
    assert len(sink.links) == 0  # the note is gone with the job


def test_a_move_heard_while_its_job_runs_only_moves_the_plan() -> None:
    names = ("w9", "b", "c", "d")
    ingress, view = core("w9", names)
    job, _ = _job_on_peer(ingress, view, peer="b")
    assert of(Send, ingress.handle(received(PlacedMsg(job, 0, "b", "d"), 0.1, sender="b"))) == []
    assert ingress.ingress.jobs[job].plan["b"] == "d"


def test_a_job_ended_by_a_successor_delivered_here_sends_no_more_of_its_outputs() -> None:
    # the soak's last links entries: an ingress ran a task of its own job and pushed its output
    # to the successors, the first to itself; that one failed the job at once (in the soak its
    # deadline, here a plan with no worker for its successor), which answered it and forgot it
    # here. The push to the next successor, on a peer, went out after that: the peer dropped
    # it, and the link kept it for good, since no end of that job was coming any more
    c, _ = core("a", ("a", "b"), policy="hash")  # static: the plan stays as given
    job = new_job_id(c)
    steps = c.handle(Submit(0.0, job, "diamond", {"x": 1}, 8, 0.0))
    root = one(RunTask, steps).entry
    assert root.plan == dict.fromkeys("abcd", "a")  # hash: all of it here
    del root.plan["d"]  # b, here, cannot run: its successor has no worker
    root.plan["c"] = "b"

    steps = c.handle(TaskDone(0.5, root, "out-a"))
    (answer,) = of(Answer, steps)
    assert "plan places no worker for d" in str(answer.error)
    assert c.is_done(job, 0)
    assert [s for s in of(Send, steps) if isinstance(s.msg, TaskMsg)] == []  # c's input: not sent
    assert len(c.links) == 0
