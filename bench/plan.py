"""Planner micro-benchmark: microseconds to plan one job with the ``compass`` policy.

For each paper workflow and each cluster size (5, 20, 80, 240 workers) it builds a random but
seeded view (waits uniform in [0, 2) s; each worker holds a random subset of the models that
fits 14 GB) and reports the median time to plan one job:

- ``plan_us``: the steady state, cost tables cached (profiles unchanged since the last job);
- ``plan_cold_us``: right after a profile measurement, so the workflow's cost table is rebuilt
  first (what the worker pays when a task finished since its last plan).

Target: ``plan_us`` under 200 us for every workflow at 240 workers.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from compass.sched import Heartbeat, JobInfo, ViewSnapshot, make_policy
from compass.workflow import Profiles, Workload, load_workload

from .report import write_json

__all__ = ["TARGET_US", "WORKER_COUNTS", "run"]

WORKLOAD_PATH = Path(__file__).resolve().parent / "workloads" / "paper.json"
WORKER_COUNTS = (5, 20, 80, 240)
TARGET_US = 200.0
CACHE_BYTES = 14_000_000_000


def random_view(workload: Workload, n_workers: int, seed: int) -> ViewSnapshot:
    """Seeded random waits and model residency (each worker's subset fits its cache)."""
    rng = np.random.default_rng(seed)
    models = sorted(workload.models)
    states = []
    for i in range(n_workers):
        held: set[str] = set()
        used = 0
        for model in rng.permutation(models):
            size = workload.models[str(model)]
            if used + size <= CACHE_BYTES:
                held.add(str(model))
                used += size
        wait = float(rng.uniform(0.0, 2.0))
        states.append(
            Heartbeat(f"w{i:03d}", wait, frozenset(held), CACHE_BYTES - used, CACHE_BYTES)
        )
    return ViewSnapshot.build(states)


def _median_us(samples_ns: list[int]) -> float:
    return round(statistics.median(samples_ns) / 1000.0, 1)


def run(json_path: str | None = None, quick: bool = False) -> dict[str, Any]:
    """Measure, print a table, and write JSON to ``json_path`` when given."""
    workload = load_workload(WORKLOAD_PATH)
    repeats = 40 if quick else 400
    warm: dict[str, dict[str, float]] = {}
    cold: dict[str, dict[str, float]] = {}
    for n_workers in WORKER_COUNTS:
        view = random_view(workload, n_workers, seed=n_workers)
        profiles = Profiles.from_workload(workload)
        policy = make_policy("compass")
        warm_row: dict[str, float] = {}
        cold_row: dict[str, float] = {}
        for wf in workload.workflows.values():
            job = JobInfo("bench", wf, view.names[0], 0)
            first_task = wf.order[0]
            output = profiles.output_bytes(wf.name, first_task)
            policy.plan(job, view, profiles, 0.0)  # build the cost table once
            warm_ns: list[int] = []
            cold_ns: list[int] = []
            for _ in range(repeats):
                t0 = time.perf_counter_ns()
                policy.plan(job, view, profiles, 0.0)
                warm_ns.append(time.perf_counter_ns() - t0)
            for _ in range(max(10, repeats // 4)):
                # an unchanged measurement still bumps the version: the table is rebuilt
                profiles.observe_output(wf.name, first_task, output)
                t0 = time.perf_counter_ns()
                policy.plan(job, view, profiles, 0.0)
                cold_ns.append(time.perf_counter_ns() - t0)
            warm_row[wf.name] = _median_us(warm_ns)
            cold_row[wf.name] = _median_us(cold_ns)
        warm[str(n_workers)] = warm_row
        cold[str(n_workers)] = cold_row

    worst = max(warm[str(WORKER_COUNTS[-1])].values())
    result: dict[str, Any] = {
        "plan_us": warm,
        "plan_cold_us": cold,
        "target_us": TARGET_US,
        "target_met": worst < TARGET_US,
        "repeats": repeats,
    }
    _print_table(result)
    write_json(json_path, result, announce=False)
    return result


def _print_table(result: dict[str, Any]) -> None:
    warm: dict[str, dict[str, float]] = result["plan_us"]
    cold: dict[str, dict[str, float]] = result["plan_cold_us"]
    flows = list(next(iter(warm.values())))
    header = f"{'workers':>8} " + " ".join(f"{f:>22}" for f in flows)
    print("compass plan time per job, median us (cached tables / after a measurement)")
    print(header)
    for n, row in warm.items():
        cells = " ".join(f"{row[f]:>11.1f} / {cold[n][f]:>8.1f}" for f in flows)
        print(f"{n:>8} {cells}")
    verdict = "met" if result["target_met"] else "NOT met"
    print(f"target: < {result['target_us']:.0f} us at {WORKER_COUNTS[-1]} workers: {verdict}")


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else None, quick="--quick" in sys.argv)
