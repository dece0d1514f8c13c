"""``compass sim``: run several policies on the same arrivals, print, write JSON and a plot.

With a servers sweep it also finds, per policy, the fewest workers whose median slowdown meets
a target (the paper's "same workload on half the servers" comparison).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim.arrivals import PROCESSES, job_arrivals
from compass.sim.capacity import write_json
from compass.sim.engine import simulate
from compass.sim.result import SimResult
from compass.workflow.batching import apply_batching
from compass.workflow.best import declared_disagreements
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload, load_workload

__all__ = [
    "batch_sizes",
    "fewest_workers",
    "plot_results",
    "print_results",
    "print_servers_needed",
    "progress_bar",
    "run_cli",
    "save_figure",
    "warn_declared_best",
]

#: worker counts evaluated before bisecting, at most
SWEEP_GRID_POINTS = 8


def run_cli(
    workload_path: str,
    workers: int,
    policies: list[str],
    arrival: str,
    cv: float,
    load: float,
    jobs: int,
    seed: int,
    heartbeat_ms: float,
    staleness_ms: float | None,
    servers_sweep: tuple[int, int] | None,
    target_slowdown: float,
    json_path: str | None,
    plot_path: str | None,
    host_lanes: int = 0,
    *,
    prefetch_evicts: bool = True,
    batching: bool = True,
    batch_gain: str | None = None,
) -> dict[str, Any]:
    """Simulate every policy of ``policies`` on the same arrivals of the workload at
    ``workload_path`` (with ``batching`` and ``batch_gain`` applied:
    :func:`~compass.workflow.batching.apply_batching`); print a table per policy; write
    ``json_path`` and ``plot_path`` (PNG) when given; return ``{"config", "results": {policy:
    summary}, "runs": {policy: {..., "batch_sizes": ...}}}`` (:func:`batch_sizes`) plus, with
    ``servers_sweep=(lo, hi)``, ``"servers_needed": {policy: N or None}`` and ``"sweep"``
    (median slowdown per worker count tried)."""
    if not policies:
        raise ConfigError("compass sim needs at least one policy")
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown policy {unknown[0]!r}; valid policies: {', '.join(POLICY_NAMES)}"
        )
    if arrival not in PROCESSES:
        raise ConfigError(f"unknown arrival process {arrival!r}; known: {', '.join(PROCESSES)}")
    if servers_sweep is not None and not 1 <= servers_sweep[0] <= servers_sweep[1]:
        raise ConfigError(f"servers sweep needs 1 <= lo <= hi, got {servers_sweep!r}")
    if not target_slowdown > 0:
        raise ConfigError(f"target slowdown must be > 0, got {target_slowdown!r}")
    workload = apply_batching(load_workload(workload_path), batching=batching, gain=batch_gain)
    warn_declared_best(workload, Console(stderr=True), lanes=1, host_lanes=host_lanes)
    mean_interval_s = workload.arrivals.mean_interval_ms_per_client / 1000.0
    arrivals = job_arrivals(
        list(workload.workflows),
        jobs,
        process=arrival,
        mean_interval_s=mean_interval_s,
        load=load,
        cv=cv,
        seed=seed,
        weights=workload.weight_list(),
    )
    heartbeat_s = heartbeat_ms / 1000.0
    staleness_s = None if staleness_ms is None else staleness_ms / 1000.0

    def run(policy: str, n_workers: int) -> Any:
        return simulate(
            workload,
            workers=n_workers,
            policy=policy,
            arrivals=arrivals,
            heartbeat_s=heartbeat_s,
            staleness_s=staleness_s,
            seed=seed,
            host_lanes=host_lanes,
            prefetch_evicts=prefetch_evicts,
        )

    console = Console()
    results: dict[str, dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    latencies_ms: dict[str, list[float]] = {}
    for policy in policies:
        result = run(policy, workers)
        summary = result.summary()
        results[policy] = summary
        runs[policy] = {
            "events": result.events,
            "wall_s": result.wall_s,
            "moves": result.moves,
            "loads": result.loads,
            "prefetches": result.prefetches,
            "evictions": result.evictions,
            "horizon_s": result.horizon_s,
            "batch_sizes": batch_sizes(result),
        }
        latencies_ms[policy] = [
            j.latency_s * 1000.0 for j in result.jobs if j.latency_s is not None
        ]
        console.print(_policy_table(policy, workers, summary, runs[policy]))
    console.print(_comparison_table(results, workload.name, workers, arrival, load))
    out: dict[str, Any] = {
        "config": {
            "workload": workload_path,
            "workload_name": workload.name,
            "workers": workers,
            "policies": list(policies),
            "arrival": arrival,
            "cv": cv,
            "load": load,
            "jobs": jobs,
            "seed": seed,
            "heartbeat_ms": heartbeat_ms,
            "staleness_ms": heartbeat_ms if staleness_ms is None else staleness_ms,
            "host_lanes": host_lanes,
            "prefetch": "evict" if prefetch_evicts else "free",
            "batching": batching,
            "batch_gain": batch_gain,
            "mean_interval_ms_per_client": workload.arrivals.mean_interval_ms_per_client,
            "cache_bytes": workload.cluster.gpu_memory_bytes,
            "servers_sweep": list(servers_sweep) if servers_sweep else None,
            "target_slowdown": target_slowdown,
        },
        "results": results,
        "runs": runs,
    }
    sweep: dict[str, dict[int, float | None]] = {}
    if servers_sweep is not None:
        needed: dict[str, int | None] = {}
        for policy in policies:

            def median_slowdown(n: int, policy: str = policy) -> float | None:
                value: float | None = run(policy, n).summary()["median_slowdown"]
                return value

            needed[policy], sweep[policy] = fewest_workers(
                median_slowdown, servers_sweep[0], servers_sweep[1], target_slowdown
            )
        out["servers_needed"] = needed
        out["sweep"] = {p: {str(n): v for n, v in sorted(s.items())} for p, s in sweep.items()}
        console.print(_sweep_table(needed, servers_sweep, target_slowdown))
    if json_path:
        write_json(json_path, out)
        console.print(f"wrote {json_path}")
    if plot_path:
        plot_results(plot_path, workload, latencies_ms, results, sweep, target_slowdown)
        console.print(f"wrote {plot_path}")
    return out


def batch_sizes(result: SimResult) -> dict[str, int]:
    """How many runs of model tasks had each batch size (``{"1": 700, "2": 38}``), as a real
    worker's status counts them under ``batches``."""
    tasks = Counter(t.batch for t in result.tasks if t.cache_hit is not None)
    # each run of b tasks left b records
    return {str(b): n // b for b, n in sorted(tasks.items())}


def warn_declared_best(
    workload: Workload, console: Console, *, lanes: int = 1, host_lanes: int = 0
) -> None:
    """Print a warning for each workflow whose declared ``best_ms`` disagrees with the best
    time compass computes (and uses) by more than 5%."""
    profiles = Profiles.from_workload(workload)
    for line in declared_disagreements(workload, profiles, lanes=lanes, host_lanes=host_lanes):
        console.print(f"[yellow]warning:[/] {line}", highlight=False)


def progress_bar() -> Progress:
    """A progress display for long benchmark runs (jobs answered per policy)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    )


def print_results(
    results: Mapping[str, Mapping[str, Any]],
    *,
    name: str,
    workers: int,
    arrival: str,
    load: float,
    per_policy: bool = True,
) -> None:
    """The tables ``compass sim`` prints, for any results with the summary keys."""
    console = Console()
    if per_policy:
        for policy, summary in results.items():
            console.print(_policy_table(policy, workers, summary, None))
    console.print(_comparison_table(results, name, workers, arrival, load))


def print_servers_needed(
    needed: Mapping[str, int | None], sweep: tuple[int, int], target: float
) -> None:
    Console().print(_sweep_table(needed, sweep, target))


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


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}f}"
    return str(value)


def _policy_table(
    policy: str, workers: int, summary: Mapping[str, Any], run: Mapping[str, Any] | None
) -> Table:
    table = Table(title=f"{policy} on {workers} workers")
    table.add_column("metric")
    table.add_column("value", justify="right")
    utilization = list(summary["utilization"].values())
    rows: list[tuple[str, Any]] = [
        ("completed / failed", f"{summary['completed']} / {summary['failed']}"),
        (
            "latency p50 / p95 / p99 ms",
            " / ".join(_fmt(summary[k], 0) for k in ("p50_ms", "p95_ms", "p99_ms")),
        ),
        (
            "slowdown median / mean",
            f"{_fmt(summary['median_slowdown'])} / {_fmt(summary['mean_slowdown'])}",
        ),
        ("cache hit rate", _fmt(summary["cache_hit_rate"], 3)),
        ("model GB loaded", _fmt(summary["model_gb_loaded"], 1)),
        (
            "utilization mean / max",
            f"{_fmt(float(np.mean(utilization)), 3)} / {_fmt(float(np.max(utilization)), 3)}",
        ),
        (
            "per task ms: queue / fetch / transfer / exec",
            " / ".join(
                _fmt(summary["breakdown_ms"][k], 1) for k in ("queue", "fetch", "transfer", "exec")
            ),
        ),
    ]
    rows += [
        (f"median slowdown {wf}", _fmt(v)) for wf, v in summary["slowdown_by_workflow"].items()
    ]
    if run is not None:
        rows.append(("events / wall s", f"{run['events']:,} / {run['wall_s']:.2f}"))
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def _comparison_table(
    results: Mapping[str, Mapping[str, Any]], name: str, workers: int, arrival: str, load: float
) -> Table:
    table = Table(title=f"{name}: {workers} workers, {arrival} arrivals, load {load:g}")
    columns = (
        "policy",
        "p50 ms",
        "p99 ms",
        "median slowdown",
        "mean slowdown",
        "hit rate",
        "GB loaded",
    )
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for policy, s in results.items():
        table.add_row(
            policy,
            _fmt(s["p50_ms"], 0),
            _fmt(s["p99_ms"], 0),
            _fmt(s["median_slowdown"]),
            _fmt(s["mean_slowdown"]),
            _fmt(s["cache_hit_rate"], 3),
            _fmt(s["model_gb_loaded"], 1),
        )
    return table


def _sweep_table(needed: Mapping[str, int | None], sweep: tuple[int, int], target: float) -> Table:
    table = Table(
        title=f"fewest workers in {sweep[0]}..{sweep[1]} with median slowdown <= {target:g}"
    )
    table.add_column("policy")
    table.add_column("workers", justify="right")
    for policy, n in needed.items():
        table.add_row(policy, "none" if n is None else str(n))
    return table


def plot_results(
    path: str,
    workload: Workload,
    latencies_ms: Mapping[str, Sequence[float]],
    results: Mapping[str, Mapping[str, Any]],
    sweep: Mapping[str, Mapping[int, float | None]],
    target: float,
) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(f"{path}: plots need matplotlib: pip install 'compass[bench]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    panels = 3 if sweep else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5))
    cdf = axes[0]
    for policy, values in latencies_ms.items():
        if not values:
            continue
        ordered = np.sort(np.asarray(values))
        cdf.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered), label=policy)
    cdf.set_xscale("log")
    cdf.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    cdf.xaxis.set_major_formatter(ticker.StrMethodFormatter("{x:,.0f}"))
    cdf.xaxis.set_minor_formatter(ticker.NullFormatter())
    cdf.set_xlabel("job latency (ms)")
    cdf.set_ylabel("fraction of jobs")
    cdf.set_title("latency CDF")
    cdf.legend(fontsize="small")

    bars = axes[1]
    flows = list(workload.workflows)
    width = 0.8 / max(len(results), 1)
    x = np.arange(len(flows))
    for i, (policy, summary) in enumerate(results.items()):
        by_flow = summary["slowdown_by_workflow"]
        heights = [by_flow.get(wf, math.nan) for wf in flows]
        bars.bar(x + i * width - 0.4 + width / 2, heights, width, label=policy)
    bars.set_xticks(x, flows, rotation=15, fontsize="small")
    bars.set_ylabel("median slowdown")
    bars.set_title("median slowdown per workflow")
    bars.legend(fontsize="small")

    if sweep:
        line = axes[2]
        for policy, by_workers in sweep.items():
            points = sorted((n, v) for n, v in by_workers.items() if v is not None)
            if points:
                line.plot([n for n, _ in points], [v for _, v in points], marker="o", label=policy)
        line.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        line.set_ylim(bottom=0)
        line.set_xlabel("workers")
        line.set_ylabel("median slowdown")
        line.set_title("median slowdown vs workers")
        line.legend(fontsize="small")
    save_figure(fig, path)


def save_figure(fig: Any, path: str) -> None:
    """Lay ``fig`` out, write it to ``path`` (creating the folder), and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
