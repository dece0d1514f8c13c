"""``make demo``: a local cluster, the paper's workload, compass against hash and jsq."""

from __future__ import annotations

import importlib.util
from typing import Any

from . import e2e
from .report import print_table

__all__ = ["run"]

POLICIES = ("compass", "jsq", "hash")
TIME_SCALE = 0.1
JOBS_PER_SECOND = 2.0  # the paper's rate: four clients, one job every 2 s each


def run(seconds: float = 60.0, workers: int = 5) -> dict[str, Any]:
    per_policy = max(5.0, seconds / len(POLICIES) - 4.0)  # about 4 s go to starting workers
    jobs = max(20, int(per_policy / TIME_SCALE * JOBS_PER_SECOND))
    print(
        f"compass demo: {workers} worker processes on this machine, the paper's four workflows "
        f"(8 models, 20.8 GB) with a 14 GB model cache per worker,\n"
        f"{jobs} jobs per policy arriving as a Poisson process at the paper's rate, emulated at "
        f"{1 / TIME_SCALE:.0f}x speed. Policies: {', '.join(POLICIES)}.\n"
    )
    config = e2e.E2EConfig(
        workers=workers, policies=POLICIES, jobs=jobs, time_scale=TIME_SCALE, arrival="poisson"
    )
    out = e2e.run(
        config,
        json_path="results/demo.json",
        plot_path="results/demo.png" if _can_plot() else None,
        per_policy_tables=False,
    )
    results = out["results"]
    ours = results["compass"]
    rows = []
    for policy in POLICIES[1:]:
        theirs = results[policy]
        rows.append(
            [
                f"compass vs {policy}",
                _ratio(theirs["median_slowdown"], ours["median_slowdown"]),
                _ratio(theirs["p99_ms"], ours["p99_ms"]),
                _ratio(theirs["model_gb_loaded"], ours["model_gb_loaded"]),
            ]
        )
    print_table(
        "how much better compass does (baseline / compass)",
        ["", "median slowdown", "p99 latency", "model GB loaded"],
        rows,
    )
    if _can_plot():
        print("table: results/demo.json   plot: results/demo.png")
    else:
        print("table: results/demo.json   (no plot: pip install 'compass[bench]' for matplotlib)")
    return out


def _can_plot() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _ratio(theirs: float | None, ours: float | None) -> str:
    if not theirs or not ours:
        return "-"
    return f"{theirs / ours:.1f}x"
