"""``compass bench batching``: what batched execution buys every policy, and what compass's
batch-aware planning adds on top.

Batched execution is a worker feature, so every policy gets it. For each batch curve
(:data:`compass.workflow.batching.BATCH_GAINS`: ``none``, ``mild``, ``strong``) and each
workload (the paper's or ``--workload``, then generated workloads ``0..N-1``, each on its own
worker count), the simulated capacity of every policy at every SLO is searched with batching
off and on (:func:`compass.sim.capacity.capacity_for_workload`), and every policy's p99 latency
is simulated at :data:`P99_LOAD` times the workload's arrival rate, with batching on and off
(mean over the seeds). Batching off does not depend on the curve: it is searched once per
workload and stands under every curve.

The JSON (``--json``)::

    {"config": {"curves", "policies", "seeds", "slos", "jobs", "max_load", "arrival",
                "workloads": N, "p99_load": 1.5, "machine"},
     "curves": {CURVE: [            # one entry per workload: the paper first, then generated
        {"workload": NAME, "generator_seed": SEED or null (the paper), "workers": N,
         "off": CAPACITY, "on": CAPACITY,
         "p99_at_1.5": {POLICY: ms}, "p99_at_1.5_off": {POLICY: ms},
         "compass_on_off": {SLO: compass on / compass off, or null},
         "compass_vs_best": {SLO: {"ratio": compass on / best baseline on, "baseline": POLICY}},
         "p99_vs_best": {"ratio": compass p99 / lowest baseline p99, "baseline": POLICY}}]}}

where ``CAPACITY`` is the capacity layout of ``compass sim --capacity``: ``{"config": {...,
"batching": true|false, "batch_gain": CURVE or null}, "capacity": {SLO: {POLICY: {"mean",
"min", "max", "seeds"}}}, "ratios", "attainment", "attainment_by_seed", "runs"}``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim import capacity as cap
from compass.sim.arrivals import workload_arrivals
from compass.sim.engine import simulate
from compass.sim.settings import SimSettings
from compass.workflow.batching import BATCH_GAINS, apply_batching
from compass.workflow.spec import Workload, load_workload

from .e2e import DEFAULT_WORKLOAD
from .generalize import versus_best
from .report import machine, print_table, write_json

__all__ = ["DEFAULT_POLICIES", "P99_LOAD", "p99_ms", "run"]

#: compass and the baselines it is compared with
DEFAULT_POLICIES = ("compass", "jit", "jsq", "heft", "hash")

#: the multiple of each workload's arrival rate at which p99 latencies are compared
P99_LOAD = 1.5

P99_KEY = f"p99_at_{P99_LOAD:g}"


def p99_ms(
    workload: Workload, policy: str, *, seeds: Sequence[int], jobs: int, load: float, arrival: str
) -> float | None:
    """The mean over ``seeds`` of one simulated run's p99 latency (ms) at ``load``; None when a
    run finished no job."""
    values = []
    for seed in seeds:
        arrivals = workload_arrivals(workload, jobs, process=arrival, load=load, seed=seed)
        result = simulate(
            workload,
            SimSettings(workers=workload.cluster.workers, policy=policy, seed=seed),
            arrivals,
        )
        values.append(result.summary()["p99_ms"])
    if any(v is None for v in values):
        return None
    return float(np.mean(values))


def run(
    search: cap.CapacitySearch = cap.CapacitySearch(seeds=(0, 1, 2)),
    *,
    workloads: int = 3,
    curves: Sequence[str] = tuple(BATCH_GAINS),
    policies: Sequence[str] = DEFAULT_POLICIES,
    jobs: int = 1000,
    arrival: str = "poisson",
    spec: str = DEFAULT_WORKLOAD,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Search capacities (as ``search`` says) and p99s (module docstring) on the workload at
    ``spec`` (the paper's by default) and on ``workloads`` generated ones; print the tables,
    write the JSON; return it."""
    from compass.workflow.generate import generate_workload

    seeds, slos, max_load = search.seeds, search.slos, search.max_load

    _check(workloads, curves, policies)
    sources: list[tuple[int | None, Workload]] = [(None, load_workload(spec))]
    sources += [(seed, generate_workload(seed)) for seed in range(workloads)]
    settings = {
        "policies": list(policies),
        "seeds": list(seeds),
        "slos": slos,
        "jobs": jobs,
        "max_load": max_load,
        "arrival": arrival,
    }
    out: dict[str, Any] = {
        "config": {
            **settings,
            "slos": cap.slo_config(slos),
            "curves": list(curves),
            "workloads": workloads,
            "p99_load": P99_LOAD,
            "machine": machine(),
        },
        "curves": {curve: [] for curve in curves},
    }
    for generator_seed, workload in sources:
        alone = apply_batching(workload, batching=False)
        off, p99_off = _searched(alone, None, settings, search), _p99s(alone, settings)
        for curve in curves:
            batched = apply_batching(workload, batching=True, gain=curve)
            entry: dict[str, Any] = {
                "workload": workload.name,
                "generator_seed": generator_seed,
                "workers": workload.cluster.workers,
                "off": off,
                "on": _searched(batched, curve, settings, search),
                P99_KEY: _p99s(batched, settings),
                f"{P99_KEY}_off": p99_off,
            }
            entry.update(_compare(entry, [s.name for s in slos]))
            out["curves"][curve].append(entry)
            _print_entry(entry, curve, max_load)
    _print_summary(out)
    write_json(json_path, out)
    return out


