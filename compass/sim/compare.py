"""``compass sim``: several policies on the same arrivals of one workload, compared.

:class:`SimConfig` says what to run; :func:`compare_policies` simulates each policy and returns
the results (the JSON ``compass sim --json`` writes, and each job's latency for a plot). With a
servers sweep it also finds, per policy, the fewest workers whose median slowdown meets a
target (the paper's "same workload on half the servers" comparison, :func:`fewest_workers`).
Tables and plots are the CLI's (``compass._bench.sim_report``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compass.config import SIM_WORKER
from compass.elastic.replicate import ReplicaConfig
from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim.arrivals import PROCESSES, workload_arrivals
from compass.sim.capacity import SimRuns
from compass.sim.engine import simulate
from compass.sim.modes import DEFAULT_CANDIDATES, DEFAULT_HOLDERS, ingress_spread, view_rule
from compass.sim.result import SimResult
from compass.sim.settings import SimSettings, base_policy
from compass.workflow.batching import apply_batching
from compass.workflow.spec import Workload, load_workload

__all__ = [
    "Comparison",
    "SimConfig",
    "batch_sizes",
    "compare_policies",
    "fewest_workers",
    "sim_workload",
]

#: worker counts evaluated before bisecting, at most
SWEEP_GRID_POINTS = 8

#: called after each policy's run: its name, its summary and the run's counters
RunCallback = Callable[[str, Mapping[str, Any], Mapping[str, Any]], None]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One ``compass sim`` comparison: the workload spec at ``workload`` (with ``batching`` and
    ``batch_gain`` applied, :func:`~compass.workflow.batching.apply_batching`) on ``workers``
    simulated workers, ``jobs`` arrivals of process ``arrival`` (``cv``: gamma's spread) at
    ``load`` times the spec's rate, drawn from ``seed``, under each of ``policies``.

    ``heartbeat_ms``: how often peers' state reaches the views; ``staleness_ms``: the age of
    the peer state planners see (default: ``heartbeat_ms``); ``host_lanes``: model-less tasks
    on that many host lanes per worker; ``prefetch_evicts``: prefetch may evict models needed
    later (off: free slabs only, the paper's rule). ``servers_sweep=(lo, hi)``: also find the
    fewest workers in ``lo..hi`` whose median slowdown is at most ``target_slowdown``.
    ``view``: ``"mesh"`` (every planner sees every worker) or ``"bounded"`` (each job planned
    over its candidates: ``candidates`` sampled workers, at most ``holders`` holders per model;
    :func:`~compass.sim.engine.simulate`).
    """

    workload: str
    workers: int
    policies: tuple[str, ...]
    arrival: str = "poisson"
    cv: float = 1.0
    load: float = 1.0
    jobs: int = 1000
    seed: int = 0
    heartbeat_ms: float = SIM_WORKER.sched.heartbeat_ms
    staleness_ms: float | None = None
    host_lanes: int = SIM_WORKER.host_lanes
    prefetch_evicts: bool = SIM_WORKER.cache.prefetch_evicts
    batching: bool = True
    batch_gain: str | None = None
    servers_sweep: tuple[int, int] | None = None
    target_slowdown: float = 2.0
    #: which worker a job enters at (:class:`~compass.sim.settings.SimSettings`'s ``ingress``)
    ingress: str = "auto"
    view: str = SIM_WORKER.sched.view
    candidates: int = DEFAULT_CANDIDATES
    holders: int | None = DEFAULT_HOLDERS
    #: scheduling at step boundaries, for every policy not named "NAME (no preemption)"
    preempt: bool = False
    #: a capacity search's runs leave their first that many jobs uncounted
    #: (:class:`~compass.sim.capacity.SimRuns`)
    warmup: int = 0
    #: hot models replicated ahead of need (:mod:`compass.sim.replicas`), as on a real worker
    replicate: bool = SIM_WORKER.replicate is not None

    def __post_init__(self) -> None:
        if not self.policies:
            raise ConfigError("compass sim needs at least one policy")
        unknown = [p for p in self.policies if base_policy(p) not in POLICY_NAMES]
        if unknown:
            raise ConfigError(
                f"unknown policy {unknown[0]!r}; valid policies: {', '.join(POLICY_NAMES)}"
            )
        if self.arrival not in PROCESSES:
            raise ConfigError(
                f"unknown arrival process {self.arrival!r}; known: {', '.join(PROCESSES)}"
            )
        sweep = self.servers_sweep
        if sweep is not None and not 1 <= sweep[0] <= sweep[1]:
            raise ConfigError(f"servers sweep needs 1 <= lo <= hi, got {sweep!r}")
        if not self.target_slowdown > 0:
            raise ConfigError(f"target slowdown must be > 0, got {self.target_slowdown!r}")
        ingress_spread(self.ingress, self.workers)  # a ConfigError for an unknown mode
        view_rule(self.view, self.candidates, self.holders)  # likewise, and bad counts

    def view_options(self) -> dict[str, Any]:
        """:class:`~compass.sim.settings.SimSettings`'s view fields (none for the mesh, its
        default, so a mesh run's records stay as they were)."""
        if self.view == "mesh":
            return {}
        return {"view": self.view, "candidates": self.candidates, "holders": self.holders}

    def replica_config(self) -> ReplicaConfig | None:
        """The replication rule its simulations run (None: off)."""
        return ReplicaConfig() if self.replicate else None

    def runs(self) -> SimRuns:
        """How each simulated run of a capacity search is made with these settings."""
        return SimRuns(
            workers=self.workers,
            jobs=self.jobs,
            warmup=self.warmup,
            arrival=self.arrival,
            cv=self.cv,
            heartbeat_ms=self.heartbeat_ms,
            staleness_ms=self.staleness_ms,
            host_lanes=self.host_lanes,
            options={
                "prefetch_evicts": self.prefetch_evicts,
                **self.view_options(),
                **({"preempt": True} if self.preempt else {}),
                "replicate": self.replica_config(),
            },
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    """What :func:`compare_policies` found: ``report`` is the JSON ``compass sim`` writes
    (``config``, ``results`` {policy: summary}, ``runs`` {policy: counters and
    ``batch_sizes``}, and with a sweep ``servers_needed`` and ``sweep``); ``latencies_ms`` each
    policy's job latencies; ``sweep`` the median slowdown per worker count tried."""

    report: dict[str, Any]
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    sweep: dict[str, dict[int, float | None]] = field(default_factory=dict)


def sim_workload(config: SimConfig) -> Workload:
    """The workload ``config`` runs: its spec with its batching applied."""
    workload = load_workload(config.workload)
    return apply_batching(workload, batching=config.batching, gain=config.batch_gain)


def compare_policies(
    config: SimConfig, workload: Workload | None = None, on_run: RunCallback | None = None
) -> Comparison:
    """Simulate every policy of ``config`` on the same arrivals of its workload (``workload``:
    that workload already loaded, :func:`sim_workload`); ``on_run`` is called after each."""
    if workload is None:
        workload = sim_workload(config)
    arrivals = workload_arrivals(
        workload, config.jobs, process=config.arrival, load=config.load, cv=config.cv,
        seed=config.seed,
    )  # fmt: skip
    heartbeat_s = config.heartbeat_ms / 1000.0
    staleness_s = None if config.staleness_ms is None else config.staleness_ms / 1000.0

    def run(policy: str, n_workers: int) -> SimResult:
        return simulate(
            workload,
            SimSettings(
                workers=n_workers,
                policy=policy,
                heartbeat_s=heartbeat_s,
                staleness_s=staleness_s,
                seed=config.seed,
                host_lanes=config.host_lanes,
                prefetch_evicts=config.prefetch_evicts,
                ingress=config.ingress,
                preempt=config.preempt,
                replicate=config.replica_config(),
                **config.view_options(),
            ),
            arrivals,
        )

    results: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    latencies_ms: dict[str, list[float]] = {}
    for policy in config.policies:
        result = run(policy, config.workers)
        summary = result.summary()
        results[policy] = summary
        runs[policy] = {
            "events": result.events,
            "wall_s": result.wall_s,
            "moves": result.moves,
            "loads": result.loads,
            "prefetches": result.prefetches,
            "evictions": result.evictions,
            "replicas": result.replicas,
            "horizon_s": result.horizon_s,
            "batch_sizes": batch_sizes(result),
        }
        if result.scoped_views:
            runs[policy]["view_workers_mean"] = result.scoped_workers / result.scoped_views
        if config.view == "bounded":  # the messages its real workers would send
            runs[policy]["view_asks"] = result.view_asks
            runs[policy]["view_pushes"] = result.view_pushes
            runs[policy]["cache_changes"] = result.cache_changes
        latencies_ms[policy] = [
            j.latency_s * 1000.0 for j in result.jobs if j.latency_s is not None
        ]
        if on_run is not None:
            on_run(policy, summary, runs[policy])
    report: dict[str, Any] = {
        "config": _config_record(config, workload),
        "results": results,
        "runs": runs,
    }
    sweep: dict[str, dict[int, float | None]] = {}
    if config.servers_sweep is not None:
        lo, hi = config.servers_sweep
        needed: dict[str, int | None] = {}
        for policy in config.policies:

            def median_slowdown(n: int, policy: str = policy) -> float | None:
                value: float | None = run(policy, n).summary()["median_slowdown"]
                return value

            needed[policy], sweep[policy] = fewest_workers(
                median_slowdown, lo, hi, config.target_slowdown
            )
        report["servers_needed"] = needed
        report["sweep"] = {p: {str(n): v for n, v in sorted(s.items())} for p, s in sweep.items()}
    return Comparison(report, latencies_ms, sweep)


def _config_record(config: SimConfig, workload: Workload) -> dict[str, Any]:
    """What the JSON records of the run's settings."""
    return {
        "workload": config.workload,
        "workload_name": workload.name,
        "workers": config.workers,
        "policies": list(config.policies),
        "arrival": config.arrival,
        "cv": config.cv,
        "load": config.load,
        "jobs": config.jobs,
        "seed": config.seed,
        "heartbeat_ms": config.heartbeat_ms,
        "staleness_ms": config.heartbeat_ms if config.staleness_ms is None else config.staleness_ms,
        "host_lanes": config.host_lanes,
        "prefetch": "evict" if config.prefetch_evicts else "free",
        "batching": config.batching,
        "batch_gain": config.batch_gain,
        "mean_interval_ms_per_client": workload.arrivals.mean_interval_ms_per_client,
        "cache_bytes": workload.cluster.gpu_memory_bytes,
        "servers_sweep": list(config.servers_sweep) if config.servers_sweep else None,
        "target_slowdown": config.target_slowdown,
        "replicate": config.replicate,
        **config.view_options(),
    }


def batch_sizes(result: SimResult) -> dict[str, int]:
    """How many runs of model tasks had each batch size (``{"1": 700, "2": 38}``), as a real
    worker's status counts them under ``batches``."""
    tasks = Counter(t.batch for t in result.tasks if t.cache_hit is not None)
    # each run of b tasks left b records
    return {str(b): n // b for b, n in sorted(tasks.items())}


def fewest_workers(
    median_slowdown: Callable[[int], float | None], lo: int, hi: int, target: float
) -> tuple[int | None, dict[int, float | None]]:
    """The fewest workers in ``lo..hi`` whose median slowdown is at most ``target`` (None if
    none), and every value computed on the way.

    Assumes the slowdown does not grow with more workers: it evaluates a coarse grid (all of
    it, for the plot), then bisects between the first grid point that meets the target and
    the grid point before it.
    """
    seen: dict[int, float | None] = {}

    def meets(n: int) -> bool:
        if n not in seen:
            seen[n] = median_slowdown(n)
        value = seen[n]
        return value is not None and value <= target

    grid = sorted(
        {round(float(x)) for x in np.linspace(lo, hi, min(SWEEP_GRID_POINTS, hi - lo + 1))}
    )
    passing = [n for n in grid if meets(n)]  # evaluates every grid point
    first = next((n for n in grid if n in passing), None)
    if first is None:
        return None, seen
    below = [n for n in grid if n < first]
    bad, good = (below[-1], first) if below else (lo - 1, first)
    while good - bad > 1:
        mid = (bad + good) // 2
        if meets(mid):
            good = mid
        else:
            bad = mid
    return good, seen
