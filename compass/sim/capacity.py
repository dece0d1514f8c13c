"""Capacity at an SLO: the highest multiple of a workload's arrival rate a policy sustains.

An SLO says what fraction of jobs must finish within what slowdown (latency over the
workflow's best time): ``p95x3`` is "95% of jobs within 3x". A job that did not finish has an
infinite slowdown. A policy *meets* an SLO at a load when its attainment (the fraction of jobs
within the slowdown) is at least the SLO's quantile.

Attainment falls with load in expectation, not in every seeded run, so the search is per seed:
walk a grid of load multiples upward to the first load that misses, then bisect between the
last grid load that met and that miss. A policy that misses even the lowest grid load has no
capacity (None); one that meets every grid load is capped at the grid's top (``max_load``).
Runs are cached per (policy, seed, load), so every SLO reads the same runs.

The search takes the run as a function ``run(policy, seed, load) -> slowdowns``, so the same
code drives the simulator (:func:`simulator_run`) and a real cluster
(``compass bench e2e --capacity``). Beside the capacities stands the physical bound: the load
at which the workers' lanes would be busy 100% of the time with the declared execution times.
Tables and plots are the CLI's (``compass._bench.sim_report``).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from compass.config import SIM_WORKER
from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim.arrivals import PROCESSES, workload_arrivals
from compass.sim.engine import simulate
from compass.sim.settings import SimSettings, base_policy
from compass.workflow.dag import Task, batch_limit, batch_scale
from compass.workflow.spec import Workload
from compass.workflow.unfold import run_chances

__all__ = [
    "BUILTIN_SLOS",
    "DEFAULT_LADDER",
    "REFERENCE",
    "CachedRuns",
    "CapacitySearch",
    "RunFn",
    "SimRuns",
    "Slo",
    "attainment",
    "busy_at_capacity",
    "capacity_at",
    "capacity_for_workload",
    "load_grid",
    "meets",
    "parse_seeds",
    "parse_slo",
    "physical_bound",
    "ratio",
    "search_capacity",
    "simulator_run",
    "slo_config",
]

#: per-job slowdowns (None: the job did not finish) of one run of ``policy`` at ``load``
RunFn = Callable[[str, int, float], Sequence[float | None]]

#: the share of the run its workers' lanes were busy (mean over the workers), per
#: (policy, seed, load) run: what :func:`simulator_run` records beside the slowdowns
BusyShares = dict[tuple[str, int, float], float]

#: the policy every other is compared with in ``ratios``
REFERENCE = "compass"

#: load multiples tried before bisecting (those below ``max_load``, then ``max_load`` itself)
DEFAULT_LADDER = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)

#: a bisected load is rounded to this many decimals, so JSON keys stay readable
_LOAD_DECIMALS = 4


@dataclass(frozen=True, slots=True)
class Slo:
    """At least ``quantile`` of the jobs finish within ``max_slowdown`` times their best time."""

    name: str
    quantile: float
    max_slowdown: float

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ConfigError(f"SLO {self.name!r}: quantile must be in (0, 1], got {self.quantile}")
        if not 0 < self.max_slowdown < math.inf:
            raise ConfigError(
                f"SLO {self.name!r}: max slowdown must be a finite number > 0, "
                f"got {self.max_slowdown}"
            )


BUILTIN_SLOS = (
    Slo("median2", 0.5, 2.0),
    Slo("p95x3", 0.95, 3.0),
    Slo("p99x5", 0.99, 5.0),
)

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_PERCENTILE = re.compile(rf"p{_NUMBER}x{_NUMBER}")
_MEDIAN = re.compile(rf"medianx?{_NUMBER}")


def parse_slo(text: str) -> Slo:
    """``"p90x4"`` (90% of jobs within 4x) or ``"median1.5"`` (median slowdown <= 1.5)."""
    name = text.strip().lower()
    percentile = _PERCENTILE.fullmatch(name)
    median = _MEDIAN.fullmatch(name)
    if percentile is not None:
        pct, bound = float(percentile.group(1)), float(percentile.group(2))
        if not 0 < pct <= 100:
            raise ConfigError(f"SLO {text!r}: the percentile must be in (0, 100], got {pct:g}")
        quantile = pct / 100.0
    elif median is not None:
        quantile, bound = 0.5, float(median.group(1))
    else:
        raise ConfigError(
            f"SLO {text!r}: expected pNNxS (NN% of jobs within S times their best time, "
            "e.g. p95x3) or medianS (e.g. median2)"
        )
    if bound <= 0:
        raise ConfigError(f"SLO {text!r}: the slowdown must be > 0, got {bound:g}")
    return Slo(name, quantile, bound)


def attainment(slowdowns: Sequence[float | None], slo: Slo) -> float:
    """The fraction of jobs within ``slo.max_slowdown``; an unfinished job (None) misses."""
    if not slowdowns:
        raise ConfigError("attainment of a run without jobs is undefined")
    within = sum(1 for s in slowdowns if s is not None and s <= slo.max_slowdown)
    return within / len(slowdowns)


def meets(slowdowns: Sequence[float | None], slo: Slo) -> bool:
    """Whether at least ``slo.quantile`` of the jobs are within the SLO's slowdown."""
    if not slowdowns:
        raise ConfigError("a run without jobs cannot meet an SLO")
    within = sum(1 for s in slowdowns if s is not None and s <= slo.max_slowdown)
    # counted, not divided: 95 of 100 jobs meets a 0.95 quantile whatever the rounding
    return within >= slo.quantile * len(slowdowns) - 1e-9


