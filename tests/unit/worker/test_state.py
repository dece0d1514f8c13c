"""The worker core's rules, driven with events and a fake clock: no loop, no sockets.

Each test names the rule it guards and would fail if that rule were broken.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.core.assemble import CoreOptions, build_core
from compass.core.events import (
    Answer,
    AskPlan,
    Cancel,
    Event,
    Fault,
    Instruction,
    PeerJoined,
    PeerLost,
    PlanReady,
    Received,
    RunTask,
    Send,
    Submit,
    TaskDone,
    TaskFailed,
    Tick,
    Undeliverable,
)
from compass.core.ingress import MAX_ATTEMPTS
from compass.core.jobs import JobIds
from compass.core.messages import (
    JOB_INPUTS,
    LINK_LOST,
    DoneMsg,
    FailedMsg,
    PlacedMsg,
    ResultMsg,
    TaskMsg,
)
from compass.core.state import WorkerCore
from compass.errors import (
    AnswerNotKept,
    CompassTimeout,
    InvalidInputs,
    JobFailed,
    JobTooLarge,
    Overloaded,
    RemoteError,
    UnknownWorkflow,
)
from compass.sched import Heartbeat, ViewSnapshot, make_policy
from compass.sched.candidates import PlanScope
from compass.sched.view import Placement
from compass.workflow import Profiles, Task, TaskProfile, Workflow

GB = 1_000_000_000

CHAIN = Workflow(
    "chain",
    [
        Task("a", "m", (), TaskProfile(exec_ms=100, output_bytes=1000)),
        Task("b", "m", ("a",), TaskProfile(exec_ms=100, output_bytes=1000)),
    ],
)
# a -> (b, c) -> d: d is a join of two predecessors
DIAMOND = Workflow(
    "diamond",
    [
        Task("a", "m", (), TaskProfile(exec_ms=100, output_bytes=1000)),
        Task("b", "m", ("a",), TaskProfile(exec_ms=100, output_bytes=1000)),
        Task("c", "m", ("a",), TaskProfile(exec_ms=100, output_bytes=1000)),
        Task("d", None, ("b", "c"), TaskProfile(exec_ms=10, output_bytes=1000)),
    ],
)
# a -> (b, c): two sinks
FORK = Workflow(
    "fork",
    [
        Task("a", "m", (), TaskProfile(exec_ms=100, output_bytes=1000)),
        Task("b", "m", ("a",), TaskProfile(exec_ms=100, output_bytes=1000)),
        Task("c", "m", ("a",), TaskProfile(exec_ms=100, output_bytes=1000)),
    ],
)
WORKFLOWS = {wf.name: wf for wf in (CHAIN, DIAMOND, FORK)}


def lookup(name: str) -> Workflow:
    try:
        return WORKFLOWS[name]
    except KeyError:
        raise UnknownWorkflow(f"unknown workflow {name!r}") from None


class FakeView:
    """A view whose waits the test sets; it records placements and removals."""

    def __init__(self, names: Sequence[str], models: Sequence[str] = ("m",)) -> None:
        self.waits = dict.fromkeys(names, 0.0)
        self.models = set(models)
        self.placed: list[tuple[str, float]] = []
        self.jobs: list[str] = []  # the job each placement named
        self.without: list[str] = []  # the job each snapshot left out
        self.removed: list[str] = []
        #: per worker, the waits of priorities 1, 2, ... (Heartbeat.lifted_s; none: waits)
        self.lifted: dict[str, tuple[float, ...]] = {}
        self.priorities: list[int] = []  # the priority each snapshot was taken at

    def snapshot(
        self, now: float, without: str = "", priority: int = 0, scope: PlanScope | None = None
    ) -> ViewSnapshot:
        self.without.append(without)
        self.priorities.append(priority)
        states = [
            Heartbeat(n, w, frozenset(self.models), 10 * GB, 10 * GB,
                        lifted_s=self.lifted.get(n, ()))
            for n, w in self.waits.items()
        ]  # fmt: skip
        return ViewSnapshot.build(replace(s, wait_s=s.wait_at(priority)) for s in states)

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        self.placed.append((worker, placed.seconds))
        self.jobs.append(placed.job)

    def remove(self, worker: str) -> None:
        self.removed.append(worker)
        del self.waits[worker]

    def heard(self, heartbeat: Heartbeat, now: float) -> bool:
        self.waits[heartbeat.name] = heartbeat.wait_s
        return True

    def drain(self, worker: str, instance: str) -> None:
        self.waits.pop(worker, None)

    def joined(self, worker: str, instance: str) -> None:
        pass

    def take_wanted(self) -> tuple[str, ...]:
        return ()

    def watch_failed(self, peer: str) -> None:
        pass

    #: this worker's weights version as task messages carry it (0: not known)
    version_id = 0

    def other_version(self, worker: str) -> None:
        self.removed.append(worker)
        self.waits.pop(worker, None)


_JOB_IDS: weakref.WeakKeyDictionary[WorkerCore, JobIds] = weakref.WeakKeyDictionary()


def new_job_id(core: WorkerCore) -> str:
    """A new job id at ``core``'s worker, named as its ingress names one (:class:`JobIds`)."""
    ids = _JOB_IDS.get(core)
    if ids is None:
        ids = _JOB_IDS[core] = JobIds(core.name, core.instance)
    return ids()


