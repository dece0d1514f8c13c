"""The worker core as the one writer: what it learns comes in as events, every instruction
names the event that caused it, and a failure while handling loses no decided instruction."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from compass.config import WorkerConfig
from compass.core import events
from compass.core.events import (
    Answer,
    Fault,
    Heard,
    ModelLoaded,
    PlanAsked,
    Planned,
    Send,
    Submit,
    TaskDone,
)
from compass.core.lanes import LoadModel, RunTask
from compass.core.messages import JOB_INPUTS, PlanRequest
from compass.errors import RemoteError, UnknownWorkflow
from compass.gossip.port import GossipPort
from compass.sched.heartbeat import Heartbeat

from .test_state import GB, core, of, one, received, run_locally, task_msg

# -- cause ids ---------------------------------------------------------------------------------


def test_every_instruction_carries_the_id_of_the_event_that_caused_it() -> None:
    c, _ = core("a", ("a",))
    steps = c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0, cause="client-7"))
    (run,) = of(RunTask, steps)  # the root: sent to itself, queued, started at once
    assert run.cause == "client-7"
    after = c.handle(TaskDone(1.0, run.entry, "out-a"))
    # the successor runs because the root ended: its run is caused by that event, named by
    # the core since it came without an id
    (second,) = of(RunTask, after)
    assert second.cause.startswith("done:a-1/a#") and second.entry.task == "b"
    (answer,) = of(Answer, c.handle(TaskDone(2.0, second.entry, "out-b")))
    assert answer.cause.startswith("done:a-1/b#")


def test_anonymous_events_are_named_the_same_way_every_time() -> None:
    def causes() -> list[str]:
        c, _ = core("a", ("a",))
        steps = run_locally(c, c.handle(Submit(0.0, "a-1", "diamond", {"x": 1}, 8, 0.0)), 1.0)
        return [step.cause for step in steps]

    first = causes()
    assert first == causes()
    assert first[0] == "submit:a-1#1"
    assert all(first)


def test_an_anonymous_event_is_named_only_when_a_cause_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Naming every event cost a chain task more than the rest of the bookkeeping: a core that
    keeps no stimulus log (the simulator's) keeps the event and its number, and the name is
    made when read, the same each time. (One that keeps a log names each event it logs.)"""
    named: list[int] = []
    namer = events._NAMERS[TaskDone]

    def counted(event: Any, n: int) -> str:
        named.append(n)
        return namer(event, n)

    monkeypatch.setitem(events._NAMERS, TaskDone, counted)
    c, _ = core("a", ("a",), keep_stimuli=0)
    (run,) = of(RunTask, c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0)))
    (second,) = of(RunTask, c.handle(TaskDone(1.0, run.entry, "out-a")))
    (answer,) = of(Answer, c.handle(TaskDone(2.0, second.entry, "out-b")))
    assert named == []  # handled, nothing named
    assert second.cause == "done:a-1/a#2" == second.cause and answer.cause == "done:a-1/b#3"
    assert named == [2, 2, 3]


def test_a_send_is_caused_by_the_message_that_made_it() -> None:
    c, view = core("a", ("a", "b"))
    view.waits["a"] = 100.0  # busy: the root goes to b
    (send,) = of(Send, c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0)))
    assert send.peer == "b" and send.cause == "submit:a-1#1"
    msg = task_msg(task="b", source="a", value=1.0, plan={"a": "a", "b": "a"}, ingress="b")
    (run,) = of(RunTask, c.handle(received(msg, 1.0, sender="b")))
    assert run.cause == "received:w9-1/b<a#2"


# -- a failure while handling ------------------------------------------------------------------


class _Broken(Exception):
    pass


def test_a_bug_while_handling_becomes_a_fault_and_the_core_goes_on() -> None:
    c, _ = core("a", ("a",))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise _Broken("the policy broke")

    plan = c.policy.plan
    c.policy.plan = broken  # type: ignore[method-assign]
    answer, fault = c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0, cause="s1"))
    assert isinstance(fault, Fault) and isinstance(fault.error, _Broken) and fault.cause == "s1"
    # the job it was planning is answered, not left without a plan
    assert isinstance(answer, Answer) and answer.job_id == "a-1" and answer.cause == "s1"
    assert isinstance(answer.error, RemoteError) and "the policy broke" in str(answer.error)
    c.policy.plan = plan  # type: ignore[method-assign]
    steps = run_locally(c, c.handle(Submit(0.0, "a-2", "chain", {"x": 1}, 8, 0.0)), 1.0)
    assert one(Answer, steps).value == "out-b"