def load_grid(max_load: float, ladder: Sequence[float] = DEFAULT_LADDER) -> tuple[float, ...]:
    """The ladder's loads below ``max_load``, then ``max_load``."""
    if not 0 < max_load < math.inf:
        raise ConfigError(f"max load must be a finite number > 0, got {max_load!r}")
    return (*(float(x) for x in ladder if x < max_load), float(max_load))


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"0-4"`` -> (0, 1, 2, 3, 4); ``"0,2,7"`` -> (0, 2, 7); ``"3"`` -> (3,)."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ConfigError(
                f"seeds {text!r}: expected a range like 0-4 or a list like 0,1,2"
            ) from None
        if first < 0 or last < first:
            raise ConfigError(f"seeds {text!r}: a range must be LO-HI with 0 <= LO <= HI")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds {text!r}: a seed is given twice")
    return tuple(seeds)


class CachedRuns:
    """``run`` with each (policy, seed, load) computed once; ``calls`` counts real runs."""

    def __init__(
        self, run: RunFn, progress: Callable[[str, int, float, float], None] | None = None
    ) -> None:
        self._run = run
        self._progress = progress
        self.results: dict[tuple[str, int, float], tuple[float | None, ...]] = {}
        self.calls = 0

    def __call__(self, policy: str, seed: int, load: float) -> tuple[float | None, ...]:
        key = (policy, seed, load)
        if key not in self.results:
            started = time.perf_counter()
            slowdowns = tuple(self._run(policy, seed, load))
            if not slowdowns:
                raise ConfigError(f"{policy} at load {load:g} (seed {seed}) ran no jobs")
            self.calls += 1
            self.results[key] = slowdowns
            if self._progress is not None:
                self._progress(policy, seed, load, time.perf_counter() - started)
        return self.results[key]


