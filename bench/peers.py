"""``compass bench peers --system ray-serve``: compass against the system a user would deploy
instead, on the same workload, arrivals, emulated times and time scale.

compass runs as in ``compass bench e2e`` (:func:`compass._bench.e2e.run_policy`, policy
``compass``); Ray Serve as :mod:`compass._bench.peers_ray` deploys it. Both are summarized by
:func:`compass._bench.e2e.summarize`; the capacity search is the simulator's
(:func:`compass.sim.capacity.search_capacity`) over real runs of each side, and servers needed
is :func:`compass.sim.compare.fewest_workers`. Ray runs in one local Ray instance, started only
while the Ray side runs, so that its idle processes do not share the CPUs with compass's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from compass.errors import ConfigError
from compass.sim import capacity
from compass.sim.capacity import Slo
from compass.wire.transport import new_event_loop
from compass.workflow.spec import Workload

from . import e2e, peers_ray, sim_report
from .report import machine, write_json

__all__ = ["SYSTEMS", "PeersConfig", "compare_loads", "run"]

#: the peers this benchmark can run, besides compass
SYSTEMS = ("ray-serve",)
#: the SLOs the comparison reports by default
DEFAULT_SLOS = ("median2", "p99x5")
#: the loads a capacity search tries before bisecting: ``bench e2e``'s, and two below it, since
#: a peer may miss an SLO at half the paper's rate (Ray Serve did, docs/RESULTS.md)
CAPACITY_LADDER = (0.125, 0.25, *e2e.CAPACITY_LADDER)


class _Sides:
    """Runs one (system, seed, load, workers) point on a fresh deployment of that system; Ray
    is started when the Ray side first needs it and stopped before compass runs again."""

    def __init__(self, config: e2e.E2EConfig, workload: Workload, ray: peers_ray.RayServeConfig):
        self.config = config
        self.workload = workload
        self.ray_config = ray
        self._ray: contextlib.ExitStack | None = None
        #: (system, seed, load, workers) -> summary, so no point runs twice
        self.runs: dict[tuple[str, int, float, int], dict[str, Any]] = {}

    def __call__(self, system: str, seed: int, load: float, workers: int | None = None) -> Any:
        n = workers or self.config.workers
        key = (system, seed, load, n)
        if key not in self.runs:
            point = replace(self.config, load=load, seed=seed)
            arrivals = e2e.arrivals_for(point, self.workload)
            if system == "compass":
                self.stop_ray()
                runner = asyncio.Runner(loop_factory=new_event_loop)
                try:
                    run = e2e.run_policy(point, self.workload, "compass", arrivals, workers=n)
                    summary = runner.run(run)
                finally:
                    runner.close()
            else:
                self._start_ray()
                summary = asyncio.run(
                    peers_ray.run_ray(
                        point, self.workload, arrivals, ray_config=self.ray_config, workers=n
                    )
                )
            self.runs[key] = summary
            print(
                f"  {system} on {n} workers, seed {seed}, load {load:g}: "
                f"median slowdown {_num(summary['median_slowdown'])}, "
                f"p99 {_num(summary['p99_ms'], 0)} ms"
            )
        return self.runs[key]

    def _start_ray(self) -> None:
        if self._ray is None:
            stack = contextlib.ExitStack()
            stack.enter_context(peers_ray.ray_session(self.config.time_scale))
            self._ray = stack

    def stop_ray(self) -> None:
        if self._ray is not None:
            self._ray.close()
            self._ray = None


@contextlib.contextmanager
def _sides(
    config: e2e.E2EConfig, workload: Workload, ray: peers_ray.RayServeConfig
) -> Iterator[_Sides]:
    sides = _Sides(config, workload, ray)
    try:
        yield sides
    finally:
        sides.stop_ray()


def _systems(system: str) -> tuple[str, str]:
    if system not in SYSTEMS:
        raise ConfigError(f"--system {system!r}: expected one of {', '.join(SYSTEMS)}")
    missing = peers_ray.ray_missing()
    if missing is not None:
        raise ConfigError(missing)
    return ("compass", system)


def _point(summary: dict[str, Any], slos: Sequence[Slo]) -> dict[str, Any]:
    """What the JSON keeps of one run: the summary, its attainment per SLO, no raw lists."""
    kept = {k: v for k, v in summary.items() if k not in ("latencies_ms", "slowdowns")}
    kept["attainment"] = {s.name: capacity.attainment(summary["slowdowns"], s) for s in slos}
    return kept


def compare_loads(
    sides: Callable[[str, int, float], dict[str, Any]],
    systems: Sequence[str],
    loads: Sequence[float],
    seed: int,
    slos: Sequence[Slo],
) -> dict[str, dict[str, dict[str, Any]]]:
    """{system: {load: summary with attainment}}, every system's loads run together."""
    return {
        system: {format(load, "g"): _point(sides(system, seed, load), slos) for load in loads}
        for system in systems
    }