def _check(workloads: int, curves: Sequence[str], policies: Sequence[str]) -> None:
    if workloads < 0:
        raise ConfigError(f"--workloads must be >= 0, got {workloads}")
    unknown = [c for c in curves if c not in BATCH_GAINS]
    if not curves or unknown or len(set(curves)) != len(curves):
        raise ConfigError(
            f"curves {list(curves)!r}: expected distinct names among {', '.join(BATCH_GAINS)}"
        )
    bad = [p for p in policies if p not in POLICY_NAMES]
    if bad:
        raise ConfigError(f"unknown policy {bad[0]!r}; valid policies: {', '.join(POLICY_NAMES)}")
    if cap.REFERENCE not in policies or len(set(policies)) < 2:
        raise ConfigError(f"batching compares {cap.REFERENCE!r} with at least one other policy")


def _searched(
    workload: Workload,
    curve: str | None,
    settings: Mapping[str, Any],
    search: cap.CapacitySearch,
) -> dict[str, Any]:
    """The capacity layout of ``workload`` (already batched as ``curve`` says, or not)."""
    started = time.perf_counter()
    found = cap.capacity_for_workload(
        workload,
        settings["policies"],
        cap.SimRuns(
            workers=workload.cluster.workers, jobs=settings["jobs"], arrival=settings["arrival"]
        ),
        search,
    )
    found["config"].update(batching=curve is not None, batch_gain=curve)
    state = "off" if curve is None else f"on, {curve} curve"
    print(
        f"{workload.name} batching {state}: {found['runs']} runs in "
        f"{time.perf_counter() - started:.0f} s"
    )
    return found


def _p99s(workload: Workload, settings: Mapping[str, Any]) -> dict[str, float | None]:
    return {
        policy: p99_ms(
            workload,
            policy,
            seeds=settings["seeds"],
            jobs=settings["jobs"],
            load=P99_LOAD,
            arrival=settings["arrival"],
        )
        for policy in settings["policies"]
    }


def _means(layout: Mapping[str, Any], slo: str) -> dict[str, float | None]:
    return {p: (None if e is None else e["mean"]) for p, e in layout["capacity"][slo].items()}


def _compare(entry: Mapping[str, Any], slos: Sequence[str]) -> dict[str, Any]:
    """Compass on against compass off, and against the best baseline (both batching on)."""
    on_off: dict[str, float | None] = {}
    vs_best: dict[str, dict[str, Any]] = {}
    for slo in slos:
        on, off = _means(entry["on"], slo), _means(entry["off"], slo)
        on_off[slo] = cap.ratio(on[cap.REFERENCE], off[cap.REFERENCE])
        ratio, best = versus_best(on)
        vs_best[slo] = {"ratio": ratio, "baseline": best}
    p99 = entry[P99_KEY]
    baselines = {p: v for p, v in p99.items() if p != cap.REFERENCE and v is not None}
    best = min(baselines, key=baselines.__getitem__) if baselines else None
    ours = p99[cap.REFERENCE]
    return {
        "compass_on_off": on_off,
        "compass_vs_best": vs_best,
        "p99_vs_best": {
            "ratio": None if best is None or ours is None else ours / baselines[best],
            "baseline": best,
        },
    }


def _capacity(entry: Mapping[str, Any] | None, max_load: float) -> str:
    if entry is None:
        return "none"
    # "+": met at the top of the grid, so the true capacity may be higher
    return f"{entry['mean']:.2f}" + ("+" if entry["max"] >= max_load else "")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _versus(found: Mapping[str, Any]) -> str:
    if found["ratio"] is None:
        return "-"
    return f"{found['ratio']:.2f} {found['baseline']}"


def _print_entry(entry: Mapping[str, Any], curve: str, max_load: float) -> None:
    """One workload under one curve: each policy's capacity per SLO and p99, off -> on."""
    slos = list(entry["on"]["capacity"])
    rows = []
    for policy in entry["on"]["config"]["policies"]:
        row = [policy]
        for slo in slos:
            off = _capacity(entry["off"]["capacity"][slo][policy], max_load)
            row.append(f"{off} -> {_capacity(entry['on']['capacity'][slo][policy], max_load)}")
        row.append(f"{_ms(entry[f'{P99_KEY}_off'][policy])} -> {_ms(entry[P99_KEY][policy])}")
        rows.append(row)
    seeds = ",".join(map(str, entry["on"]["config"]["seeds"]))
    print_table(
        f"{entry['workload']} ({entry['workers']} workers), {curve} curve, batching off -> on: "
        f"capacity (x the rate, mean over seeds {seeds}, + capped) and p99 ms at {P99_LOAD:g}x",
        ["policy", *slos, "p99 ms"],
        rows,
    )


def _print_summary(out: Mapping[str, Any]) -> None:
    """Per workload and curve: compass on / off, and compass against the best baseline."""
    slos = list(out["config"]["slos"])
    gains, versus = [], []
    for curve, entries in out["curves"].items():
        for e in entries:
            gains.append([e["workload"], curve, *(_ratio(e["compass_on_off"][s]) for s in slos)])
            best = [_versus(e["compass_vs_best"][s]) for s in slos]
            versus.append([e["workload"], curve, *best, _versus(e["p99_vs_best"])])
    print_table(f"{cap.REFERENCE} capacity, batching on / off", ["workload", "curve", *slos], gains)
    print_table(
        f"{cap.REFERENCE} / best baseline, batching on: capacity (higher is better) and p99 "
        f"at {P99_LOAD:g}x (lower is better)",
        ["workload", "curve", *slos, "p99"],
        versus,
    )