def capacity_at(
    evaluate: Callable[[float], Sequence[float | None]],
    slo: Slo,
    grid: Sequence[float],
    *,
    rel_tol: float = 0.02,
    max_steps: int = 8,
) -> float | None:
    """The highest load known to meet ``slo``: the last grid load met before the first miss,
    raised by bisection towards that miss until the gap is within ``rel_tol`` of it or
    ``max_steps`` runs were spent. None when the lowest grid load misses."""
    good: float | None = None
    bad: float | None = None
    for load in grid:
        if meets(evaluate(load), slo):
            good = load
        else:
            bad = load
            break
    if good is None or bad is None:
        return good
    for _ in range(max_steps):
        if bad - good <= rel_tol * good:
            break
        mid = round((good + bad) / 2.0, _LOAD_DECIMALS)
        if not good < mid < bad:
            break
        if meets(evaluate(mid), slo):
            good = mid
        else:
            bad = mid
    return good


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs``; None when either side has no capacity."""
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs


def search_capacity(
    run: RunFn,
    *,
    policies: Sequence[str],
    seeds: Sequence[int],
    slos: Sequence[Slo],
    grid: Sequence[float],
    rel_tol: float = 0.02,
    max_steps: int = 8,
    progress: Callable[[str, int, float, float], None] | None = None,
) -> dict[str, Any]:
    """Per seed, policy and SLO, the capacity (:func:`capacity_at`) over runs of ``run``.

    Returns ``capacity`` ({SLO: {policy: {mean, min, max, seeds}}}; a seed without capacity
    counts as 0 in mean/min/max, and the entry is None when no seed has one), ``ratios``
    ({SLO: {policy: [compass / policy per seed]}}, for every policy but ``compass`` when it is
    among them), ``attainment`` ({policy: {load: {SLO: mean fraction over the seeds that ran
    that load}}}), ``attainment_by_seed`` ({policy: {seed: {load: {SLO: fraction}}}}) and
    ``runs`` (the number of runs made).
    """
    _check_search(policies, seeds, slos, grid, rel_tol, max_steps)
    cached = CachedRuns(run, progress)
    per_seed: dict[str, dict[str, list[float | None]]] = {s.name: {} for s in slos}
    for policy in policies:
        for slo in slos:
            per_seed[slo.name][policy] = [
                capacity_at(
                    functools.partial(cached, policy, seed),
                    slo,
                    grid,
                    rel_tol=rel_tol,
                    max_steps=max_steps,
                )
                for seed in seeds
            ]
    capacity = {
        name: {policy: _spread(values) for policy, values in by_policy.items()}
        for name, by_policy in per_seed.items()
    }
    ratios: dict[str, dict[str, list[float | None]]] = {}
    if REFERENCE in policies:
        for name, by_policy in per_seed.items():
            ours = by_policy[REFERENCE]
            ratios[name] = {
                policy: [ratio(a, b) for a, b in zip(ours, theirs, strict=True)]
                for policy, theirs in by_policy.items()
                if policy != REFERENCE
            }
    by_seed: dict[str, dict[str, dict[str, dict[str, float]]]] = {p: {} for p in policies}
    for (policy, seed, load), slowdowns in sorted(cached.results.items()):
        by_seed[policy].setdefault(str(seed), {})[_key(load)] = {
            slo.name: attainment(slowdowns, slo) for slo in slos
        }
    return {
        "capacity": capacity,
        "ratios": ratios,
        "attainment": _mean_attainment(cached, policies, slos),
        "attainment_by_seed": by_seed,
        "runs": cached.calls,
    }


def _check_search(
    policies: Sequence[str],
    seeds: Sequence[int],
    slos: Sequence[Slo],
    grid: Sequence[float],
    rel_tol: float,
    max_steps: int,
) -> None:
    if not policies or len(set(policies)) != len(policies):
        raise ConfigError(f"capacity needs distinct policies, got {list(policies)!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"capacity needs distinct seeds, got {list(seeds)!r}")
    names = [s.name for s in slos]
    if not slos or len(set(names)) != len(names):
        raise ConfigError(f"capacity needs SLOs with distinct names, got {names!r}")
    if not grid or any(x <= 0 for x in grid) or list(grid) != sorted(set(grid)):
        raise ConfigError(f"capacity needs increasing loads > 0, got {list(grid)!r}")
    if not rel_tol > 0:
        raise ConfigError(f"bisection tolerance must be > 0, got {rel_tol!r}")
    if max_steps < 0:
        raise ConfigError(f"bisection steps must be >= 0, got {max_steps!r}")


def _spread(values: Sequence[float | None]) -> dict[str, Any] | None:
    if all(v is None for v in values):
        return None
    # below the lowest grid load: 0 is the bound the search can vouch for
    floor = [0.0 if v is None else v for v in values]
    return {
        "mean": float(np.mean(floor)),
        "min": min(floor),
        "max": max(floor),
        "seeds": list(values),
    }


def _mean_attainment(
    cached: CachedRuns, policies: Sequence[str], slos: Sequence[Slo]
) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for policy in policies:
        loads = sorted({load for p, _, load in cached.results if p == policy})
        out[policy] = {}
        for load in loads:
            runs = [s for (p, _, x), s in cached.results.items() if p == policy and x == load]
            out[policy][_key(load)] = {
                slo.name: float(np.mean([attainment(s, slo) for s in runs])) for slo in slos
            }
    return out


def _key(load: float) -> str:
    return format(load, "g")


def physical_bound(
    workload: Workload,
    workers: int,
    *,
    lanes: int = 1,
    host_lanes: int = 0,
    batched: bool = False,
) -> float | None:
    """The load at which the workers' GPU lanes would be busy all the time: lane-seconds per
    second over the GPU seconds demanded per second at load 1 (each workflow's declared
    execution times, each task's as often as it runs in a workflow with choices; one client
    per workflow, ``weight`` jobs per mean interval). Model loads and
    transfers are left out, so no policy can sustain more. With ``host_lanes`` > 0 the
    model-less tasks run off the GPU lanes and do not count. ``batched``: every task that
    batches runs in full batches (its time times its curve at its largest batch, over that
    size), the bound where batching can reach it. None when nothing needs a lane."""
    interval_s = workload.arrivals.mean_interval_ms_per_client / 1000.0
    demand = 0.0
    for name, wf in workload.workflows.items():
        chance = run_chances(wf)
        gpu_s = sum(
            chance[t.name] * t.profile.exec_s * (_full_batch(t) if batched else 1.0)
            for t in wf.tasks.values()
            if host_lanes == 0 or t.model is not None
        )
        demand += workload.weights.get(name, 1.0) * gpu_s / interval_s
    if demand <= 0:
        return None
    return workers * lanes / demand


def _full_batch(task: Task) -> float:
    """A task's share of one run in a full batch (1: it never batches)."""
    size = batch_limit(task.profile.batch_scale, task.batch)
    return batch_scale(task.profile.batch_scale, size) / size


