"""``compass sim``'s output: the tables it prints, the JSON it writes and the plots it draws.

The numbers come from the simulator (:mod:`compass.sim.compare`, :mod:`compass.sim.capacity`);
``bench e2e`` and ``bench peers`` print and plot theirs with the same tables and figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from compass.sim.capacity import REFERENCE, CapacitySearch, capacity_for_workload
from compass.sim.compare import SimConfig, compare_policies, sim_workload
from compass.workflow.best import declared_disagreements
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload

from .report import pyplot, save_figure, write_json

__all__ = [
    "plot_attainment",
    "plot_results",
    "print_capacity",
    "print_results",
    "print_servers_needed",
    "progress_bar",
    "run_capacity_cli",
    "run_cli",
    "warn_declared_best",
]


def run_cli(config: SimConfig, json_path: str | None, plot_path: str | None) -> dict[str, Any]:
    """``compass sim``: simulate every policy of ``config`` on the same arrivals
    (:func:`~compass.sim.compare.compare_policies`), print a table per policy, the comparison
    and the servers needed; write ``json_path`` and ``plot_path`` (PNG) when given; return
    the JSON's content."""
    workload = sim_workload(config)
    warn_declared_best(workload, Console(stderr=True), lanes=1, host_lanes=config.host_lanes)
    console = Console()
    workers = config.workers

    def show(policy: str, summary: Mapping[str, Any], run: Mapping[str, Any]) -> None:
        console.print(_policy_table(policy, workers, summary, run))

    found = compare_policies(config, workload, show)
    out = found.report
    console.print(
        _comparison_table(out["results"], workload.name, workers, config.arrival, config.load)
    )
    if config.servers_sweep is not None:
        console.print(
            _sweep_table(out["servers_needed"], config.servers_sweep, config.target_slowdown)
        )
    write_json(json_path, out)
    if plot_path:
        plot_results(
            plot_path,
            workload,
            found.latencies_ms,
            out["results"],
            found.sweep,
            config.target_slowdown,
        )
        console.print(f"wrote {plot_path}")
    return out


def run_capacity_cli(
    config: SimConfig, search: CapacitySearch, json_path: str | None, plot_path: str | None
) -> dict[str, Any]:
    """``compass sim --capacity``: the capacity of every policy of ``config`` as ``search``
    says (:func:`~compass.sim.capacity.capacity_for_workload`, each run simulated with
    ``config``'s settings on its workload, batching applied); print the tables, write JSON and
    the plot."""
    workload = sim_workload(config)
    console = Console()
    warn_declared_best(workload, Console(stderr=True), host_lanes=config.host_lanes)

    def progress(policy: str, seed: int, load: float, seconds: float) -> None:
        console.print(f"  {policy} seed {seed} load {load:g}: {seconds:.2f} s", style="dim")

    out = capacity_for_workload(workload, config.policies, config.runs(), search, progress)
    out["config"].update(
        workload=config.workload, batching=config.batching, batch_gain=config.batch_gain
    )
    print_capacity(out, title=f"{workload.name} on {config.workers} simulated workers")
    write_json(json_path, out)
    if plot_path:
        plot_attainment(plot_path, out)
        console.print(f"wrote {plot_path}")
    return out


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


def print_capacity(out: Mapping[str, Any], *, title: str) -> None:
    """The capacity table (mean [min-max] per policy and SLO) and the ratio table."""
    config = out["config"]
    bound = config.get("physical_bound")
    max_load = config.get("max_load")
    slos = list(out["capacity"])
    console = Console()
    table = Table(
        title=escape(
            f"{title}: capacity (x the arrival rate), mean [min-max] over seeds "
            f"{_seed_text(config['seeds'])}; physical bound {_num(bound)}"
        )
    )
    table.add_column("policy")
    for slo in slos:
        table.add_column(slo, justify="right")
    table.add_column("bound", justify="right")
    for policy in config["policies"]:
        cells = [escape(_capacity_cell(out["capacity"][slo][policy], max_load)) for slo in slos]
        table.add_row(policy, *cells, _num(bound))
    console.print(table)
    if any(out.get("ratios", {}).values()):
        ratios = Table(title=escape(f"{REFERENCE} / policy capacity: mean [min-max] over seeds"))
        ratios.add_column("policy")
        for slo in slos:
            ratios.add_column(slo, justify="right")
        for policy in (p for p in config["policies"] if p != REFERENCE):
            cells = [escape(_ratio_cell(out["ratios"][slo][policy])) for slo in slos]
            ratios.add_row(policy, *cells)
        console.print(ratios)
    busy = out.get("busy_at_capacity")
    if busy:
        shares = Table(title="lanes busy at each capacity (share of the run): mean over seeds")
        shares.add_column("policy")
        for slo in slos:
            shares.add_column(slo, justify="right")
        for policy in config["policies"]:
            cells = [_share_cell(busy[slo][policy]) for slo in slos]
            shares.add_row(policy, *cells)
        console.print(shares)


def _seed_text(seeds: Sequence[int]) -> str:
    return ",".join(str(s) for s in seeds)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _capacity_cell(entry: Mapping[str, Any] | None, max_load: float | None) -> str:
    if entry is None:
        return "none"
    text = f"{entry['mean']:.2f} [{entry['min']:.2f}-{entry['max']:.2f}]"
    if max_load is not None and entry["max"] >= max_load:
        text += " (cap)"  # met at the top of the grid: the true capacity may be higher
    return text


def _share_cell(entry: Mapping[str, Any] | None) -> str:
    return "-" if entry is None else f"{entry['mean']:.0%}"


def _ratio_cell(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    text = f"{float(np.mean(known)):.2f} [{min(known):.2f}-{max(known):.2f}]"
    if len(known) < len(values):
        text += f" ({len(known)}/{len(values)} seeds)"
    return text


def plot_attainment(path: str, out: Mapping[str, Any]) -> None:
    """SLO attainment against load: one panel per SLO, one line per policy and seed (seeds
    bisect at different loads, so their mean would zigzag), the SLO's quantile and the
    physical bound as guides."""
    plt = pyplot(path)
    from matplotlib import ticker

    slos = out["config"]["slos"]
    bound = out["config"].get("physical_bound")
    by_seed = out.get("attainment_by_seed") or {p: {"": v} for p, v in out["attainment"].items()}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(slos), figsize=(5 * len(slos), 4), squeeze=False)
    for ax, (name, slo) in zip(axes[0], slos.items(), strict=True):
        for i, (policy, seeds) in enumerate(by_seed.items()):
            for j, by_load in enumerate(seeds.values()):
                points = sorted((float(load), v[name]) for load, v in by_load.items())
                ax.plot(
                    [x for x, _ in points],
                    [y for _, y in points],
                    marker=".",
                    linewidth=1,
                    color=colors[i % len(colors)],
                    label=policy if j == 0 else None,
                )
        ax.axhline(slo["quantile"], color="grey", linestyle="--", linewidth=1, label="SLO")
        if bound is not None:
            ax.axvline(bound, color="black", linestyle=":", linewidth=1, label="bound")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.FixedLocator(out["config"]["grid"]))
        ax.xaxis.set_major_formatter(ticker.StrMethodFormatter("{x:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("load (x arrival rate)")
        ax.set_ylabel(f"jobs within {slo['max_slowdown']:g}x")
        ax.set_title(name)
        ax.legend(fontsize="small")
    save_figure(fig, path)


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
    plt = pyplot(path)
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
