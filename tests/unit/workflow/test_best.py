"""The best possible latency of a workflow: hand-computed critical paths with transfers, the
declared-value check, and the simulator never beating it (and meeting it on one worker)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim import Arrival, job_arrivals, simulate
from compass.sim.settings import SimSettings
from compass.workflow import Profiles, Workflow, Workload, load_workload, parse_workload
from compass.workflow.best import (
    ROUNDING_SLACK,
    best_time_s,
    check_declared,
    declared_disagreements,
)

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
MB = 1_000_000
# bandwidths in bytes/s and the fixed network latency in s: a transfer of n bytes between two
# workers costs FIXED + n/NET + n/D2H + n/H2D = 0.1 ms + 1.3 ns per byte, so
# 10 kB -> 0.113 ms, 1000 kB -> 1.4 ms, 10000 kB -> 13.1 ms
H2D, D2H, NET, FIXED = 10e9, 5e9, 1e9, 100e-6


def workload(workflows: dict[str, Any], **models: float) -> Workload:
    return parse_workload(
        {
            "name": "hand",
            "cluster": {
                "workers": 2,
                "gpu_memory_mb": 1000,
                "h2d_gbps": H2D / 1e9,
                "d2h_gbps": D2H / 1e9,
                "net_gbps": NET / 1e9,
                "net_fixed_us": FIXED * 1e6,
            },
            "models": {name: {"size_mb": size} for name, size in models.items()},
            "workflows": workflows,
        }
    )


def task(model: str | None, exec_ms: float, output_kb: float, *after: str) -> dict[str, Any]:
    return {"model": model, "exec_ms": exec_ms, "output_kb": output_kb, "after": list(after)}


def best_ms(w: Workload, name: str, **kwargs: Any) -> float:
    """The bound in ms, with the rounding slack taken back out (it is tested on its own)."""
    seconds = best_time_s(w.workflows[name], Profiles.from_workload(w), **kwargs)
    return seconds / (1.0 - ROUNDING_SLACK) * 1000.0


HAND = workload(
    {
        # a -> b -> c: everything can run where its predecessor ran; 10 + 20 + 5 = 35 ms
        "chain": {
            "tasks": {
                "a": task("ma", 10, 10_000),
                "b": task("mb", 20, 10_000, "a"),
                "c": task("mc", 5, 10_000, "b"),
            }
        },
        # r(10) -> x(30), y(30), z(5) -> j(4), 1000 kB outputs (1.4 ms on the wire).
        # x, y, z finish at 40, 40, 15. j on x's worker: y's output arrives at 41.4;
        # j where x and y both ran: they share one lane, 10 + 30 + 30 = 70.
        # So j starts at 41.4 and ends at 45.4 ms. On one worker: 10+30+30+5+4 = 79 ms.
        "fan": {
            "tasks": {
                "r": task("ma", 10, 1000),
                "x": task("mb", 30, 1000, "r"),
                "y": task("mc", 30, 1000, "r"),
                "z": task("ma", 5, 1000, "r"),
                "j": task("mb", 4, 1000, "x", "y", "z"),
            }
        },
        # r(10) -> a(1), b(1) -> j(2), 10000 kB outputs (13.1 ms on the wire). Sending b's
        # output: 11 + 13.1 = 24.1; running a and b one after the other where j runs:
        # 10 + 1 + 1 = 12. So j runs 12..14 ms: serializing beats the transfer.
        "diamond": {
            "tasks": {
                "r": task("ma", 10, 1000),
                "a": task("mb", 1, 10_000, "r"),
                "b": task("mc", 1, 10_000, "r"),
                "j": task("ma", 2, 1000, "a", "b"),
            }
        },
        # r(10) -> a(8), b(8) -> j(2), 10 kB outputs (0.113 ms). a and b finish at 18; the
        # other's output arrives at 18.113 (serializing: 10 + 16 = 26). j: 18.113 + 2.
        "diamond_cheap": {
            "tasks": {
                "r": task("ma", 10, 1000),
                "a": task(None, 8, 10, "r"),
                "b": task("mc", 8, 10, "r"),
                "j": task("ma", 2, 10, "a", "b"),
            }
        },
        # r(10) -> a(5), b(5), both sinks, 10000 kB outputs: both answers must reach the
        # ingress; sending one costs 15 + 13.1 = 28.1, running both there 10 + 5 + 5 = 20.
        "two_sinks": {
            "tasks": {
                "r": task("ma", 10, 1000),
                "a": task("mb", 5, 10_000, "r"),
                "b": task("mc", 5, 10_000, "r"),
            }
        },
    },
    ma=100,
    mb=100,
    mc=100,
)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected_ms"),
    [
        ("chain", {}, 35.0),
        ("chain", {"workers": 1}, 35.0),
        ("chain", {"workers": 4}, 35.0),
        ("fan", {}, 45.4),
        ("fan", {"workers": 2}, 45.4),  # all the work on 2 lanes: 79 / 2 = 39.5 < 45.4
        ("fan", {"workers": 1}, 79.0),
        ("diamond", {}, 14.0),
        # two lanes: a and b run side by side where j runs, both done at 11
        ("diamond", {"lanes": 2}, 13.0),
        ("diamond", {"workers": 1}, 14.0),
        ("diamond_cheap", {}, 20.113),
        # a (no model) on a host lane beside b on the GPU lane: both at 18 where j runs
        ("diamond_cheap", {"host_lanes": 1}, 20.0),
        ("diamond_cheap", {"workers": 1}, 28.0),
        ("two_sinks", {}, 20.0),
    ],
)
def test_hand_computed_best_times(name: str, kwargs: dict[str, Any], expected_ms: float) -> None:
    assert best_ms(HAND, name, **kwargs) == pytest.approx(expected_ms, rel=1e-9)


def test_the_bound_is_shaved_by_the_rounding_slack_only() -> None:
    seconds = best_time_s(HAND.workflows["chain"], Profiles.from_workload(HAND))
    assert seconds < 0.035
    assert seconds == pytest.approx(0.035 * (1 - ROUNDING_SLACK), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [{"workers": 0}, {"workers": True}, {"lanes": 0}, {"host_lanes": -1}, {"lanes": 1.5}],
)
def test_bad_arguments_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        best_time_s(HAND.workflows["chain"], Profiles.from_workload(HAND), **kwargs)


def _brute_force_ms(wf: Workflow, transfer_s: float, lanes: int) -> float:
    """The same rules with every subset of a join's predecessors tried (no prefix shortcut)."""
    start: dict[str, float] = {}
    finish: dict[str, float] = {}

    def local(tasks: tuple[str, ...]) -> float:
        jobs = [(start[t], wf.tasks[t].profile.exec_s) for t in tasks]
        bound = max(r + p for r, p in jobs)
        for r0, _ in jobs:
            bound = max(bound, r0 + sum(p for r, p in jobs if r >= r0) / lanes)
        return bound

    def meet(tasks: tuple[str, ...]) -> float:
        best = float("inf")
        for k in range(1, len(tasks) + 1):
            for here in itertools.combinations(tasks, k):
                sent = [finish[t] + transfer_s for t in tasks if t not in here]
                best = min(best, max([local(here), *sent]))
        return best

    for t in wf.order:
        preds = wf.preds(t)
        start[t] = 0.0 if not preds else finish[preds[0]] if len(preds) == 1 else meet(preds)
        finish[t] = start[t] + wf.tasks[t].profile.exec_s
    return 1000.0 * (finish[wf.sinks[0]] if len(wf.sinks) == 1 else meet(wf.sinks))


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_join_tries_every_set_of_local_predecessors(lanes: int) -> None:
    """Random fan-ins of up to six predecessors: only sorted prefixes are tried, and that must
    give the minimum over every subset."""
    rng = random.Random(11)
    for _ in range(40):
        width = rng.randint(2, 6)
        tasks = {"r": task(None, rng.uniform(1, 20), 100)}
        for i in range(width):
            tasks[f"p{i}"] = task(None, rng.choice([1, 2, 5, 20, 21, 50]), 100, "r")
        tasks["j"] = task(None, 1, 100, *(f"p{i}" for i in range(width)))
        tasks["k"] = task(None, 3, 100, "p0")  # a second sink
        w = workload({"f": {"tasks": tasks}})
        wf = w.workflows["f"]
        # 100 kB: 0.1 ms + 0.13 ms on the wire
        expected = _brute_force_ms(wf, FIXED + 100_000 * 1.3e-9, lanes)
        assert best_ms(w, "f", lanes=lanes) == pytest.approx(expected, rel=1e-9)