@dataclass(frozen=True, slots=True)
class SimRuns:
    """How each simulated run of a search is made: ``jobs`` arrivals of process ``arrival``
    (``cv``: gamma's spread) on ``workers`` simulated workers, peers' state every
    ``heartbeat_ms`` and at least ``staleness_ms`` old (default: ``heartbeat_ms``), model-less
    tasks on ``host_lanes`` host lanes; ``options`` go to
    :class:`~compass.sim.settings.SimSettings` as they are (``prefetch_evicts``,
    ``policy_options``...).

    ``warmup``: the first that many jobs of each run (by arrival) run but are not counted.
    A run starts on empty queues and cold caches, so its first jobs see a lighter load than
    the rest; and past the load the lanes can sustain, the queue grows from nothing, so a
    short run counts mostly jobs that met it small. Leaving the start out measures the
    steady state with fewer jobs (docs/RESULTS.md, "Capacity in steady state")."""

    workers: int
    jobs: int = 1000
    warmup: int = 0
    arrival: str = "poisson"
    cv: float = 1.0
    heartbeat_ms: float = SIM_WORKER.sched.heartbeat_ms
    staleness_ms: float | None = None
    host_lanes: int = SIM_WORKER.host_lanes
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.arrival not in PROCESSES:
            raise ConfigError(
                f"unknown arrival process {self.arrival!r}; known: {', '.join(PROCESSES)}"
            )
        if self.jobs < 1:
            raise ConfigError(f"capacity needs at least one job per run, got {self.jobs}")
        if not 0 <= self.warmup < self.jobs:
            raise ConfigError(
                f"warm-up must be 0 or more jobs and fewer than the run's {self.jobs}, "
                f"got {self.warmup}"
            )


@dataclass(frozen=True, slots=True)
class CapacitySearch:
    """What a capacity search covers: the arrival ``seeds`` (one search each), the ``slos``,
    the load grid up to ``max_load`` (:func:`load_grid`), and the bisection's tolerance and
    step limit (:func:`capacity_at`)."""

    seeds: tuple[int, ...]
    slos: tuple[Slo, ...] = BUILTIN_SLOS
    max_load: float = 8.0
    rel_tol: float = 0.02
    max_steps: int = 8


def simulator_run(workload: Workload, runs: SimRuns, busy: BusyShares | None = None) -> RunFn:
    """A :data:`RunFn` that simulates ``workload`` as ``runs`` says; the seed picks the
    arrivals (and seeds the ``random`` policy), so every run is deterministic. ``busy``, when
    given, gets each run's lanes' busy share (:meth:`SimResult.utilization
    <compass.sim.result.SimResult.utilization>`, mean over the workers): how near the
    workers were to saturation at that load."""
    extra = dict(runs.options)
    heartbeat_s = runs.heartbeat_ms / 1000.0
    staleness_s = None if runs.staleness_ms is None else runs.staleness_ms / 1000.0

    def run(policy: str, seed: int, load: float) -> list[float | None]:
        arrivals = workload_arrivals(
            workload, runs.jobs, process=runs.arrival, load=load, cv=runs.cv, seed=seed
        )
        result = simulate(
            workload,
            SimSettings(
                workers=runs.workers,
                policy=policy,
                heartbeat_s=heartbeat_s,
                staleness_s=staleness_s,
                seed=seed,
                host_lanes=runs.host_lanes,
                **extra,
            ),
            arrivals,
        )
        if busy is not None:
            busy[(policy, seed, load)] = float(np.mean(list(result.utilization().values())))
        return [job.slowdown for job in result.jobs[runs.warmup :]]  # in arrival order

    return run


