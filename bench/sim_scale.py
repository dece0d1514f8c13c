"""Simulator scale: wall-clock seconds to simulate 100,000 jobs of the paper workload on 240
workers under ``compass``.

Load 40 (each client submits 40x the paper's rate: 80 jobs/s in all) keeps a third of 240
workers' lanes busy, about what the paper's own five-worker run asks of each worker. Target:
under 60 s on one core.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from compass.sim import simulate
from compass.sim.arrivals import workload_arrivals
from compass.sim.settings import SimSettings
from compass.workflow import load_workload

from .report import machine, print_table, write_json

__all__ = ["LOAD", "TARGET_S", "run"]

WORKLOAD_PATH = Path(__file__).resolve().parent / "workloads" / "paper.json"
LOAD = 40.0
TARGET_S = 60.0


def run(json_path: str | None = None, jobs: int = 100_000, workers: int = 240) -> dict[str, Any]:
    """Time one simulation; print a table, write JSON (``seconds``, ``jobs_per_s``, ``events``)."""
    workload = load_workload(WORKLOAD_PATH)
    started = time.perf_counter()
    arrivals = workload_arrivals(workload, jobs, process="poisson", load=LOAD)
    arrivals_s = time.perf_counter() - started
    result = simulate(workload, SimSettings(workers=workers, policy="compass"), arrivals)
    seconds = time.perf_counter() - started
    summary = result.summary()
    utilization = np.array(list(summary["utilization"].values()))
    out: dict[str, Any] = {
        "jobs": jobs,
        "workers": workers,
        "policy": "compass",
        "load": LOAD,
        "seconds": seconds,
        "arrivals_seconds": arrivals_s,
        "simulate_seconds": result.wall_s,
        "jobs_per_s": jobs / seconds,
        "events": result.events,
        "events_per_s": result.events / result.wall_s if result.wall_s > 0 else 0.0,
        "virtual_seconds": result.horizon_s,
        "completed": summary["completed"],
        "median_slowdown": summary["median_slowdown"],
        "cache_hit_rate": summary["cache_hit_rate"],
        "mean_utilization": float(utilization.mean()),
        "workers_over_10pct_busy": int((utilization > 0.10).sum()),
        "target_s": TARGET_S,
        "machine": machine(),
    }
    print_table(
        f"simulator: {jobs:,} paper jobs on {workers} workers (compass, poisson, load {LOAD:g})",
        ["what", "value"],
        [
            ["wall seconds (total)", seconds],
            ["wall seconds (simulate)", result.wall_s],
            ["jobs per wall second", out["jobs_per_s"]],
            ["events", result.events],
            ["events per wall second", out["events_per_s"]],
            ["virtual seconds", result.horizon_s],
            ["median slowdown", summary["median_slowdown"]],
            ["cache hit rate", summary["cache_hit_rate"]],
            ["mean utilization", out["mean_utilization"]],
            ["workers > 10% busy", out["workers_over_10pct_busy"]],
        ],
    )
    write_json(json_path, out)
    return out


if __name__ == "__main__":
    run()