def resident_cache(*models: str) -> CacheCore:
    """A cache of 10 GB holding ``models`` (1 GB each), loaded already."""
    cache = CacheCore(SlabPool(10 * GB, GB // 10), dict.fromkeys(("m", "n"), GB))
    for model in models:
        plan = cache.plan_load(model)
        assert plan is not None
        cache.begin_load(model, plan)
        cache.finish_load(model)
    return cache


def core(
    name: str = "a",
    names: Sequence[str] = ("a", "b", "c"),
    policy: str = "compass",
    lanes: int = 8,
    **kwargs: Any,
) -> tuple[WorkerCore, FakeView]:
    """A core with ``lanes`` idle lanes (each ready task starts at once) and model m resident."""
    view = FakeView(names)
    profiles = Profiles(
        h2d_bytes_per_s=1e9,
        net_bytes_per_s=1e9,
        net_fixed_s=1e-4,
        model_sizes={"m": GB},
        workflows=WORKFLOWS.values(),
        staged=False,
    )
    made = build_core(
        name,
        workflows=WORKFLOWS,
        policy=make_policy(policy),
        profiles=profiles,
        view=view,
        cache=resident_cache("m"),
        options=CoreOptions(**{"lanes": lanes, "warm": False, **kwargs}),
    )
    return made, view


def of(kind: type, steps: Sequence[Instruction]) -> list[Any]:
    return [s for s in steps if isinstance(s, kind)]


def one(kind: type, steps: Sequence[Instruction]) -> Any:
    (found,) = of(kind, steps)
    return found


def submit(c: WorkerCore, workflow: str = "chain", now: float = 0.0, **inputs: Any) -> str:
    job_id = new_job_id(c)
    c.handle(Submit(now, job_id, workflow, inputs or {"x": 1}, 8, t0=now))
    return job_id


def task_msg(
    job: str = "w9-1",
    attempt: int = 0,
    task: str = "a",
    source: str = JOB_INPUTS,
    value: Any = None,
    plan: dict[str, str] | None = None,
    ingress: str = "w9",
    workflow: str = "chain",
) -> TaskMsg:
    if value is None and source == JOB_INPUTS:
        value = {"x": 1}
    if plan is None:
        plan = dict.fromkeys(WORKFLOWS[workflow].tasks if workflow in WORKFLOWS else "ab", "a")
    return TaskMsg(job, attempt, workflow, task, source, value, plan, ingress)


def received(msg: Any, now: float = 0.0, sender: str = "w9") -> Received:
    return Received(now, sender, msg)


def run_locally(c: WorkerCore, steps: list[Instruction], now: float) -> list[Instruction]:
    """Run every queued task to its end (output: its name); return every instruction."""
    out: list[Instruction] = []
    pending = list(steps)
    while pending:
        step = pending.pop(0)
        out.append(step)
        if isinstance(step, RunTask):
            pending.extend(c.handle(TaskDone(now, step.entry, f"out-{step.entry.task}")))
    return out


# -- determinism ------------------------------------------------------------------------------


def test_the_same_events_give_the_same_instructions() -> None:
    def replay() -> list[Instruction]:
        c, _ = core("a", ("a",))
        job = new_job_id(c)
        events: list[Event] = [Submit(0.0, job, "diamond", {"x": 1}, 8, 0.0)]
        out: list[Instruction] = []
        for event in events:
            out.extend(run_locally(c, c.handle(event), 1.0))
        return out

    first, second = replay(), replay()
    assert [repr(s) for s in first] == [repr(s) for s in second]  # QueuedTask compares by id
    (answer,) = of(Answer, first)
    assert answer.value == "out-d"


# -- ingress: admission, planning, one answer -------------------------------------------------


def test_a_job_runs_through_one_worker_and_is_answered_once() -> None:
    c, _ = core("a", ("a",))
    job = new_job_id(c)
    steps = run_locally(c, c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0)), 1.0)
    answers = of(Answer, steps)
    assert len(answers) == 1 and answers[0].value == "out-b" and answers[0].error is None
    assert answers[0].record["attempts"] == 1 and answers[0].record["ok"] is True
    assert job not in c.ingress.jobs
    # the job is dropped here once answered: a late input of it is ignored
    assert c.handle(received(task_msg(job=job, task="b", source="a", value=1, ingress="a"))) == []


def test_a_job_with_two_sinks_is_answered_when_both_have_reported() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=100.0)
    job = new_job_id(c)
    c.handle(Submit(0.0, job, "fork", {"x": 1}, 8, 0.0))
    assert of(Answer, c.handle(received(ResultMsg(job, 0, "b", "B"), 1.0, "b"))) == []
    (answer,) = of(Answer, c.handle(received(ResultMsg(job, 0, "c", "C"), 2.0, "b")))
    assert answer.value == {"b": "B", "c": "C"}


