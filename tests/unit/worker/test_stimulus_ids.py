"""The ids the core gives anonymous events (:func:`stimulus_id`): one namer per event type,
looked up by type on the hot path, so every type of :data:`Event` must have one, and each
must say what the rule says (``kind:subject#n``; ``kind#n`` about nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import pytest

from compass.core.causes import cause_text
from compass.core.events import _NAMERS as NAMERS
from compass.core.events import (
    Cancel,
    Event,
    Heard,
    LoadFailed,
    ModelLoaded,
    PeerDraining,
    PeerJoined,
    PeerLost,
    PlanAsked,
    PlanReady,
    Received,
    Submit,
    TaskDone,
    TaskFailed,
    TaskReturned,
    TaskStep,
    Tick,
    Undeliverable,
    WatchFailed,
    stimulus_id,
)
from compass.core.lanes import RunTask
from compass.core.messages import DoneMsg, PlanRequest, ResultMsg
from compass.errors import CompassError
from compass.sched.heartbeat import Heartbeat

from .test_state import GB, core, of, task_msg


def _events(job: str, model: str, peer: str) -> list[tuple[Event, str]]:
    """One event of each type, with the id it gets as the 7th event handled."""
    c, _ = core("a", ("a",))
    (run,) = of(RunTask, c.handle(Submit(0.0, "a-1", "chain", {"x": 1}, 8, 0.0)))
    entry = run.entry
    task = task_msg(job="w9-1", task="b", source="a")
    beat = Heartbeat(peer or "p", 0.0, frozenset(), 10 * GB, 10 * GB)  # never nameless

    def about(kind: str, subject: str) -> str:
        return f"{kind}:{subject}#7" if subject else f"{kind}#7"

    return [
        (Submit(0.0, job, "chain", {}, 0, 0.0), about("submit", job)),
        (PlanReady(0.0, job, None), about("plan-ready", job)),
        (Received(0.0, peer, task), "received:w9-1/b<a#7"),
        (Received(0.0, peer, DoneMsg(job)), f"received:done:{job}#7"),
        (TaskDone(0.0, entry, None), "done:a-1/a#7"),
        (TaskFailed(0.0, entry, "E: x"), "failed:a-1/a#7"),
        (TaskReturned(0.0, entry), "returned:a-1/a#7"),
        (ModelLoaded(0.0, model, 1.0), about("loaded", model)),
        (LoadFailed(0.0, model, CompassError("x")), about("load-failed", model)),
        (Tick(0.0), "tick#7"),
        (PeerLost(0.0, peer), about("lost", peer)),
        (Cancel(0.0, job), about("cancel", job)),
        (
            Undeliverable(0.0, peer, ResultMsg(job, 0, "a", 1), "x"),
            f"undeliverable:result>{peer}#7",
        ),
        (PlanAsked(0.0, PlanRequest(job, "chain", peer, 0)), about("plan-asked", job)),
        (Heard(0.0, beat), about("heard", peer or "p")),
        (PeerJoined(0.0, peer, "i"), about("joined", peer)),
        (PeerDraining(0.0, peer, "i"), about("draining", peer)),
        (WatchFailed(0.0, peer), about("watch-failed", peer)),
        (TaskStep(0.0, entry, 3, "w"), "step:a-1/a:3#7"),
    ]


def test_every_event_type_has_a_namer() -> None:
    assert set(NAMERS) == set(get_args(Event))
    assert {type(event) for event, _ in _events("j", "m", "p")} == set(get_args(Event))


@pytest.mark.parametrize(("job", "model", "peer"), [("a-9", "m", "b"), ("", "", "")])
def test_each_event_is_named_kind_subject_number(job: str, model: str, peer: str) -> None:
    for event, expected in _events(job, model, peer):
        assert stimulus_id(event, 7) == expected


def test_a_subclass_of_an_event_is_named_as_its_type_and_a_stranger_is_a_bug() -> None:
    @dataclass(frozen=True, slots=True)
    class Later(Tick):
        pass

    assert stimulus_id(Later(0.0), 3) == "tick#3"
    with pytest.raises(AssertionError):
        stimulus_id(object(), 3)  # type: ignore[arg-type]
    # an instruction's cause names it the same way (the event names itself: causes.py
    # imports no events, which import the lanes, which import causes.py)
    assert cause_text((Later(0.0), 3)) == "tick#3" and cause_text("mine") == "mine"