def test_the_paper_declares_what_compass_computes() -> None:
    paper = load_workload(PAPER)
    profiles = Profiles.from_workload(paper)
    assert declared_disagreements(paper, profiles) == []
    computed = check_declared(paper, profiles)
    for name, wf in paper.workflows.items():
        assert wf.best_ms is not None
        assert computed[name] * 1000.0 == pytest.approx(wf.best_ms, rel=0.01)


def test_a_declared_best_far_from_the_computed_one_is_reported() -> None:
    wrong = workload(
        {
            "chain": {
                "best_ms": 500,
                "tasks": {"a": task("ma", 10, 1), "b": task("ma", 25, 1, "a")},
            },
            "close": {"best_ms": 10.3, "tasks": {"a": task("ma", 10, 1)}},
            "fast": {"best_ms": 20, "tasks": {"a": task("ma", 30, 1)}},
            "silent": {"tasks": {"a": task("ma", 10, 1)}},
        },
        ma=100,
    )
    profiles = Profiles.from_workload(wrong)
    lines = declared_disagreements(wrong, profiles)
    assert len(lines) == 2
    chain, fast = lines
    assert "'chain'" in chain and "500" in chain and "35.0 ms" in chain and "+1328.6%" in chain
    assert "'fast'" in fast and "30.0 ms" in fast and "below what any run can reach" in fast
    assert all("\n" not in line for line in lines)
    # 3% off passes at the default 5%, not at 1%
    assert any("'close'" in line for line in declared_disagreements(wrong, profiles, 0.01))
    used = check_declared(wrong, profiles)
    assert used["chain"] == pytest.approx(0.035, rel=1e-5)
    assert used["fast"] == pytest.approx(0.030, rel=1e-5)
    trusted = check_declared(wrong, profiles, trust_declared=True)
    assert trusted["chain"] == 0.5 and trusted["fast"] == 0.02
    assert trusted["silent"] == pytest.approx(0.010, rel=1e-5)  # nothing declared: computed
    with pytest.raises(ConfigError, match="tolerance"):
        declared_disagreements(wrong, profiles, -0.1)