@dataclass(frozen=True, slots=True)
class PeersConfig:
    """What ``bench peers`` compares, beyond the runs' :class:`~compass._bench.e2e.E2EConfig`:
    the peer ``system``; latency and attainment at each of ``loads`` (``slos``: default
    :data:`DEFAULT_SLOS`); with ``capacity_search``, each side's capacity over ``seeds``, a grid
    up to ``max_load`` and ``steps`` bisections; with ``servers_sweep=(lo, hi)``, the fewest
    workers meeting ``target_slowdown``; with ``overheads``, a no-op job and a chain; Ray
    Serve deployed as ``ray_config`` says."""

    system: str = "ray-serve"
    loads: tuple[float, ...] = (0.5, 1.0, 2.0)
    slos: tuple[Slo, ...] | None = None
    capacity_search: bool = False
    seeds: tuple[int, ...] = (0,)
    max_load: float = 4.0
    steps: int = 0
    servers_sweep: tuple[int, int] | None = None
    target_slowdown: float = 2.0
    overheads: bool = True
    ray_config: peers_ray.RayServeConfig = field(default_factory=peers_ray.RayServeConfig)


def run(
    config: e2e.E2EConfig,
    peers: PeersConfig = PeersConfig(),
    json_path: str | None = None,
    plot_path: str | None = None,
) -> dict[str, Any]:
    """The comparison: latency at ``peers.loads``, then (if asked) capacity per SLO, servers
    needed at ``config.load`` and the overheads; prints tables, writes JSON and plots."""
    from compass.sim.compare import fewest_workers

    system, loads, slos, seeds = peers.system, peers.loads, peers.slos, peers.seeds
    max_load, steps, ray_config = peers.max_load, peers.steps, peers.ray_config
    servers_sweep, target_slowdown = peers.servers_sweep, peers.target_slowdown
    systems = _systems(system)
    if not loads:
        raise ConfigError("--loads: give at least one load")
    chosen = [capacity.parse_slo(s) for s in DEFAULT_SLOS] if slos is None else list(slos)
    workload = e2e.workload_for(config)
    keep = ray_config.models_per_replica or peers_ray.models_per_replica(workload)
    out: dict[str, Any] = {
        "config": {
            **asdict(config),
            "system": system,
            "loads": list(loads),
            "slos": capacity.slo_config(chosen),
            "ray_serve": {**asdict(ray_config), "models_per_replica": keep},
            "machine": machine(),
            "mode": "real",
        }
    }
    with _sides(config, workload, ray_config) as sides:
        out["results"] = compare_loads(sides, systems, loads, config.seed, chosen)
        print_loads(out["results"], chosen, title=f"{workload.name} on {config.workers} workers")
        if peers.capacity_search:
            grid = capacity.load_grid(max_load, CAPACITY_LADDER)

            def slowdowns(policy: str, seed: int, load: float) -> list[float | None]:
                values: list[float | None] = sides(policy, seed, load)["slowdowns"]
                return values

            found = capacity.search_capacity(
                slowdowns, policies=systems, seeds=seeds, slos=chosen, grid=grid, max_steps=steps
            )
            out["capacity"] = {
                slo: {s: (None if v is None else v["mean"]) for s, v in by.items()}
                for slo, by in found["capacity"].items()
            }
            out["capacity_search"] = {
                **found,
                "config": {
                    "policies": list(systems),
                    "seeds": list(seeds),
                    "slos": capacity.slo_config(chosen),
                    "grid": list(grid),
                    "max_load": max_load,
                    "max_steps": steps,
                    "physical_bound": capacity.physical_bound(workload, config.workers),
                },
            }
            sim_report.print_capacity(
                out["capacity_search"], title=f"{workload.name} on {config.workers} workers"
            )
        sweep: dict[str, dict[int, float | None]] = {}
        if servers_sweep is not None:
            needed: dict[str, int | None] = {}
            for name in systems:

                def median(n: int, name: str = name) -> float | None:
                    value: float | None = sides(name, config.seed, config.load, n)[
                        "median_slowdown"
                    ]
                    return value

                needed[name], sweep[name] = fewest_workers(
                    median, servers_sweep[0], servers_sweep[1], target_slowdown
                )
            out["servers"] = needed
            out["servers_sweep"] = {
                s: {str(n): v for n, v in sorted(t.items())} for s, t in sweep.items()
            }
            sim_report.print_servers_needed(needed, servers_sweep, target_slowdown)
        if peers.overheads:
            sides.stop_ray()
            out["overheads"] = _overheads(sides)
            print_overheads(out["overheads"])
    write_json(json_path, out)
    if plot_path:
        _plot(plot_path, workload, sides, out, sweep, target_slowdown)
    return out


