"""``compass bench generalize``: does Compass's capacity lead hold beyond the paper's workload?

For seeds 0..N-1 a workload is generated (:func:`compass.workflow.generate.generate_workload`),
every policy's capacity at each SLO is searched in the simulator
(:func:`compass.sim.capacity.capacity_for_workload`, on the workload's own worker count), and
the ratio of Compass's capacity to the best baseline's is reported per workload, with the
median and the minimum over workloads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim import capacity as cap

from .report import machine, print_table, write_json

__all__ = ["default_policies", "run", "summarize", "versus_best"]


def default_policies() -> list[str]:
    """Compass and the paper's baselines (``jit`` where this build has it)."""
    names = ["compass", "jsq", "heft", "hash", "jit"]
    return [n for n in names if n in POLICY_NAMES]


def versus_best(
    means: Mapping[str, float | None], reference: str = cap.REFERENCE
) -> tuple[float | None, str | None]:
    """(reference capacity / best baseline capacity, the best baseline).

    A side with no capacity (it missed the SLO even at the lowest load) counts as 0, so a
    reference that never meets the SLO where a baseline does has ratio 0; the ratio is None
    when no baseline meets it (nothing to divide by)."""
    baselines = {p: v for p, v in means.items() if p != reference}
    if reference not in means or not baselines:
        raise ConfigError(f"a ratio to the best baseline needs {reference!r} and another policy")
    known = {p: v for p, v in baselines.items() if v is not None and v > 0}
    if not known:
        return None, None
    best = max(known, key=known.__getitem__)
    ours = means[reference]
    return (0.0 if ours is None else ours / known[best]), best


def summarize(workloads: Sequence[Mapping[str, Any]], slos: Sequence[str]) -> dict[str, Any]:
    """Median and minimum over workloads of each SLO's ratio (None ratios left out; ``undefined``
    counts them)."""
    median: dict[str, float | None] = {}
    least: dict[str, float | None] = {}
    undefined: dict[str, int] = {}
    for slo in slos:
        known = [w["ratio"][slo] for w in workloads if w["ratio"].get(slo) is not None]
        median[slo] = float(np.median(known)) if known else None
        least[slo] = min(known) if known else None
        undefined[slo] = len(workloads) - len(known)
    return {"median": median, "min": least, "undefined": undefined}


def run(
    *,
    workloads: int,
    policies: Sequence[str] | None = None,
    seeds: Sequence[int] = (0,),
    slos: Sequence[cap.Slo] = cap.BUILTIN_SLOS,
    jobs: int = 500,
    max_load: float = 8.0,
    arrival: str = "poisson",
    json_path: str | None = None,
) -> dict[str, Any]:
    """Search every policy's capacity on ``workloads`` generated workloads; print, write JSON:
    ``{"workloads": [{"seed", "ratio": {SLO: x}, ...}], "median": {SLO: x}, "min": {SLO: x}}``.
    """
    from compass.workflow.generate import generate_workload

    if workloads < 1:
        raise ConfigError(f"--workloads must be >= 1, got {workloads}")
    chosen = list(policies) if policies is not None else default_policies()
    if cap.REFERENCE not in chosen or len(chosen) < 2:
        raise ConfigError(f"generalize compares {cap.REFERENCE!r} with at least one other policy")
    names = [s.name for s in slos]
    rows: list[dict[str, Any]] = []
    for seed in range(workloads):
        workload = generate_workload(seed)
        started = time.perf_counter()
        found = cap.capacity_for_workload(
            workload,
            chosen,
            cap.SimRuns(workers=workload.cluster.workers, jobs=jobs, arrival=arrival),
            cap.CapacitySearch(seeds=tuple(seeds), slos=tuple(slos), max_load=max_load),
        )
        row: dict[str, Any] = {
            "seed": seed,
            "name": workload.name,
            "workers": workload.cluster.workers,
            "physical_bound": found["config"]["physical_bound"],
            "capacity": {
                slo: {p: (None if e is None else e["mean"]) for p, e in by_policy.items()}
                for slo, by_policy in found["capacity"].items()
            },
            "ratio": {},
            "best_baseline": {},
            "runs": found["runs"],
            "wall_s": time.perf_counter() - started,
        }
        for slo in names:
            row["ratio"][slo], row["best_baseline"][slo] = versus_best(row["capacity"][slo])
        rows.append(row)
        print(
            f"workload {seed} ({workload.name}, {workload.cluster.workers} workers): "
            + ", ".join(f"{slo} {_fmt(row['ratio'][slo])}" for slo in names)
        )
    summary = summarize(rows, names)
    out: dict[str, Any] = {
        "config": {
            "workloads": workloads,
            "policies": chosen,
            "seeds": list(seeds),
            "slos": cap.slo_config(slos),
            "jobs": jobs,
            "max_load": max_load,
            "arrival": arrival,
            "machine": machine(),
        },
        "workloads": rows,
        **summary,
    }
    print_table(
        f"{cap.REFERENCE} capacity / best baseline's, {workloads} generated workloads",
        ["SLO", "median", "min", "undefined"],
        [[s, summary["median"][s], summary["min"][s], summary["undefined"][s]] for s in names],
    )
    write_json(json_path, out)
    return out


def _fmt(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"