def test_admission_refuses_past_max_jobs_and_accepts_again_when_one_leaves() -> None:
    c, _ = core("a", ("a",), max_jobs=1)
    first = submit(c)
    refused = new_job_id(c)
    (answer,) = c.handle(Submit(0.0, refused, "chain", {"x": 1}, 8, 0.0))
    assert isinstance(answer, Answer) and isinstance(answer.error, Overloaded)
    assert c.stats.jobs_refused == 1 and refused not in c.ingress.jobs
    c.handle(Cancel(1.0, first))
    assert first not in c.ingress.jobs
    submit(c)
    assert len(c.ingress.jobs) == 1


def test_admission_bounds_the_bytes_of_held_inputs() -> None:
    c, _ = core("a", ("a",), max_held_bytes=100)
    held = new_job_id(c)
    c.handle(Submit(0.0, held, "chain", {"x": 1}, 80, 0.0))
    assert c.ingress.held_bytes == 80
    answer = one(Answer, c.handle(Submit(0.0, new_job_id(c), "chain", {"x": 1}, 30, 0.0)))
    assert isinstance(answer.error, Overloaded) and answer.error.detail["held_bytes"] == 80
    assert "--max-held-mb" in answer.error.message
    c.handle(Submit(0.0, new_job_id(c), "chain", {"x": 1}, 20, 0.0))  # fits: 100 in all
    c.handle(Cancel(1.0, held))
    assert c.ingress.held_bytes == 20


@pytest.mark.parametrize(
    ("workflow", "inputs", "error"),
    [("nope", {"x": 1}, UnknownWorkflow), ("chain", [1, 2], InvalidInputs)],
)
def test_a_bad_submit_is_answered_with_a_typed_error(
    workflow: str, inputs: Any, error: type
) -> None:
    c, _ = core("a", ("a",))
    (answer,) = c.handle(Submit(0.0, new_job_id(c), workflow, inputs, 8, 0.0))
    assert isinstance(answer, Answer) and isinstance(answer.error, error)
    assert c.ingress.jobs == {}


def test_placements_on_peers_are_counted_in_the_view_but_not_on_itself() -> None:
    c, view = core("a", ("a", "b"), policy="round_robin")
    submit(c)
    submit(c)
    placed_on = {w for w, _ in view.placed}
    assert "a" not in placed_on  # its own state is exact: counting it would count it twice
    assert placed_on == {"b"}
    # each placement names its job, so that the job's own re-planning can leave it out
    assert set(view.jobs) == set(c.ingress.jobs) and len(c.ingress.jobs) == 2


def test_central_planning_asks_the_planner_then_sends_roots_where_it_says() -> None:
    c, _ = core("b", ("a", "b"), policy="central")  # central plans at the first worker, "a"
    job = new_job_id(c)
    (ask,) = c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0))
    assert isinstance(ask, AskPlan) and ask.peer == "a" and ask.request.job == job
    steps = c.handle(PlanReady(0.1, job, {"a": "a", "b": "a"}))
    (send,) = of(Send, steps)
    assert send.peer == "a" and isinstance(send.msg, TaskMsg) and send.msg.task == "a"
    # no answer: it plans the job itself
    job2 = new_job_id(c)
    c.handle(Submit(0.2, job2, "chain", {"x": 1}, 8, 0.2))
    steps = c.handle(PlanReady(0.3, job2, None))
    assert of(Send, steps) or of(RunTask, steps)
    assert c.ingress.jobs[job2].plan.keys() == {"a", "b"}


# -- attempts and exactly once ----------------------------------------------------------------


def _job_on_peer(c: WorkerCore, view: FakeView, peer: str = "b") -> tuple[str, TaskMsg]:
    """Submit a chain job at ``c`` whose root is planned on ``peer``."""
    for other in view.waits:
        view.waits[other] = 0.0 if other == peer else 100.0
    job = new_job_id(c)
    steps = c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0))
    (send,) = of(Send, steps)
    assert send.peer == peer
    assert isinstance(send.msg, TaskMsg)
    return job, send.msg


def test_results_of_a_superseded_attempt_are_dropped() -> None:
    c, view = core("a", ("a", "b", "c"))
    job, _ = _job_on_peer(c, view, "b")
    view.waits.update(a=100.0, c=0.0)
    steps = c.handle(PeerLost(1.0, "b"))  # re-planned: attempt 1
    assert view.removed == ["b"]
    assert c.ingress.jobs[job].attempt == 1 and c.stats.replans == 1
    (resend,) = [s for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]
    assert resend.peer == "c" and resend.msg.attempt == 1
    # b's result for attempt 0 arrives late: not the answer
    assert of(Answer, c.handle(received(ResultMsg(job, 0, "b", "stale"), 2.0, "b"))) == []
    (answer,) = of(Answer, c.handle(received(ResultMsg(job, 1, "b", "fresh"), 3.0, "c")))
    assert answer.value == "fresh" and answer.record["attempts"] == 2
    # and a second result of the current attempt (a retransmission) gives no second answer
    assert of(Answer, c.handle(received(ResultMsg(job, 1, "b", "again"), 4.0, "c"))) == []


