"""How the worker core's events and instructions read in its stimulus log
(:class:`~compass.stimuli.StimulusLog`): :func:`stimulus` makes the entry of one event, with
what it is about (the jobs, peers and models it and its instructions name), so that
``story(job_id)`` finds every event that touched a job, here, as this worker saw it.

A heartbeat or a tick that decided nothing is not kept (:func:`worth_keeping`): they are most of
a worker's events and tell nothing of any job; a log full of them would keep a job's story for
seconds only.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from compass.core.causes import Cause, cause_text
from compass.core.events import (
    Answer,
    AskPlan,
    Cancel,
    Event,
    Fault,
    Heard,
    Instruction,
    LoadFailed,
    LoadModel,
    ModelLoaded,
    PeerDraining,
    PeerJoined,
    PeerLost,
    PlanAsked,
    Planned,
    PlanReady,
    Received,
    RunTask,
    Send,
    Submit,
    TaskDone,
    TaskFailed,
    TaskReturned,
    Tick,
    Undeliverable,
    stimulus_id,
)
from compass.stimuli import Stimulus, StimulusLog

__all__ = ["CoreLog", "Stimulus", "stimulus", "worth_keeping"]


class CoreLog(StimulusLog):
    """The worker core's stimulus log: :meth:`record` keeps an event's entry (made only when
    the log keeps any, and the event is worth keeping)."""

    __slots__ = ()

    def record(self, event: Event, n: int, cause: Cause, out: list[Instruction]) -> None:
        """Keep ``event``, the ``n``-th the core handled, of id ``cause``, which decided
        ``out``."""
        if self.keep and worth_keeping(event, out):
            self.add(stimulus(event, n, cause, event.now, out))


def worth_keeping(event: Event, out: list[Instruction]) -> bool:
    """Whether ``event``, which decided ``out``, goes into the log (see the module docstring)."""
    return bool(out) or type(event) not in (Heard, Tick)


def stimulus(event: Event, n: int, cause: Cause, now: float, out: list[Instruction]) -> Stimulus:
    """The log entry of ``event``, the ``n``-th the core handled, of id ``cause``, which
    decided ``out``."""
    about: set[str] = set()
    _event_about(event, about)
    did = tuple(_did(instruction, about) for instruction in out)
    about.discard("")
    try:
        name = stimulus_id(event, n)
        text = cause_text(cause)
    except Exception:  # an object of no event type: a bug, which the core answered with a Fault
        name = f"{type(event).__name__}#{n}"
        text = cause if isinstance(cause, str) and cause else name
    return Stimulus(text, now, name, did, frozenset(about))


def _event_about(event: Event, about: set[str]) -> None:
    if isinstance(event, Received):
        about.update((event.sender, event.msg.job))
    elif isinstance(event, Undeliverable):
        about.update((event.peer, event.msg.job))
    else:
        for field in _ABOUT.get(type(event), ()):
            value = field(event)
            if isinstance(value, str):
                about.add(value)


#: event type -> the fields naming what it is about (jobs, peers, models)
_ABOUT: dict[type, tuple[Callable[[Any], Any], ...]] = {
    kind: tuple(map(attrgetter, fields))
    for kind, fields in (
        (Submit, ("job_id", "key")),
        (PlanReady, ("job_id",)),
        (TaskDone, ("entry.job_id", "entry.model")),
        (TaskFailed, ("entry.job_id", "entry.model")),
        (TaskReturned, ("entry.job_id",)),
        (ModelLoaded, ("model",)),
        (LoadFailed, ("model",)),
        (PeerLost, ("name",)),
        (Cancel, ("job_id",)),
        (PlanAsked, ("request.job", "request.ingress")),
        (Heard, ("heartbeat.name",)),
        (PeerJoined, ("name",)),
        (PeerDraining, ("name",)),
    )
}


def _did(step: Instruction, about: set[str]) -> str:
    """``step`` in words; what it names goes into ``about``."""
    if isinstance(step, Send):
        msg = step.msg
        about.update((step.peer, msg.job))
        task = getattr(msg, "task", None)
        return f"send {msg.op} {msg.job}{'' if task is None else '/' + task} to {step.peer}"
    if isinstance(step, RunTask):
        entry = step.entry
        about.add(entry.job_id)
        if entry.model:
            about.add(entry.model)
        return f"run {entry.job_id}/{entry.task} on lane {step.lane}"
    if isinstance(step, LoadModel):
        about.add(step.model)
        about.update(step.evict)
        evict = f", evicting {', '.join(step.evict)}" if step.evict else ""
        return f"load {step.model}{' (prefetch)' if step.prefetch else ''}{evict}"
    if isinstance(step, Answer):
        about.add(step.job_id)
        return f"answer {step.job_id}: {_outcome(step.error)}"
    if isinstance(step, AskPlan):
        about.update((step.peer, step.request.job))
        return f"ask {step.peer} to plan {step.request.job}"
    if isinstance(step, Planned):
        about.update((step.peer, step.job_id))
        return f"planned {step.job_id} for {step.peer}: {_outcome(step.error)}"
    if isinstance(step, Fault):
        return f"fault: {_outcome(step.error)}"
    return type(step).__name__  # pragma: no cover - every instruction type is above


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    return f"{type(error).__name__}: {error}"[:300]