#: jobs of the sequential no-op measurement, and runs of the 100-task chain, per side
NOOP_JOBS = 300
CHAIN_TASKS = 100
CHAIN_REPEATS = 5


def _overheads(sides: _Sides) -> dict[str, dict[str, Any]]:
    """A one-task no-op job (sequential, one worker) and a 100-task no-op chain (two workers)
    on both sides: runtime cost with no placement decision worth the name."""
    from . import chain, job

    runner = asyncio.Runner(loop_factory=new_event_loop)
    try:
        noop = runner.run(job._measure(NOOP_JOBS))
        seconds = runner.run(chain._compass_chain(CHAIN_TASKS, 2, CHAIN_REPEATS))
    finally:
        runner.close()
    out: dict[str, dict[str, Any]] = {
        "compass": {
            "noop_p50_us": noop["p50_us"],
            "noop_p99_us": noop["p99_us"],
            "chain_best_ms": min(seconds) * 1000.0,
            "chain_per_task_us": min(seconds) / CHAIN_TASKS * 1e6,
        }
    }
    sides._start_ray()
    ray_noop = asyncio.run(peers_ray.run_noop(NOOP_JOBS))
    ray_chain = asyncio.run(peers_ray.run_chain(CHAIN_TASKS, 2, CHAIN_REPEATS))
    sides.stop_ray()
    out["ray-serve"] = {
        "noop_p50_us": ray_noop["p50_us"],
        "noop_p99_us": ray_noop["p99_us"],
        "chain_best_ms": ray_chain["best_ms"],
        "chain_per_task_us": ray_chain["per_task_us"],
    }
    return out


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_loads(
    results: dict[str, dict[str, dict[str, Any]]], slos: Sequence[Slo], *, title: str
) -> None:
    """Per system and load: latency, slowdown and SLO attainment; then where the time went."""
    console = Console()
    latency = Table(title=f"{title}: latency (ms), median slowdown, SLO attainment")
    where = Table(title=f"{title}: cache and per-task time (ms, the workload's time)")
    for table, columns in (
        (latency, ["system", "load", "p50", "p99", "median sd", *(s.name for s in slos), "failed"]),
        (where, ["system", "load", "hit rate", "GB loaded", "evictions", "queue", "load", "exec"]),
    ):
        for i, column in enumerate(columns):
            table.add_column(column, justify="left" if i == 0 else "right")
    for system, by_load in results.items():
        for load, s in by_load.items():
            br = s["breakdown_ms"]
            latency.add_row(
                system,
                load,
                _num(s["p50_ms"], 0),
                _num(s["p99_ms"], 0),
                _num(s["median_slowdown"]),
                *(_num(s["attainment"][slo.name], 3) for slo in slos),
                str(s["failed"]),
            )
            where.add_row(
                system,
                load,
                _num(s["cache_hit_rate"], 3),
                _num(s["model_gb_loaded"], 1),
                str(int(s["evictions"])),
                _num(br["queue"], 1),
                _num(br["fetch"], 1),
                _num(br["exec"], 1),
            )
    console.print(latency)
    console.print(where)


def print_overheads(overheads: dict[str, dict[str, Any]]) -> None:
    table = Table(title="runtime overhead: no-op tasks, no emulated time")
    for i, column in enumerate(
        ["system", "1-task job p50 us", "p99 us", f"{CHAIN_TASKS}-task chain ms", "per task us"]
    ):
        table.add_column(column, justify="left" if i == 0 else "right")
    for system, o in overheads.items():
        table.add_row(
            system,
            _num(o["noop_p50_us"], 0),
            _num(o["noop_p99_us"], 0),
            _num(o["chain_best_ms"], 1),
            _num(o["chain_per_task_us"], 0),
        )
    Console().print(table)


def _plot(
    path: str,
    workload: Workload,
    sides: _Sides,
    out: dict[str, Any],
    sweep: dict[str, dict[int, float | None]],
    target: float,
) -> None:
    """``path``: the latency CDF and per-workflow slowdown at the configured load (or the
    first one measured) and the servers sweep; ``<path>-capacity.png``: attainment against
    load, when the capacity was searched."""
    config = sides.config
    loads = out["config"]["loads"]
    load = config.load if config.load in loads else loads[0]
    runs = {s: sides(s, config.seed, load) for s in ("compass", out["config"]["system"])}
    sim_report.plot_results(
        path,
        workload,
        {s: r["latencies_ms"] for s, r in runs.items()},
        runs,
        sweep,
        target,
    )
    print(f"wrote {path}")
    if "capacity_search" in out:
        target_path = str(Path(path).with_suffix("")) + "-capacity.png"
        sim_report.plot_attainment(target_path, out["capacity_search"])
        print(f"wrote {target_path}")