def test_a_lost_peer_replans_exactly_the_jobs_it_touched() -> None:
    c, view = core("a", ("a", "b", "c"))
    on_b, _ = _job_on_peer(c, view, "b")
    on_c, _ = _job_on_peer(c, view, "c")
    c.handle(PeerLost(1.0, "b"))
    assert c.ingress.jobs[on_b].attempt == 1
    assert c.ingress.jobs[on_c].attempt == 0  # never involved b: untouched


def test_a_replanned_job_tells_the_old_workers_to_drop_the_older_attempt() -> None:
    c, view = core("a", ("a", "b", "c"))
    job, _ = _job_on_peer(c, view, "c")
    c.handle(received(PlacedMsg(job, 0, "b", "b"), 0.5, "c"))  # c moved b to peer b
    assert c.ingress.jobs[job].plan == {"a": "c", "b": "b"}
    steps = c.handle(PeerLost(1.0, "b"))
    dones = [s for s in of(Send, steps) if isinstance(s.msg, DoneMsg)]
    assert {s.peer for s in dones} == {"c"}  # b is gone; c held attempt 0
    assert all(s.msg.below == 1 for s in dones)


def test_a_failed_task_fails_the_job_once_with_the_task_named() -> None:
    c, view = core("a", ("a", "b"))
    job, _ = _job_on_peer(c, view, "b")
    failed = FailedMsg(job, 0, "a", "b", "ValueError: bad pixel", "Traceback...")
    (answer,) = of(Answer, c.handle(received(failed, 1.0, "b")))
    assert isinstance(answer.error, JobFailed)
    assert answer.error.task == "a" and "bad pixel" in answer.error.message
    assert of(Answer, c.handle(received(failed, 1.1, "b"))) == []
    assert c.stats.jobs_failed == 1


def test_a_typed_failure_keeps_its_type() -> None:
    c, view = core("a", ("a", "b"))
    job, _ = _job_on_peer(c, view, "b")
    failed = FailedMsg(job, 0, "a", "b", "task past 50 ms", "", CompassTimeout.code)
    (answer,) = of(Answer, c.handle(received(failed, 1.0, "b")))
    assert isinstance(answer.error, CompassTimeout)
    assert answer.error.detail["task"] == "a"


def test_cancel_drops_the_job_at_its_workers() -> None:
    c, view = core("a", ("a", "b"))
    job, _ = _job_on_peer(c, view, "b")
    steps = c.handle(Cancel(1.0, job))
    assert job not in c.ingress.jobs
    dones = [s for s in of(Send, steps) if isinstance(s.msg, DoneMsg)]
    assert [(s.peer, s.msg.below) for s in dones] == [("b", None)]
    # its result arriving after the cancel answers nothing
    assert of(Answer, c.handle(received(ResultMsg(job, 0, "b", 1), 2.0, "b"))) == []


# -- every worker: the inbox, tasks, adjustment -----------------------------------------------


def test_a_join_waits_for_every_input() -> None:
    c, _ = core("a", ("a",))
    plan = dict.fromkeys(DIAMOND.tasks, "a")
    first = task_msg(task="d", source="b", value=1, plan=plan, workflow="diamond")
    assert of(RunTask, c.handle(received(first))) == []
    assert len(c.inbox) == 1
    second = task_msg(task="d", source="c", value=2, plan=plan, workflow="diamond")
    (enqueue,) = of(RunTask, c.handle(received(second, 0.5)))
    assert enqueue.entry.inputs == {"b": 1, "c": 2}
    assert len(c.inbox) == 0


def test_messages_of_a_done_job_are_dropped_and_its_queued_tasks_removed() -> None:
    c, _ = core("a", ("a",), lanes=1)
    one(RunTask, c.handle(received(task_msg(job="w9-7"))))  # the lane is busy with it
    assert c.handle(received(task_msg(job="w9-1"))) == []  # queued behind
    assert [e.job_id for e in c.lanes.queue] == ["w9-1"]
    assert c.handle(received(DoneMsg("w9-1", None))) == []
    assert len(c.lanes.queue) == 0
    assert c.handle(received(task_msg(job="w9-1"))) == []
    assert len(c.lanes.queue) == 0