def capacity_for_workload(
    workload: Workload,
    policies: Sequence[str],
    runs: SimRuns,
    search: CapacitySearch,
    progress: Callable[[str, int, float, float], None] | None = None,
) -> dict[str, Any]:
    """The simulated capacity of every policy on ``workload``: :func:`search_capacity`'s
    result plus ``config`` (with ``physical_bound``)."""
    unknown = [p for p in policies if base_policy(p) not in POLICY_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown policy {unknown[0]!r}; valid policies: {', '.join(POLICY_NAMES)}"
        )
    grid = load_grid(search.max_load)
    busy: BusyShares = {}
    found = search_capacity(
        simulator_run(workload, runs, busy),
        policies=policies,
        seeds=search.seeds,
        slos=search.slos,
        grid=grid,
        rel_tol=search.rel_tol,
        max_steps=search.max_steps,
        progress=progress,
    )
    config = {
        "mode": "sim",
        "workload_name": workload.name,
        "workers": runs.workers,
        "policies": list(policies),
        "seeds": list(search.seeds),
        "slos": slo_config(search.slos),
        "jobs": runs.jobs,
        "warmup": runs.warmup,
        "arrival": runs.arrival,
        "cv": runs.cv,
        "heartbeat_ms": runs.heartbeat_ms,
        "staleness_ms": runs.heartbeat_ms if runs.staleness_ms is None else runs.staleness_ms,
        "host_lanes": runs.host_lanes,
        "mean_interval_ms_per_client": workload.arrivals.mean_interval_ms_per_client,
        "clients": len(workload.workflows),
        "grid": list(grid),
        "max_load": search.max_load,
        "rel_tol": search.rel_tol,
        "max_steps": search.max_steps,
        "physical_bound": physical_bound(workload, runs.workers, host_lanes=runs.host_lanes),
        "options": dict(runs.options),
    }
    return {
        "config": config,
        **found,
        "busy": _busy_by_seed(busy),
        "busy_at_capacity": busy_at_capacity(found["capacity"], busy, search.seeds),
    }


def _busy_by_seed(busy: BusyShares) -> dict[str, dict[str, dict[str, float]]]:
    """{policy: {seed: {load: lanes' busy share}}}, as ``attainment_by_seed`` is keyed."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (policy, seed, load), share in sorted(busy.items()):
        out.setdefault(policy, {}).setdefault(str(seed), {})[_key(load)] = share
    return out


def busy_at_capacity(
    capacity: Mapping[str, Mapping[str, Mapping[str, Any] | None]],
    busy: BusyShares,
    seeds: Sequence[int],
) -> dict[str, dict[str, dict[str, Any] | None]]:
    """For each SLO and policy, the lanes' busy share of the run at each seed's capacity
    (``seeds``, in the search's order, None where the seed has none) and their ``mean``:
    whether a capacity is where the lanes saturate or below it. The search ran every load
    it returns, so each share is a run's."""
    out: dict[str, dict[str, dict[str, Any] | None]] = {}
    for name, by_policy in capacity.items():
        out[name] = {}
        for policy, entry in by_policy.items():
            if entry is None:
                out[name][policy] = None
                continue
            shares = [
                None if load is None else busy[(policy, seed, load)]
                for seed, load in zip(seeds, entry["seeds"], strict=True)
            ]
            known = [s for s in shares if s is not None]
            out[name][policy] = {"mean": float(np.mean(known)), "seeds": shares}
    return out


def slo_config(slos: Sequence[Slo]) -> dict[str, dict[str, float]]:
    """What the JSON records of each SLO."""
    return {s.name: {"quantile": s.quantile, "max_slowdown": s.max_slowdown} for s in slos}