@pytest.mark.parametrize("name", ["chain", "fan", "diamond", "diamond_cheap", "two_sinks"])
def test_one_worker_with_warm_caches_meets_the_bound_exactly(name: str) -> None:
    """A job after the cache has warmed, alone on one worker with one lane, takes exactly the
    sum of its tasks' times: what the bound gives for one worker."""
    arrivals = [Arrival(0.0, name, 0), Arrival(10.0, name, 0)]
    result = simulate(
        HAND, SimSettings(workers=1, policy="compass", slab_bytes=MB, warm=True), arrivals
    )
    first, second = result.jobs
    assert first.latency_s is not None and second.latency_s is not None
    second_tasks = [t for t in result.tasks if t.job_id == second.id]
    assert all(t.cache_hit in (True, None) for t in second_tasks)  # warm: nothing to load
    bound = best_time_s(HAND.workflows[name], Profiles.from_workload(HAND), workers=1)
    assert second.latency_s >= bound
    assert second.latency_s == pytest.approx(bound, rel=2 * ROUNDING_SLACK)
    assert first.latency_s >= bound


def _latencies_respect_the_bound(w: Workload, result: Any, **kwargs: Any) -> list[float]:
    profiles = Profiles.from_workload(w)
    bound = {n: best_time_s(wf, profiles, **kwargs) for n, wf in w.workflows.items()}
    done = [j for j in result.jobs if j.latency_s is not None]
    assert len(done) == len(result.jobs)
    slowdowns = [j.latency_s / bound[j.workflow] for j in done]
    assert min(slowdowns) >= 1.0
    return slowdowns


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_policy_beats_the_bound_on_the_paper_workload(policy: str) -> None:
    paper = load_workload(PAPER)
    arrivals = job_arrivals(
        list(paper.workflows), 120, process="poisson", mean_interval_s=2.0, seed=3
    )
    result = simulate(paper, SimSettings(workers=5, policy=policy), arrivals)
    slowdowns = _latencies_respect_the_bound(paper, result)
    if policy == "compass":
        assert min(slowdowns) < 1.01  # and the bound is reached, not only respected


def test_more_lanes_and_host_lanes_need_their_own_bound() -> None:
    paper = load_workload(PAPER)
    arrivals = job_arrivals(
        list(paper.workflows), 120, process="poisson", mean_interval_s=2.0, seed=4
    )
    for policy in ("compass", "hash", "random"):
        result = simulate(
            paper, SimSettings(workers=3, policy=policy, lanes=2, host_lanes=1), arrivals
        )
        _latencies_respect_the_bound(paper, result, lanes=2, host_lanes=1)