def test_done_below_an_attempt_keeps_the_newer_attempt() -> None:
    c, _ = core("a", ("a",), lanes=1)
    one(RunTask, c.handle(received(task_msg(job="w9-7"))))  # the lane is busy with it
    plan = dict.fromkeys(DIAMOND.tasks, "a")
    c.handle(received(task_msg(attempt=1, task="d", source="b", value=1, plan=plan,
                               workflow="diamond")))  # fmt: skip
    c.handle(received(task_msg(attempt=0, task="b", source="a", value=1)))
    c.handle(received(task_msg(attempt=1, task="b", source="a", value=1)))
    assert [e.attempt for e in c.lanes.queue] == [0, 1]
    assert c.handle(received(DoneMsg("w9-1", below=1))) == []
    assert [e.attempt for e in c.lanes.queue] == [1]  # attempt 0's queued task removed
    assert len(c.inbox) == 1  # attempt 1's input kept
    assert c.handle(received(task_msg(attempt=0))) == []  # attempt 0 is stale
    assert len(c.lanes.queue) == 1
    assert c.handle(received(task_msg(attempt=1))) == []  # queued: the lane is busy
    assert [e.attempt for e in c.lanes.queue] == [1, 1]


@pytest.mark.parametrize(
    "msg",
    [
        task_msg(workflow="nope"),
        task_msg(task="zzz"),
        task_msg(task="b", source="zzz", value=1),
        task_msg(plan={"a": "a"}),  # places no worker for b
        task_msg(value=[1, 2]),  # a root's job inputs must be a mapping
    ],
)
def test_a_bad_task_message_fails_its_job_at_the_ingress_and_is_counted(msg: TaskMsg) -> None:
    c, _ = core("a", ("a",))
    steps = c.handle(received(msg))
    (send,) = steps
    assert isinstance(send, Send) and send.peer == "w9" and isinstance(send.msg, FailedMsg)
    assert send.msg.job == msg.job and send.msg.worker == "a"
    assert c.stats.messages_dropped == 1


def test_a_finished_task_pushes_its_output_to_each_successor_and_a_sink_to_the_ingress() -> None:
    c, _ = core("a", ("a", "b"), policy="hash")  # static: no adjustment
    plan = {"a": "a", "b": "b", "c": "a", "d": "b"}
    enqueue = one(RunTask, c.handle(received(task_msg(workflow="diamond", plan=plan))))
    steps = c.handle(TaskDone(1.0, enqueue.entry, "A"))
    sends = [s for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]
    assert [(s.peer, s.msg.task, s.msg.source, s.msg.value) for s in sends] == [
        ("b", "b", "a", "A")
    ]
    (local,) = of(RunTask, steps)  # c runs here: delivered without the wire
    assert local.entry.task == "c" and local.entry.inputs == {"a": "A"}
    # d is a sink: its output goes to the ingress w9
    steps = c.handle(received(task_msg(workflow="diamond", task="d", source="b", value=1,
                                       plan=dict.fromkeys(DIAMOND.tasks, "a"))))  # fmt: skip
    assert steps == []
    steps = c.handle(received(task_msg(workflow="diamond", task="d", source="c", value=2,
                                       plan=dict.fromkeys(DIAMOND.tasks, "a"))))  # fmt: skip
    (sink,) = of(RunTask, steps)
    (result,) = c.handle(TaskDone(2.0, sink.entry, "D"))
    assert isinstance(result, Send) and result.peer == "w9"
    assert result.msg == ResultMsg("w9-1", 0, "d", "D")


def test_adjustment_moves_a_successor_off_a_long_queue_and_tells_the_ingress() -> None:
    c, view = core("a", ("a", "b", "c"))
    view.waits.update(a=50.0, b=50.0, c=0.0)  # b, where the plan sends task b, is far behind
    enqueue = one(RunTask, c.handle(received(task_msg(plan={"a": "a", "b": "b"}))))
    steps = c.handle(TaskDone(1.0, enqueue.entry, "A"))
    placed = [s for s in of(Send, steps) if isinstance(s.msg, PlacedMsg)]
    pushed = [s for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]
    assert len(pushed) == 1 and pushed[0].peer == "c"
    assert [(p.peer, p.msg.task, p.msg.worker) for p in placed] == [("w9", "b", pushed[0].peer)]
    assert pushed[0].msg.plan["b"] == pushed[0].peer
    assert c.stats.moves == 1
    # the adjustment saw the view without the job's own counted placements, and counted the move
    assert view.without[-1] == "w9-1" and view.jobs == ["w9-1"]


def test_a_failed_task_reports_to_its_ingress_unless_its_job_is_done() -> None:
    c, _ = core("a", ("a",))
    enqueue = one(RunTask, c.handle(received(task_msg())))
    (send,) = c.handle(TaskFailed(1.0, enqueue.entry, "RuntimeError: boom", "tb"))
    assert isinstance(send, Send) and isinstance(send.msg, FailedMsg)
    assert send.msg.message == "RuntimeError: boom" and send.msg.traceback == "tb"
    c.handle(received(DoneMsg("w9-1", None)))
    assert c.handle(TaskFailed(2.0, enqueue.entry, "RuntimeError: boom", "tb")) == []
    assert c.handle(TaskDone(2.0, enqueue.entry, "late")) == []


