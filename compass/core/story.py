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

from compass.core.causes import Cause
from compass.core.events import (
    Answer,
    AskPlan,
    Cancel,
    Chunk,
    Event,
    Fault,
    Feed,
    Heard,
    Instruction,
    JoinRun,
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
    StopTask,
    Submit,
    TaskDone,
    TaskFailed,
    TaskReturned,
    TaskStep,
    Tick,
    Undeliverable,
    Watch,
    WatchFailed,
    stimulus_id,
)
from compass.core.messages import ChoseMsg, TaskMsg
from compass.stimuli import Stimulus, StimulusLog
from compass.workflow.choices import is_skipped

__all__ = ["CoreLog", "Stimulus", "stimulus", "worth_keeping"]


class CoreLog(StimulusLog):
    """The worker core's stimulus log: :meth:`record` keeps an event's entry (made only when
    the log keeps any, and the event is worth keeping)."""

    __slots__ = ()

    def record(self, event: Event, n: int, cause: Cause, out: list[Instruction]) -> None:
        """Keep ``event``, the ``n``-th the core handled, of id ``cause``, which decided
        ``out``."""
        if self.keep and (out or type(event) not in _QUIET):  # worth_keeping, inlined
            self._entries.append(stimulus(event, n, cause, event.now, out))


#: events not kept when they decide nothing
_QUIET = frozenset({Heard, Tick})


def worth_keeping(event: Event, out: list[Instruction]) -> bool:
    """Whether ``event``, which decided ``out``, goes into the log (see the module docstring)."""
    return bool(out) or type(event) not in _QUIET


def stimulus(event: Event, n: int, cause: Cause, now: float, out: list[Instruction]) -> Stimulus:
    """The log entry of ``event``, the ``n``-th the core handled, of id ``cause``, which
    decided ``out``."""
    about = _event_about(event)
    did = tuple([_did(instruction, about) for instruction in out])
    try:
        name = stimulus_id(event, n)
    except Exception:  # an object of no event type: a bug, which the core answered with a Fault
        name = f"{type(event).__name__}#{n}"
    # the event's own id, or (itself, n): then its id is its name, made once
    text = cause if isinstance(cause, str) else name
    return Stimulus(text, now, name, did, tuple(about))


def _event_about(event: Event) -> list[str]:
    """What ``event`` names."""
    if isinstance(event, Received):
        return [event.sender, event.msg.job]
    if isinstance(event, Undeliverable):
        return [event.peer, event.msg.job]
    fields = _ABOUT.get(type(event))
    return [] if fields is None else list(fields(event))


def _getter(*fields: str) -> Callable[[Any], tuple[Any, ...]]:
    """The values of ``fields`` of an object, as a tuple, read at once."""
    get = attrgetter(*fields)
    return get if len(fields) > 1 else lambda thing: (get(thing),)


#: event type -> the fields naming what it is about (jobs, peers, models)
_ABOUT: dict[type, Callable[[Any], tuple[str, ...]]] = {
    kind: _getter(*fields)
    for kind, fields in (
        (Submit, ("job_id",)),
        (PlanReady, ("job_id",)),
        (TaskDone, ("entry.job_id",)),
        (TaskFailed, ("entry.job_id",)),
        (TaskReturned, ("entry.job_id",)),
        (ModelLoaded, ("model",)),
        (LoadFailed, ("model",)),
        (PeerLost, ("name",)),
        (Cancel, ("job_id",)),
        (PlanAsked, ("request.job", "request.ingress")),
        (Heard, ("heartbeat.name",)),
        (PeerJoined, ("name",)),
        (PeerDraining, ("name",)),
        (WatchFailed, ("peer",)),
        (TaskStep, ("entry.job_id",)),
    )
}


def _did(step: Instruction, about: list[str]) -> str:
    """``step`` in words; what it names goes into ``about``."""
    if isinstance(step, Send):
        msg = step.msg
        about += (step.peer, msg.job)
        task = getattr(msg, "task", None)
        what = f"{msg.job}{'' if task is None else '/' + task}"
        if isinstance(msg, ChoseMsg):  # a run-time choice, for the job's ingress
            return f"send chose {what}: {msg.label} to {step.peer}"
        if isinstance(msg, TaskMsg) and is_skipped(msg.value):
            return f"send skip {what} (from {msg.source}) to {step.peer}"
        return f"send {msg.op} {what} to {step.peer}"
    if isinstance(step, RunTask):
        entry = step.entry
        about.append(entry.job_id)
        if entry.model is not None:
            about.append(entry.model)
        return f"run {entry.job_id}/{entry.task} on lane {step.lane}"
    if isinstance(step, LoadModel):
        about.append(step.model)
        about += step.evict
        evict = f", evicting {', '.join(step.evict)}" if step.evict else ""
        return f"load {step.model}{' (prefetch)' if step.prefetch else ''}{evict}"
    if isinstance(step, Answer):
        about.append(step.job_id)
        return f"answer {step.job_id}: {_outcome(step.error)}"
    if isinstance(step, AskPlan):
        about += (step.peer, step.request.job)
        return f"ask {step.peer} to plan {step.request.job}"
    if isinstance(step, Planned):
        about += (step.peer, step.job_id)
        return f"planned {step.job_id} for {step.peer}: {_outcome(step.error)}"
    if isinstance(step, Chunk):
        about.append(step.job_id)
        return f"chunk {step.seq} of {step.job_id}/{step.task}"
    if isinstance(step, Feed):
        about.append(step.job_id)
        what = "breaks" if step.error else ("ends" if step.last else f"chunk {step.seq}")
        return f"feed {step.job_id}/{step.source}->{step.task}: {what}"
    if isinstance(step, StopTask):
        about += [entry.job_id for entry in step.entries]
        return "stop " + ", ".join(f"{e.job_id}/{e.task}" for e in step.entries)
    if isinstance(step, JoinRun):
        about += [entry.job_id for entry in step.entries]
        joined = ", ".join(f"{e.job_id}/{e.task}" for e in step.entries)
        return f"join {joined} to the step batch of {step.lead.job_id} on lane {step.lane}"
    if isinstance(step, Watch):
        about += step.peers
        return f"watch {', '.join(step.peers)}"
    if isinstance(step, Fault):
        return f"fault: {_outcome(step.error)}"
    return type(step).__name__  # pragma: no cover - every instruction type is above


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return "ok"
    return f"{type(error).__name__}: {error}"[:300]
