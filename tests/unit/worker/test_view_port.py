"""The real worker's core and view port are deterministic: time comes from the events, the
candidates are sampled with the port's own generator, and the watches a plan wants are
instructions (:class:`~compass.core.events.Watch`) whose failures come back as events.

Recorded events (peers joining, their heartbeats, jobs submitted over event time longer than a
watch lease) are fed to fresh, never started workers built from the same configuration: twice
at once, and once more with the wall clock a day later. The instructions must be the same each
time, and the watches must follow event time: asked at the first plans, not again while the
lease holds, asked again when half of it has passed in event time.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from compass.config import SchedConfig, WorkerConfig
from compass.core.events import (
    Event,
    Heard,
    Instruction,
    PeerJoined,
    Submit,
    WatchFailed,
)
from compass.sched.heartbeat import Heartbeat
from compass.worker.process import build_worker
from compass.workflow.spec import load_workload

WORKLOAD = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
PEERS = 12
GB = 1 << 30
LEASE_S = 10.0


def config() -> WorkerConfig:
    sched = SchedConfig(view="bounded", candidates=2, watch_ms=LEASE_S * 1000.0)
    return WorkerConfig(name="w0", workload=str(WORKLOAD), sched=sched)


def recorded_events() -> list[Event]:
    """Peers join and say their state; jobs arrive over 1.5 leases of event time."""
    workload = load_workload(str(WORKLOAD))
    models = sorted(workload.models)
    events: list[Event] = []
    for i in range(1, PEERS + 1):
        name = f"w{i}"
        events.append(PeerJoined(0.0, name, f"i{i}"))
        held = frozenset({models[i % len(models)], models[(3 * i) % len(models)]})
        events.append(Heard(0.0, Heartbeat(name, 0.01 * i, held, 8 * GB, 16 * GB, seq=1)))
    workflows = sorted(workload.workflows)
    now = 0.1
    for n in range(60):
        now += LEASE_S / 40  # 60 jobs over 1.5 leases
        workflow = workload.workflows[workflows[n % len(workflows)]]
        inputs: dict[str, Any] = dict.fromkeys(workflow.inputs, 1)
        events.append(Submit(now, f"w0-{n + 1}", workflow.name, inputs, 64, now))
        if n == 20:
            events.append(WatchFailed(now, "w3"))  # a watch that could not be sent
    return events


def shape(step: Instruction) -> tuple[Any, ...]:
    """An instruction as comparable data: its kind, what it names, its cause."""
    names = [getattr(step, field, None) for field in ("peer", "peers", "job_id", "model")]
    return (type(step).__name__, *names, getattr(step, "cause", None))


def replay(events: list[Event]) -> list[list[tuple[Any, ...]]]:
    worker = build_worker(config())
    return [[shape(step) for step in worker.core.handle(event)] for event in events]


def watches(answers: list[list[tuple[Any, ...]]], events: list[Event]) -> list[tuple[float, str]]:
    return [
        (event.now, peer)
        for event, out in zip(events, answers, strict=True)
        for step in out
        if step[0] == "Watch"
        for peer in step[2]
    ]


def test_the_same_events_give_the_same_instructions_whatever_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = recorded_events()
    first, second = replay(events), replay(events)
    day = 86_400.0
    real_monotonic, real_time = time.monotonic, time.time
    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + day)
    monkeypatch.setattr(time, "time", lambda: real_time() + day)
    later = replay(events)
    monkeypatch.undo()
    assert first == second == later
    planned = {step[1] for out in first for step in out if step[0] in {"Send", "AskPlan"}}
    assert len(planned - {None}) > 2, "the jobs were planned over several peers"


def test_watches_are_instructions_that_follow_event_time() -> None:
    events = recorded_events()
    answers = replay(events)
    asked = watches(answers, events)
    assert asked, "planning over candidates asked them for a watch"
    by_peer: dict[str, list[float]] = {}
    for when, peer in asked:
        by_peer.setdefault(peer, []).append(when)
    for peer, times in by_peer.items():
        # never asked twice while the lease holds past its half (a failed ask is forgotten)
        for earlier, later in itertools.pairwise(times):
            assert later - earlier >= LEASE_S / 2 or peer == "w3", (peer, times)
    # the events span 1.5 leases: some lease was renewed, by event time alone
    assert any(len(times) > 1 for times in by_peer.values()), by_peer


def test_a_watch_that_failed_is_asked_again_at_the_next_plan_that_samples_the_peer() -> None:
    events: list[Event] = [e for e in recorded_events() if not isinstance(e, WatchFailed)]
    asked = watches(replay(events), events)
    # a peer asked early: without a failure, it is not asked again for half a lease
    when, peer = asked[len(asked) // 2]
    assert not [t for t, p in asked if p == peer and when < t < when + LEASE_S / 2]
    at = next(i for i, e in enumerate(events) if e.now == when) + 1
    failed = [*events[:at], WatchFailed(when, peer), *events[at:]]
    again = [t for t, p in watches(replay(failed), failed) if p == peer and t > when]
    assert again and again[0] < when + LEASE_S / 2, (peer, when, again)


def test_a_replayed_event_stream_is_unchanged_by_a_second_worker_in_between() -> None:
    # two workers built from one configuration share nothing: the second's draws do not
    # move the first's (each port's generator is its own, seeded by the name)
    events = recorded_events()
    alone = replay(events)
    one, other = build_worker(config()), build_worker(replace(config()))
    interleaved = []
    for event in events:
        other.core.handle(event)
        interleaved.append([shape(step) for step in one.core.handle(event)])
    assert interleaved == alone


def test_the_core_counts_only_in_handle_and_the_adapter_in_its_own_counters() -> None:
    events = recorded_events()
    counts = []
    for _ in range(2):
        worker = build_worker(config())
        assert worker.core.stats is not worker.run_stats
        for event in events:
            worker.core.handle(event)
        counts.append(worker.core.stats)
        assert worker.run_stats == type(worker.run_stats)(), "handle wrote no adapter counter"
        worker.run_stats.messages_dropped += 2  # refused at the door: the adapter's count
        assert worker.stats.messages_dropped == worker.core.stats.messages_dropped + 2
        assert worker.stats.jobs_submitted == worker.core.stats.jobs_submitted > 0
    assert counts[0] == counts[1]