def test_a_job_answered_once_when_its_peer_is_lost_mid_task_and_the_result_arrives_late() -> None:
    c, view = core("a", ("a", "b"))
    job, _ = _job_on_peer(c, view, "b")
    steps = c.handle(PeerLost(1.0, "b"))  # b died mid-task, say: the job runs again here
    answers = of(Answer, run_locally(c, steps, 2.0))
    assert len(answers) == 1 and answers[0].value == "out-b"
    # b was only slow: its result of attempt 0 arrives now
    assert of(Answer, c.handle(received(ResultMsg(job, 0, "b", "late"), 3.0, "b"))) == []
    assert c.stats.jobs_completed == 1


def test_a_job_whose_planning_fails_unexpectedly_is_answered_and_the_fault_said() -> None:
    """A bug in planning (an exception no rule expects) answered nothing: the job stayed
    without a plan until its client gave up. It is answered with a typed error at once, and
    the failure is still a Fault for the worker to log and count."""
    c, _ = core("a", ("a", "b"))

    def broken(*args: Any) -> dict[str, str]:
        raise IndexError("planner bug")

    c.policy.plan = broken  # type: ignore[method-assign,assignment]
    job = new_job_id(c)
    steps = c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, 0.0))
    answer, fault = steps
    assert isinstance(answer, Answer) and answer.job_id == job
    assert isinstance(answer.error, RemoteError) and "IndexError: planner bug" in str(answer.error)
    assert isinstance(fault, Fault) and isinstance(fault.error, IndexError)
    assert job not in c.ingress.jobs and c.ingress.held_bytes == 0


# -- job keys: one answer per key -------------------------------------------------------------


def test_a_resubmitted_key_attaches_to_its_running_job() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=100.0)
    first = new_job_id(c)
    c.handle(Submit(0.0, first, "chain", {"x": 1}, 8, 0.0, key="k1"))
    again = new_job_id(c)
    assert c.handle(Submit(0.5, again, "chain", {"x": 1}, 8, 0.5, key="k1")) == []
    assert len(c.ingress.jobs) == 1  # not run twice
    answers = of(Answer, c.handle(received(ResultMsg(first, 0, "b", "B"), 1.0, "b")))
    assert sorted((a.job_id, a.value) for a in answers) == [(first, "B"), (again, "B")]
    # answered: the same key now gets the kept answer at once
    late = new_job_id(c)
    (answer,) = c.handle(Submit(2.0, late, "chain", {"x": 1}, 8, 2.0, key="k1"))
    assert isinstance(answer, Answer) and (answer.job_id, answer.value) == (late, "B")
    assert c.stats.jobs_submitted == 1


def test_a_key_whose_answer_was_shed_is_not_run_again() -> None:
    """The ingress keeps answers within a byte budget: past it a resubmitted key is answered
    AnswerNotKept, never run a second time."""
    c, view = core("a", ("a", "b"), keep_answer_bytes=1 << 20)
    view.waits.update(a=100.0)
    for n, key in enumerate(("k1", "k2")):
        job = new_job_id(c)
        c.handle(Submit(float(n), job, "chain", {"x": 1}, 8, float(n), key=key))
        big = np.zeros(1 << 20, dtype=np.uint8)
        (answer,) = of(Answer, c.handle(received(ResultMsg(job, 0, "b", big), n + 0.5, "b")))
        assert answer.value is big
    assert c.ingress.answered.bytes == 1 << 20  # k1's value was shed for k2's
    late = new_job_id(c)
    shed = one(Answer, c.handle(Submit(3.0, late, "chain", {"x": 1}, 8, 3.0, key="k1")))
    assert isinstance(shed.error, AnswerNotKept) and shed.job_id == late
    kept = one(Answer, c.handle(Submit(3.0, new_job_id(c), "chain", {"x": 1}, 8, 3.0, key="k2")))
    assert kept.error is None and kept.value.nbytes == 1 << 20
    assert c.stats.jobs_submitted == 2


def test_every_waiter_on_a_key_gets_an_error_of_its_own() -> None:
    """An exception raised to one requester takes its frames (and the job's inputs in them)
    along: requesters of one key never share one."""
    c, view = core("a", ("a", "b"))
    view.waits.update(a=100.0)
    first, again = new_job_id(c), new_job_id(c)
    c.handle(Submit(0.0, first, "chain", {"x": 1}, 8, 0.0, key="k"))
    c.handle(Submit(0.1, again, "chain", {"x": 1}, 8, 0.1, key="k"))
    failed = FailedMsg(first, 0, "b", "b", "ValueError: no", "tb", JobFailed.code)
    answers = of(Answer, c.handle(received(failed, 1.0, "b")))
    errors = [a.error for a in answers]
    assert len(errors) == 2 and all(isinstance(e, JobFailed) for e in errors)
    assert errors[0] is not errors[1] and str(errors[0]) == str(errors[1])


