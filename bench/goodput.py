"""``compass sim --goodput``: goodput and attainment against offered load, with and without
shedding, printed as tables, written as JSON and plotted (the numbers come from
:mod:`compass.sim.goodput`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from compass.config import SIM_WORKER
from compass.sim.capacity import physical_bound
from compass.sim.goodput import goodput_for_workload, simulator_goodput_run
from compass.workflow.batching import apply_batching
from compass.workflow.spec import load_workload

from .report import pyplot, save_figure, write_json

__all__ = ["GoodputConfig", "plot_goodput", "print_goodput", "run_cli"]


@dataclass(frozen=True, slots=True)
class GoodputConfig:
    """One ``compass sim --goodput`` grid: the workload spec at ``workload`` (``batching`` and
    ``batch_gain`` applied) on ``workers``, ``jobs`` arrivals of process ``arrival`` (``cv``:
    gamma's spread) per run, each a deadline of ``deadline_x`` times its best time and a
    fraction ``priority_mix`` at priority 1, for every policy, load, seed and shedding."""

    workload: str
    workers: int
    policies: tuple[str, ...]
    loads: tuple[float, ...]
    seeds: tuple[int, ...]
    jobs: int
    deadline_x: float
    priority_mix: float = 0.0
    shed: tuple[bool, ...] = (True,)
    arrival: str = "poisson"
    cv: float = 1.0
    host_lanes: int = SIM_WORKER.host_lanes
    batching: bool = True
    batch_gain: str | None = None
    #: scheduling at step boundaries, for every policy not named "NAME (no preemption)"
    preempt: bool = False
    #: how ingresses admit, for every policy not named "NAME (plan admission)"
    admission: str = "plan"


def run_cli(config: GoodputConfig, json_path: str | None, plot_path: str | None) -> dict[str, Any]:
    """Run the goodput grid, print it, write the JSON and the plot."""
    workload = apply_batching(
        load_workload(config.workload), batching=config.batching, gain=config.batch_gain
    )
    console = Console()
    run = simulator_goodput_run(
        workload, workers=config.workers, jobs=config.jobs, deadline_x=config.deadline_x,
        priority_mix=config.priority_mix, arrival=config.arrival, cv=config.cv,
        sim={"host_lanes": config.host_lanes, "preempt": config.preempt,
             "admission": config.admission},
    )  # fmt: skip
    grid = ("policies", "loads", "seeds", "shed")
    out = goodput_for_workload(
        run, policies=config.policies, loads=config.loads, seeds=config.seeds, shed=config.shed,
        config={k: v for k, v in asdict(config).items() if k not in grid},
    )  # fmt: skip
    # the most goodput any policy could give: every lane busy all the time on useful work
    out["bound"] = physical_bound(workload, config.workers, host_lanes=config.host_lanes)
    # where tasks batch, the bound full batches could reach
    out["bound_batched"] = physical_bound(
        workload, config.workers, host_lanes=config.host_lanes, batched=True
    )
    print_goodput(out, console, title=f"{workload.name} on {config.workers} simulated workers")
    write_json(json_path, out)
    if plot_path:
        plot_goodput(plot_path, out)
        console.print(f"wrote {plot_path}")
    return out


def print_goodput(out: Mapping[str, Any], console: Console, *, title: str) -> None:
    """Goodput (mean [min-max] over seeds) and attainment per policy and offered load, then
    what was refused and dropped, and attainment per priority."""
    loads = [format(x, "g") for x in out["config"]["loads"]]
    config = out["config"]
    table = Table(
        title=f"{title}: goodput (x the workload's rate), deadlines {config['deadline_x']:g}x "
        "best time"
    )
    table.add_column("policy")
    for load in loads:
        table.add_column(f"load {load}", justify="right")
    for policy, by_load in out["goodput"].items():
        cells = []
        for load in loads:
            g = by_load[load]
            a = out["attainment"][policy][load]["mean"]
            cells.append(f"{g['mean']:.2f} [{g['min']:.2f}-{g['max']:.2f}] {a:.0%}")
        table.add_row(policy, *cells)
    console.print(table)
    bound = out.get("bound")
    if bound:
        console.print(f"physical bound: goodput {bound:.2f}x the workload's rate at most")
    counts = Table(
        title="jobs refused / dropped (mean per run; the share of lane time spent on dropped "
        "jobs); attainment by priority"
    )
    counts.add_column("policy")
    for load in loads:
        counts.add_column(f"load {load}", justify="right")
    for policy in out["goodput"]:
        cells = []
        for load in loads:
            levels = out["attainment_by_priority"][policy][load]
            by_level = " ".join(f"p{p} {v:.0%}" for p, v in levels.items())
            refused, dropped = out["refused"][policy][load], out["dropped"][policy][load]
            wasted = out["wasted_share"][policy][load]
            cells.append(f"{refused:.0f} / {dropped:.0f} ({wasted:.0%} of lane time); {by_level}")
        counts.add_row(policy, *cells)
    console.print(counts)


def plot_goodput(path: str, out: Mapping[str, Any]) -> None:
    """Goodput against offered load, one line per policy (dashed: without shedding), the
    offered load itself as the guide."""
    plt = pyplot(path)

    fig, ax = plt.subplots(figsize=(6, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    bases: list[str] = []
    for policy, by_load in out["goodput"].items():
        base = policy.removesuffix(" (no shedding)")
        if base not in bases:
            bases.append(base)
        points = sorted((float(load), v["mean"]) for load, v in by_load.items())
        ax.plot(
            [x for x, _ in points], [y for _, y in points], marker=".",
            color=colors[bases.index(base) % len(colors)],
            linestyle="--" if policy != base else "-", label=policy,
        )  # fmt: skip
    loads = [float(x) for x in out["config"]["loads"]]
    ax.plot(loads, loads, color="grey", linewidth=1, linestyle=":", label="offered")
    ax.set_xlabel("offered load (x the workload's rate)")
    ax.set_ylabel("goodput (x the workload's rate)")
    ax.set_title(f"deadlines {out['config']['deadline_x']:g}x best time")
    ax.legend(fontsize="small")
    save_figure(fig, path)
