"""Replay: the worker core is the only writer of a worker's state, so a real worker's events,
fed again to a fresh worker's core, give the same instructions.

Two real-mode workers (real functions, real torch models in host memory, profiles learning
from measured runs, pushes and loads) run jobs over loopback TCP. Each one's core is
wrapped to keep every event it handled and the instructions it answered. Then, for each, a
fresh worker built from the same configuration (not started) replays the events, twice: what
it answers must match the live run, instruction for instruction. Anything that changed a
core's state outside its events (a profile updated by the adapter, a heartbeat put straight
into the view, a clock read) would make the replay diverge.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
from torch import nn

import compass
from compass.config import CacheConfig, WorkerConfig
from compass.core.events import (
    Answer,
    AskPlan,
    Chunk,
    Event,
    Fault,
    Feed,
    Heard,
    Instruction,
    Planned,
    Received,
    Send,
    StopTask,
    TaskDone,
    TaskFailed,
    TaskReturned,
    Watch,
)
from compass.core.lanes import LoadModel, RunTask
from compass.core.queue import QueuedTask
from compass.worker.process import build_worker
from compass.worker.server import Worker

app = compass.App("replay")
app.model("a", lambda: nn.Linear(16, 16))
app.model("b", lambda: nn.Linear(16, 16))
flow = app.workflow("flow", inputs=["x"])


@flow.task(model="a", expected_ms=5.0)
def first(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(x)
    return out


@flow.task(model="b", after=["first"], expected_ms=5.0)
def second(model: nn.Module, first: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(first)
    return out


@flow.task(after=["first"], expected_ms=1.0)
def side(model: None, first: torch.Tensor) -> torch.Tensor:
    return first * 2


@flow.task(after=["second", "side"], expected_ms=1.0)
def join(model: None, second: torch.Tensor, side: torch.Tensor) -> float:
    return float((second + side).sum())


JOBS = 16


@dataclass
class Journal:
    """What one core handled, and what it answered, in order."""

    events: list[Event] = field(default_factory=list)
    answers: list[list[Instruction]] = field(default_factory=list)


def journaled(worker: Worker) -> Journal:
    """Keep every event ``worker``'s core handles and the instructions it answers."""
    journal = Journal()
    handle = worker.core.handle

    def recording(event: Event) -> list[Instruction]:
        out = handle(event)
        journal.events.append(event)
        journal.answers.append(out)
        return out

    worker.core.handle = recording  # type: ignore[method-assign]
    return journal


def shape(step: Instruction) -> tuple[Any, ...]:
    """An instruction as comparable data (values and queue entries compare by what they say,
    not by identity)."""
    match step:
        case Send():
            msg = step.msg
            return ("send", step.peer, type(msg).__name__, msg.job, getattr(msg, "task", ""),
                    getattr(msg, "plan", None), step.cause)  # fmt: skip
        case RunTask():
            # what the core expected of each entry is read from its profiles, as learned
            return ("run", tuple((e.job_id, e.task, e.expected_s, e.fetch_s) for e in step.entries),
                    step.lane, step.host, step.cause)  # fmt: skip
        case LoadModel():
            return ("load", step.model, step.evict, step.prefetch, step.cause)
        case Answer():
            error = None if step.error is None else type(step.error).__name__
            return ("answer", step.job_id, error, step.record.get("plan"), step.cause)
        case AskPlan():
            return ("ask", step.peer, step.request.job, step.cause)
        case Planned():
            return ("planned", step.peer, step.job_id, step.plan, step.cause)
        case Watch():
            return ("watch", step.peers, step.cause)
        case StopTask():
            return ("stop", tuple((e.job_id, e.task) for e in step.entries), step.cause)
        case Chunk():
            return ("chunk", step.job_id, step.task, step.seq, step.cause)
        case Feed():
            error = None if step.error is None else type(step.error).__name__
            return ("feed", step.job_id, step.task, step.source, step.seq, error, step.cause)
        case Fault():
            return ("fault", repr(step.error), step.cause)
    raise AssertionError(f"not an instruction: {step!r}")


def replayed(config: WorkerConfig, journal: Journal) -> list[list[tuple[Any, ...]]]:
    """A fresh worker's core, built from ``config`` and never started, fed the journal. The
    events of a task's end name the live core's queue entry: each is swapped for the fresh
    core's own entry of that task (the lanes know their entries by identity)."""
    fresh = build_worker(config)
    entries: dict[tuple[str, int, str], QueuedTask] = {}
    answers = []
    for event in journal.events:
        if isinstance(event, TaskDone | TaskFailed | TaskReturned):
            live = event.entry
            event = replace(event, entry=entries[live.job_id, live.attempt, live.task])
        out = fresh.core.handle(event)
        for step in out:
            if isinstance(step, RunTask):
                entries.update(((e.job_id, e.attempt, e.task), e) for e in step.entries)
        answers.append([shape(step) for step in out])
    return answers


def config(name: str, join: tuple[str, ...] = ()) -> WorkerConfig:
    return WorkerConfig(
        name=name,
        app=__name__,
        join=join,
        lanes=2,
        cache=CacheConfig(backend="host"),
    )


@pytest.mark.asyncio
async def test_a_real_workers_events_replayed_give_the_same_instructions() -> None:
    configs = [config("w0")]
    w0 = build_worker(configs[0])
    journals = [journaled(w0)]
    async with w0:
        configs.append(config("w1", join=(w0.address,)))
        w1 = build_worker(configs[1])
        journals.append(journaled(w1))
        async with w1:
            async with asyncio.timeout(30):
                while not (w0.gossip.port.view.get("w1") and w1.gossip.port.view.get("w0")):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)  # each in the other's view: heartbeats flow
                inputs = [{"x": torch.full((4, 16), float(i))} for i in range(JOBS)]
                answers = await asyncio.gather(
                    *(w.submit("flow", x) for w, x in zip([w0, w1] * JOBS, inputs, strict=False))
                )
    assert len(answers) == JOBS and all(isinstance(a, float) for a in answers)

    for cfg, journal in zip(configs, journals, strict=True):
        kinds = {type(e).__name__ for e in journal.events}
        # the run had what learning and the view feed on: measured runs, pushes, heartbeats
        assert {"Submit", "Received", "TaskDone", "ModelLoaded", "Heard"} <= kinds, kinds
        assert any(isinstance(e, TaskDone) and e.exec_s is not None for e in journal.events)
        assert any(isinstance(e, Received) and e.transfer_s > 0 for e in journal.events)
        assert sum(isinstance(e, Heard) for e in journal.events) > 2
        live = [[shape(step) for step in out] for out in journal.answers]
        assert not any(step[0] == "fault" for out in live for step in out)
        first, second = replayed(cfg, journal), replayed(cfg, journal)
        for i, (a, b, c) in enumerate(zip(live, first, second, strict=True)):
            assert a == b == c, f"{cfg.name}: event {i} ({journal.events[i]!r:.200}) diverged"