def test_a_job_runs_on_while_a_resubmission_of_its_key_waits() -> None:
    c, view = core("a", ("a", "b"))
    view.waits.update(a=100.0)
    first, again = new_job_id(c), new_job_id(c)
    c.handle(Submit(0.0, first, "chain", {"x": 1}, 8, 0.0, key="k"))
    c.handle(Submit(0.1, again, "chain", {"x": 1}, 8, 0.1, key="k"))
    assert c.handle(Cancel(0.2, first)) == []  # the first caller gave up; the second waits
    answers = of(Answer, c.handle(received(ResultMsg(first, 0, "b", "B"), 1.0, "b")))
    assert {(a.job_id, a.value) for a in answers} == {(first, "B"), (again, "B")}
    # when every requester gives up, the job is dropped
    third, fourth = new_job_id(c), new_job_id(c)
    c.handle(Submit(2.0, third, "chain", {"x": 1}, 8, 2.0, key="k2"))
    c.handle(Submit(2.1, fourth, "chain", {"x": 1}, 8, 2.1, key="k2"))
    c.handle(Cancel(2.2, fourth))
    assert third in c.ingress.jobs
    steps = c.handle(Cancel(2.3, third))
    assert third not in c.ingress.jobs
    assert [s.msg for s in of(Send, steps)] == [DoneMsg(third, None)]


def test_a_lost_ingress_leaves_no_inputs_behind() -> None:
    c, _ = core("a", ("a", "w9", "w8"), lanes=1)
    one(RunTask, c.handle(received(task_msg(job="w8-1", ingress="w8"))))  # the lane is busy
    c.handle(received(task_msg(job="w9-2")))
    c.handle(received(task_msg(job="w8-2", ingress="w8")))
    plan = dict.fromkeys(DIAMOND.tasks, "a")
    c.handle(received(task_msg(task="d", source="b", value=1, plan=plan, workflow="diamond")))
    assert len(c.inbox) == 1
    c.handle(PeerLost(1.0, "w9"))  # the ingress of w9-1 and w9-2 is gone
    assert len(c.inbox) == 0
    assert [e.job_id for e in c.lanes.queue] == ["w8-2"]  # w9-2's queued task removed
    # the job's other input arrives late: dropped, not held forever
    late = task_msg(task="d", source="c", value=2, plan=plan, workflow="diamond")
    assert c.handle(received(late, 2.0)) == []
    assert len(c.inbox) == 0


def test_an_ingress_lost_and_back_hears_of_the_jobs_dropped_and_their_next_attempts_run() -> None:
    # w9 was declared dead here while it held jobs with tasks here, but it was alive (a false
    # suspicion, a partition healed): it never lost this worker, and would wait forever
    c, _ = core("a", ("a", "w9", "w8"), lanes=1)
    one(RunTask, c.handle(received(task_msg(job="w9-1"))))  # running here
    c.handle(received(task_msg(job="w9-2")))  # queued
    plan = dict.fromkeys(DIAMOND.tasks, "a")
    c.handle(received(task_msg(job="w9-3", task="d", source="b", value=1, plan=plan,
                               workflow="diamond")))  # fmt: skip  # half of a join's inputs
    assert c.handle(PeerLost(1.0, "w9")) == []
    steps = c.handle(PeerJoined(2.0, "w9", "same-process"))
    reports = {s.msg.job: s.msg for s in of(Send, steps)}
    assert set(reports) == {"w9-1", "w9-2", "w9-3"} and {s.peer for s in of(Send, steps)} == {"w9"}
    assert all(isinstance(m, FailedMsg) and m.code == LINK_LOST
               for m in reports.values())  # fmt: skip  # the ingress plans them again
    assert reports["w9-3"].task == "d" and reports["w9-3"].attempt == 0
    # their next attempts run here: only the attempts seen were forgotten
    assert c.handle(received(task_msg(job="w9-2", attempt=0), 3.0)) == []  # stale
    c.handle(TaskDone(3.0, c.lanes.running()[0], "out"))  # the lane frees
    assert one(RunTask, c.handle(received(task_msg(job="w9-2", attempt=1), 3.0))).entry.attempt == 1
    assert c.handle(PeerJoined(4.0, "w9", "same-process")) == []  # told once


# -- one attempt per answer, identity across restarts, one job too large -----------------------


def test_a_replanned_job_with_two_sinks_is_answered_from_one_attempt_only() -> None:
    # the old attempt's sink output must not make up half of the new attempt's answer
    c, view = core("a", ("a", "b", "c"))
    view.waits.update(a=100.0, c=100.0)  # everything goes to b
    job = submit(c, "fork")
    c.handle(received(ResultMsg(job, 0, "b", "b-of-attempt-0"), 0.5, "b"))  # one sink reported
    view.waits.update(c=0.0)
    c.handle(PeerLost(1.0, "b"))  # re-planned: attempt 1
    assert c.ingress.jobs[job].attempt == 1
    # attempt 1's c reports first: with attempt 0's b kept, this would answer a mix
    assert of(Answer, c.handle(received(ResultMsg(job, 1, "c", "c-of-attempt-1"), 2.0, "c"))) == []
    (answer,) = of(Answer, c.handle(received(ResultMsg(job, 1, "b", "b-of-attempt-1"), 3.0, "c")))
    assert answer.value == {"b": "b-of-attempt-1", "c": "c-of-attempt-1"}