def test_runs_decided_before_a_failure_in_the_lanes_are_not_lost() -> None:
    c, _ = core("a", ("a",))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise _Broken("the cache broke")

    # the root starts, then the lanes look for a model to prefetch, and the cache breaks:
    # the lane is taken, so its run must still go out, before the fault
    c.lanes.cache.prefetch_candidate = broken  # type: ignore[method-assign]
    steps = c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0))
    assert [type(s) for s in steps] == [RunTask, Fault]
    assert c.lanes.busy == 1 and isinstance(steps[1].error, _Broken)  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class _Stray:
    now: float = 0.0
    cause: str = ""


def test_an_event_the_core_does_not_know_is_a_fault() -> None:
    c, _ = core("a", ("a",))
    (fault,) = c.handle(_Stray())  # type: ignore[arg-type]
    assert isinstance(fault, Fault) and isinstance(fault.error, AssertionError)
    # its log keeps it too, under the name of its type
    (logged,) = c.story("_Stray#1")
    assert len(logged.did) == 1 and logged.did[0].startswith("fault: AssertionError: ")


# -- learning comes in as events ---------------------------------------------------------------


def test_a_learning_core_folds_measured_runs_into_its_profiles_and_an_emulated_one_not() -> None:
    for learn in (True, False):
        c, _ = core("a", ("a",), learn=learn)
        (run,) = of(RunTask, c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0)))
        before = c.profiles.exec_s("chain", "a", "a")
        c.handle(TaskDone(1.0, run.entry, b"x" * 5000, exec_s=0.5))
        after = c.profiles.exec_s("chain", "a", "a")
        assert (after > before) is learn
        assert (c.profiles.output_bytes("chain", "a") != 1000) is learn


def test_a_pushed_input_measures_its_link_and_a_load_the_host_to_device_bandwidth() -> None:
    c, _ = core("a", ("a", "b"), learn=True)
    link = c.profiles.link("b", "a")
    msg = task_msg(source=JOB_INPUTS, value={"x": b"y" * (2 << 20)}, plan={"a": "a", "b": "a"})
    (run,) = of(RunTask, c.handle(replace(received(msg, 0.0, sender="b"), transfer_s=0.5)))
    assert c.profiles.link("b", "a") != link
    # a load of model n, timed: 1 GB in 2 s moves the estimate down from 1 GB/s
    needs_n = replace(run.entry, job_id="other", model="n")
    (load,) = [s for s in c.lanes.submit(needs_n, 0.5) if isinstance(s, LoadModel)]
    assert not c.h2d_measured
    c.handle(ModelLoaded(1.0, load.model, 2.0))
    assert c.profiles.h2d_bytes_per_s("a") < 1e9 and c.h2d_measured


def test_a_peers_heartbeat_goes_into_the_view_through_the_core() -> None:
    c, view = core("a", ("a", "b"))
    beat = Heartbeat("b", 0.25, frozenset({"m"}), GB, 10 * GB, h2d_bytes_per_s=5e9)
    assert c.handle(Heard(0.0, beat)) == []
    assert view.waits["b"] == 0.25
    assert c.profiles.h2d_bytes_per_s("b") == 5e9  # a measured bandwidth is adopted


# -- planning for another ingress ---------------------------------------------------------------


def test_a_plan_asked_by_another_ingress_counts_its_placements_here() -> None:
    c, view = core("a", ("a", "b"))
    request = PlanRequest("b-1", "chain", "b", 8)
    (planned,) = c.handle(PlanAsked(0.0, request))
    assert isinstance(planned, Planned) and planned.peer == "b" and planned.job_id == "b-1"
    assert set(planned.plan or ()) == {"a", "b"} and planned.error is None
    assert view.jobs == ["b-1", "b-1"]  # both placements counted in the view
    (refused,) = c.handle(PlanAsked(0.0, PlanRequest("b-2", "nope", "b", 8)))
    assert isinstance(refused, Planned) and isinstance(refused.error, UnknownWorkflow)


# -- draining peers --------------------------------------------------------------------------


@pytest.fixture
def gossip() -> GossipPort:
    from compass.workflow import Profiles

    profiles = Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, net_fixed_s=0.0,
                        model_sizes={}, workflows=(), staged=False)  # fmt: skip
    return GossipPort("w0", WorkerConfig(name="w0"), profiles=profiles)


def test_a_draining_peer_that_reconnects_still_drains_and_its_restart_does_not(
    gossip: GossipPort,
) -> None:
    beat = Heartbeat("w1", 0.0, frozenset(), GB, GB, seq=1)
    gossip.joined("w1", "i1")
    assert gossip.heard(beat, 0.0)
    gossip.drain("w1", "i1")
    assert "w1" not in gossip.view.names()
    gossip.joined("w1", "i1")  # the same process, its connection back: it still drains
    assert not gossip.heard(replace(beat, seq=2), 0.1) and "w1" not in gossip.view.names()
    gossip.joined("w1", "i2")  # restarted under its name: a new worker, in the view again
    assert gossip.heard(replace(beat, seq=1), 0.2) and "w1" in gossip.view.names()
