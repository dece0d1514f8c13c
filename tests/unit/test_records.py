"""The hot values (compass.records): compared, hashed and copied as the frozen dataclasses
they replaced."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, fields, replace
from typing import Any

import pytest

from compass.core.events import Received, Send, TaskDone
from compass.core.lanes import RunTask
from compass.core.messages import DoneMsg, TaskMsg
from compass.core.queue import QueuedTask
from compass.errors import ConfigError
from compass.records import record
from compass.sched import Heartbeat, ViewSnapshot


def _msg(task: str = "b") -> TaskMsg:
    return TaskMsg("j-1", 0, "chain", task, "a", 3, {"a": "w0", "b": "w1"}, "w0", t0=1.5)


def test_records_are_equal_and_hash_alike_by_value() -> None:
    # as frozen dataclasses: a trace, a test or a set compares them by what they say
    assert _msg() == _msg() and _msg() != _msg("c")
    assert Send("w1", _msg()) == Send("w1", _msg())
    done_msg = Received(0.5, "w1", DoneMsg("j-1", None))
    assert hash(done_msg) == hash(replace(done_msg)) and len({done_msg, replace(done_msg)}) == 1
    entry = QueuedTask("j-1", 0, "chain", "b", None, 0.1, {}, {}, "w0", 0.0)
    done = TaskDone(1.0, entry, 4, exec_s=0.25)
    assert done == TaskDone(1.0, entry, 4, exec_s=0.25) != TaskDone(1.0, entry, 4)
    assert len({RunTask(entry, 0, True, 0.0, None), RunTask(entry, 0, True, 0.0, None)}) == 1


def test_a_record_is_a_slotted_dataclass_that_copies_and_pickles() -> None:
    msg = _msg()
    assert not hasattr(msg, "__dict__")
    assert [f.name for f in fields(msg)][:3] == ["job", "attempt", "workflow"]
    moved = replace(msg, task="c")
    assert (moved.task, moved.plan) == ("c", msg.plan) and msg.task == "b"
    assert pickle.loads(pickle.dumps(msg)) == msg
    match Received(0.5, "w1", msg):
        case Received(now=now, msg=TaskMsg(task=task)):
            assert (now, task) == (0.5, "b")
        case _:
            pytest.fail("a record matches by its fields")


def test_a_subclass_must_be_a_record_too() -> None:
    # a frozen dataclass cannot extend one that is not frozen at run time (the module says so)
    with pytest.raises(TypeError):

        @dataclass(frozen=True)
        class Later(Send):
            pass

    @record
    class Again(Send):
        pass

    assert Again("w1", _msg()).peer == "w1"


def test_a_heartbeat_is_checked_and_hashed_by_value_and_a_snapshot_by_identity() -> None:
    beat = Heartbeat("w0", 0.5, frozenset({"m"}), 1, 2, batches={"m": (2, 0.5)})
    assert beat == replace(beat) and hash(beat) == hash(replace(beat, batches={}))
    with pytest.raises(ConfigError, match="wait_s"):
        Heartbeat("w0", -1.0, frozenset(), 1, 2)  # __post_init__ still runs
    # a snapshot's arrays have no truth value: it compares and hashes as itself (eq=False)
    snap = ViewSnapshot.build([beat])
    assert snap == snap and snap != ViewSnapshot.build([beat]) and len({snap, snap}) == 1


def test_a_task_message_with_another_plan_keeps_every_other_field() -> None:
    """TaskMsg.with_plan builds the copy field by field: a field it forgot (one added later)
    would be lost on the way; every field here differs from its default."""
    values: dict[str, Any] = {
        "job": "j1", "attempt": 2, "workflow": "wf", "task": "b", "source": "a",
        "value": b"out", "plan": {"a": "w1", "b": "w2"}, "ingress": "w0", "sent": 1.5,
        "t0": 0.5, "priority": 3, "budget_s": 2.25, "finish": True, "stream": True, "opens": True,
        "version": 7,
    }  # fmt: skip
    assert set(values) == {f.name for f in fields(TaskMsg)}
    msg = TaskMsg(**values)
    plan = {"a": "w1", "b": "w3"}
    assert msg.with_plan(plan) == replace(msg, plan=plan)
    assert msg.with_plan(plan).plan is plan
