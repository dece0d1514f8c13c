"""Preemption at step boundaries in the simulator, which runs the same core: worked by hand on
one worker, one model, a 10-step generation (100 ms a step) and a 50 ms task of another job."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from compass.objective import Objective
from compass.sim.arrivals import Arrival
from compass.sim.engine import simulate
from compass.sim.result import SimResult
from compass.sim.settings import SimSettings
from compass.workflow.spec import parse_workload


def workload(steps: int = 10, *, batch: bool = False) -> Any:
    gen: dict[str, Any] = {"model": "a", "exec_ms": 1000, "output_kb": 0, "input_kb": 0,
                           "after": [], "steps": steps, "state_kb": 100}  # fmt: skip
    if batch:  # up to 8 jobs a step, each extra one 10% more
        gen.update(batch=8, batch_item=0.1)
    det: dict[str, Any] = {"model": "a", "exec_ms": 50, "output_kb": 0, "input_kb": 0,
                           "after": []}  # fmt: skip
    spec = {
        "name": "steps",
        "cluster": {
            "workers": 1,
            "gpu_memory_mb": 2000,
            "h2d_gbps": 10,
            "d2h_gbps": 10,
            "net_gbps": 10,
            "net_fixed_us": 0,
        },
        "models": {"a": {"size_mb": 500}},
        "workflows": {"gen": {"tasks": {"g": gen}}, "det": {"tasks": {"d": det}}},
        "arrivals": {"mean_interval_ms_per_client": 1000, "jobs": 2},
    }
    return parse_workload(spec, source="steps")


def run(arrivals: list[Arrival], *, preempt: bool, steps: int = 10) -> SimResult:
    settings = SimSettings(workers=1, policy="compass", warm_start=True, preempt=preempt)
    return simulate(workload(steps), settings, arrivals)


def latencies_of(result: SimResult) -> list[float]:
    return [j.latency_s or -1.0 for j in sorted(result.jobs, key=lambda j: j.arrival)]


def latencies(result: SimResult) -> dict[str, float]:
    return {j.workflow: j.latency_s or -1.0 for j in result.jobs}


def test_a_short_job_takes_the_lane_at_the_next_step_and_the_generation_resumes() -> None:
    arrivals = [Arrival(0.0, "gen", 0), Arrival(0.15, "det", 1)]
    off, on = run(arrivals, preempt=False), run(arrivals, preempt=True)
    # without: det waits for the whole generation (to 1.0 s), then runs 50 ms
    assert latencies(off)["det"] == pytest.approx(1.05 - 0.15, abs=1e-3)
    # with: det runs at the boundary of step 2 (0.2 s), the generation resumes after it and
    # ends 50 ms later than it would have; its steps ran once: two task records, 0.2 + 0.8 s
    assert latencies(on)["det"] == pytest.approx(0.25 - 0.15, abs=1e-3)
    assert latencies(on)["gen"] == pytest.approx(1.05, abs=1e-3)
    runs = sorted(t.exec_s for t in on.tasks if t.task == "g")
    assert runs == pytest.approx([0.2, 0.8], abs=1e-3)


def waits(result: SimResult, task: str, job: str | None = None) -> list[float]:
    """Queued then suspended seconds of each run of ``task`` (of ``job``: any job), in the
    order they ended."""
    runs = [t for t in result.tasks if t.task == task and job in (None, t.job_id)]
    return [s for t in runs for s in (t.queue_s, t.suspended_s)]


def test_a_resumed_tasks_records_say_how_long_it_waited_queued_and_suspended() -> None:
    # a short job first (0-0.05 s): the generation, come at 0.01 s, waits 0.04 s for its first
    # step; the short job of 0.2 s takes the lane at its boundary of 0.25 s, and the generation
    # resumes at 0.3 s: 0.05 s suspended. One record a run, no wait negative or counted twice
    arrivals = [Arrival(0.0, "det", 0), Arrival(0.01, "gen", 1), Arrival(0.2, "det", 2)]
    on = run(arrivals, preempt=True)
    assert waits(on, "g") == pytest.approx([0.04, 0.0, 0.0, 0.05], abs=1e-6)
    assert all(t.queue_s >= 0.0 and t.suspended_s >= 0.0 for t in on.tasks)
    # the summary's queue is the mean wait a run (both kinds): 0, 0.04 + 0.05, 0.05 over four
    queue_ms = on.summary()["breakdown_ms"]["queue"]
    assert queue_ms == pytest.approx((0.04 + 0.05 + 0.05) / 4 * 1000.0, abs=1e-3)


def test_a_plain_workload_runs_exactly_as_without_preemption() -> None:
    arrivals = [Arrival(0.0, "gen", 0), Arrival(0.15, "det", 1)]
    off, on = run(arrivals, preempt=False, steps=1), run(arrivals, preempt=True, steps=1)
    assert latencies(on) == latencies(off) and on.events == off.events


def test_a_generation_delayed_past_saving_stops_instead_of_running_on() -> None:
    # the generation (deadline 1.12 s after it came) is preempted by three priority-1 jobs of
    # 50 ms, one a step (a higher priority preempts whatever else); suspended the third time,
    # 0.7 s of steps left behind 50 ms of work would end 0.03 s past its deadline: it is
    # dropped from the queue there, its kept state stopped, never resumed to miss anyway
    urgent = Objective(priority=1)
    arrivals = [Arrival(0.0, "gen", 0, Objective(deadline_s=1.12)),
                *(Arrival(t, "det", 1, urgent) for t in (0.05, 0.2, 0.35))]  # fmt: skip
    on = run(arrivals, preempt=True)
    gen = next(j for j in on.jobs if j.workflow == "gen")
    assert gen.outcome == "dropped" and gen.latency_s is None
    assert all(j.outcome == "ok" for j in on.jobs if j.workflow == "det")
    # its lane time: three steps of 0.1 s, not the ten it would have run to miss anyway
    assert sum(t.exec_s for t in on.tasks if t.task == "g") == pytest.approx(0.3, abs=1e-3)


def test_a_step_batch_is_suspended_whole_and_every_member_runs_each_step_once() -> None:
    # two generations share their steps (each extra member +10% a step: 0.11 s for two); the
    # second takes its seat at the first boundary (0.1 s). The short job comes at 0.25 s and
    # takes the lane at the boundary of 0.32 s (times from the first arrival): the batch is
    # suspended whole, and resumes as one at 0.37 s (the first with 7 steps left, the second
    # with 8)
    arrivals = [Arrival(0.0, "gen", 0), Arrival(0.05, "gen", 1), Arrival(0.25, "det", 2)]
    settings = SimSettings(workers=1, policy="compass", warm_start=True, preempt=True)
    result = simulate(workload(batch=True), settings, arrivals)
    assert all(j.outcome == "ok" for j in result.jobs) and len(result.jobs) == 3
    # latencies, in arrival order: the first generation ends at 0.37 + 7 x 0.11, the second
    # one step later; the short job at 0.32 + 0.05
    assert latencies_of(result) == pytest.approx([1.14, 1.24 - 0.05, 0.12], abs=1e-6)
    # without preemption the short job waits for both generations (to 1.24 s)
    off = simulate(workload(batch=True), dataclasses.replace(settings, preempt=False), arrivals)
    assert latencies_of(off) == pytest.approx([1.09, 1.19 - 0.05, 1.24 - 0.25], abs=1e-6)
    # the lane's time on the generations: 0.1 alone, two steps of two, seven of two, one alone
    lane_s = sum(t.exec_s for t in result.tasks if t.task == "g")
    assert lane_s == pytest.approx(0.1 + 0.22 + 0.77 + 0.1, abs=1e-6)
    # their waits, a record a run: neither queued (the second joined the batch as it came),
    # both waited suspended from 0.32 to 0.37 s (counted on their second runs alone)
    for job in ("w0-1", "w0-2"):
        assert waits(result, "g", job) == pytest.approx([0.0, 0.0, 0.0, 0.05], abs=1e-6)