def test_job_ids_carry_the_instance_so_a_restart_under_the_same_name_never_reuses_one() -> None:
    before, _ = core("a", ("a",), instance="0f0f0f")
    after, _ = core("a", ("a",), instance="a1a1a1")  # the same name, restarted
    first = [new_job_id(before) for _ in range(3)]
    again = [new_job_id(after) for _ in range(3)]
    assert first == ["a-0f0f0f-1", "a-0f0f0f-2", "a-0f0f0f-3"]
    assert not set(first) & set(again)
    # a peer that finished the first instance's jobs still runs the second one's
    peer, _ = core("b", ("a", "b"))
    for job in first:
        peer.handle(received(task_msg(job=job, ingress="a", plan={"a": "b", "b": "b"}), sender="a"))
        peer.handle(received(DoneMsg(job, None), sender="a"))
    assert all(peer.is_done(job, 0) for job in first)
    assert not any(peer.is_done(job, 0) for job in again)


def test_one_job_over_the_byte_limit_is_too_large_not_overloaded() -> None:
    c, _ = core("a", ("a",), max_job_bytes=100)
    job = new_job_id(c)
    answer = one(Answer, c.handle(Submit(0.0, job, "chain", {"x": 1}, 101, 0.0)))
    assert isinstance(answer.error, JobTooLarge) and not isinstance(answer.error, Overloaded)
    assert answer.error.job_id == job and answer.error.detail["max_job_bytes"] == 100
    assert job in answer.error.message and not c.ingress.jobs and c.stats.jobs_refused == 1


def test_a_task_a_worker_could_not_pass_on_is_planned_again_a_bounded_number_of_times() -> None:
    # a restarted worker that has not met every peer yet reports "unavailable"
    c, view = core("a", ("a", "b", "c"))
    job, _ = _job_on_peer(c, view, "b")
    for attempt in range(MAX_ATTEMPTS - 1):
        failed = FailedMsg(job, attempt, "a", "b", "no connection to c", "", "unavailable")
        steps = c.handle(received(failed, 1.0 + attempt, "b"))
        assert of(Answer, steps) == [] and c.ingress.jobs[job].attempt == attempt + 1
        assert [s for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]  # sent again
    last = FailedMsg(job, MAX_ATTEMPTS - 1, "a", "b", "no connection to c", "", "unavailable")
    (answer,) = of(Answer, c.handle(received(last, 9.0, "b")))
    assert answer.error is not None and answer.error.job_id == job


def test_a_root_the_ingress_could_not_send_to_a_worker_not_met_yet_is_planned_again() -> None:
    c, view = core("a", ("a", "b", "c"))
    job, root = _job_on_peer(c, view, "b")
    steps = c.handle(Undeliverable(1.0, "b", root, "no connection to b", unreachable=True))
    assert of(Answer, steps) == [] and c.ingress.jobs[job].attempt == 1
    # a message the wire could not encode still fails nothing but its own job's pushes
    assert of(Answer, c.handle(Undeliverable(2.0, "b", root, "cannot encode"))) == []


def test_a_join_input_that_waits_past_the_keep_fails_its_job_at_the_ingress() -> None:
    # d (a join of b and c) got b's output; c's never comes (its worker lost it, or the
    # job's end never reached this worker): at a tick past the keep, the ingress is told
    c, _ = core("a", inbox_keep_s=30.0)
    msg = task_msg(job="w9-7", task="d", source="b", value=1, workflow="diamond")
    assert not of(RunTask, c.handle(received(msg, now=1.0)))
    assert len(c.inbox) == 1
    assert not of(Send, c.handle(Tick(30.5)))  # waited 29.5 s: kept
    (sent,) = of(Send, c.handle(Tick(31.5)))
    assert sent.peer == "w9" and isinstance(sent.msg, FailedMsg)
    assert (sent.msg.job, sent.msg.task, sent.msg.code) == ("w9-7", "d", CompassTimeout.code)
    assert "waited 30 s" in sent.msg.message
    assert len(c.inbox) == 0


def test_an_ingress_answers_its_own_job_whose_join_input_never_came() -> None:
    c, _ = core("a", names=("a",), inbox_keep_s=30.0)
    job = new_job_id(c)
    steps = c.handle(Submit(0.0, job, "diamond", {"x": 1}, 8, t0=0.0))
    assert of(RunTask, steps)
    # b's output reaches d; c's is lost (not delivered): d waits
    late = task_msg(job=job, task="d", source="b", value=1, workflow="diamond", ingress="a",
                    plan=dict.fromkeys("abcd", "a"))  # fmt: skip
    c.handle(received(late, sender="a"))
    answers = of(Answer, c.handle(Tick(40.0)))
    assert len(answers) == 1 and isinstance(answers[0].error, CompassTimeout)
    assert job not in c.ingress.jobs and len(c.inbox) == 0
