"""``compass sim`` (the simulator: policies on the same arrivals in virtual time, capacity and
goodput searches, a comparison with a real cluster) and ``compass workload generate``."""

from __future__ import annotations

import dataclasses
import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from compass.config import SIM_WORKER
from compass.errors import ConfigError

if TYPE_CHECKING:
    from compass._bench.elastic import TrafficConfig

from .checks import (
    batching_keywords,
    capacity_args,
    check_output,
    check_plot,
    check_policies,
    check_workload,
    comma_list,
    default_workload,
    fail,
    sweep_range,
    time_scale_for,
)
from .options import (
    TIME_SCALE_HELP,
    Arrival,
    BatchGainFlag,
    Batching,
    BatchingFlag,
    Capacity,
    HostLanes,
    Jobs,
    JsonPath,
    MaxLoad,
    Policies,
    SloFlag,
)

#: the commands of this module that sit at the top level: ``compass sim``
commands = typer.Typer()
workload_app = typer.Typer(help="Workload spec files.", no_args_is_help=True)


class View(StrEnum):
    auto = "auto"
    mesh = "mesh"
    bounded = "bounded"


class Shed(StrEnum):
    on = "on"
    off = "off"
    both = "both"


#: ``--preempt``: the same three choices as ``--shed``
Preempt = Shed


@commands.command()
def sim(
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Simulated workers (default: the spec's cluster.workers)."),
    ] = None,
    policies: Policies = "compass,jsq,heft,hash",
    arrival: Arrival = "poisson",
    cv: Annotated[float, typer.Option(help="Gamma arrivals: std / mean of inter-arrivals.")] = 1.0,
    load: Annotated[float, typer.Option(help="Multiplies the spec's arrival rate.")] = 1.0,
    jobs: Jobs = 1000,
    seed: Annotated[int, typer.Option(help="Arrival sequence seed.")] = 0,
    heartbeat_ms: Annotated[
        float, typer.Option(help="How often peers' state reaches the views (virtual ms).")
    ] = SIM_WORKER.sched.heartbeat_ms,
    staleness_ms: Annotated[
        float | None, typer.Option(help="Age of the peer state planners see.")
    ] = None,
    host_lanes: HostLanes = SIM_WORKER.host_lanes,
    ingress: Annotated[
        str,
        typer.Option(
            help="Where jobs enter: client (client i at worker i), spread (dealt over every "
            "worker, as a load balancer would), auto (spread from 64 workers on)."
        ),
    ] = "auto",
    view: Annotated[
        View,
        typer.Option(
            help="What a planner sees: mesh (every worker), or bounded (for each job, itself, "
            "the workers of the job's inputs and plan, the holders of its models and "
            "--candidates sampled workers, as the worker's default view); auto: bounded from "
            "64 workers on, but for --goodput and --compare-real, else mesh."
        ),
    ] = View.auto,
    candidates: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="--view bounded: workers sampled per job beyond the holders, all but one "
            f"drawn from those the planner watches (default: {SIM_WORKER.sched.candidates}).",
        ),
    ] = None,
    holders: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="--view bounded: at most this many holders of each model the job needs "
            f"(default: {SIM_WORKER.sched.holders}; 0: every holder).",
        ),
    ] = None,
    servers_sweep: Annotated[str | None, typer.Option(help="LO..HI: servers needed.")] = None,
    target_slowdown: Annotated[float, typer.Option(help="For --servers-sweep.")] = 2.0,
    compare_real: Annotated[
        bool, typer.Option(help="Also run the same config on a real cluster and compare.")
    ] = False,
    time_scale: Annotated[
        float | None, typer.Option(help=f"--compare-real: {TIME_SCALE_HELP}")
    ] = None,
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here (needs matplotlib).")] = None,
    capacity: Capacity = False,
    seeds: Annotated[str, typer.Option(help="--capacity: arrival seeds, 0-4 or 0,1,2.")] = "0-4",
    slo: SloFlag = None,
    max_load: MaxLoad = 8.0,
    warmup: Annotated[
        int,
        typer.Option(
            min=0,
            help="--capacity: each run's first that many jobs run but are not counted (they "
            "meet empty queues and cold caches; leaving them out measures the steady state).",
        ),
    ] = 0,
    prefetch: Annotated[
        str,
        typer.Option(help="evict: prefetch may evict models needed later; free: free slabs only."),
    ] = "evict",
    batching: BatchingFlag = Batching.on,
    batch_gain: BatchGainFlag = None,
    goodput: Annotated[
        bool,
        typer.Option(
            help="Goodput (jobs answered within their deadline) and attainment at --loads."
        ),
    ] = False,
    loads: Annotated[
        str, typer.Option(help="--goodput: offered loads, comma-separated multiples.")
    ] = "1,2,3,4",
    deadline_x: Annotated[
        float, typer.Option(help="--goodput: every job's deadline, x its best time.")
    ] = 5.0,
    priority_mix: Annotated[
        float, typer.Option(help="--goodput: the fraction of jobs at priority 1.")
    ] = 0.0,
    shed: Annotated[
        Shed, typer.Option(help="--goodput: refuse and drop jobs that would miss (on), or not.")
    ] = Shed.both,
    preempt: Annotated[
        Preempt,
        typer.Option(
            help="Scheduling at step boundaries (a queued task of a higher priority, or one "
            "whose deadline waiting would miss, takes a step-wise task's lane between steps): "
            "on, off, or both (each policy also as 'NAME (no preemption)')."
        ),
    ] = Preempt.off,
    step_batch: Annotated[
        Preempt,
        typer.Option(
            help="Step batching (step-wise tasks that declare a batch run their steps as one "
            "batch that tasks join and leave at step boundaries): on, off, or both (each "
            "policy also as 'NAME (no step batching)')."
        ),
    ] = Preempt.on,
    replicate: Annotated[
        bool,
        typer.Option(
            help="Hot models warmed ahead of need (a worker with headroom loads a model whose "
            "holders' queues rise, as compass worker start --replicate does); for the plain "
            "simulation and --capacity."
        ),
    ] = False,
    learned_admission: Annotated[
        Preempt,
        typer.Option(
            help="--goodput: an ingress also admits only as many jobs of a workflow and "
            "priority as those it admitted were not mostly dropped: on, off, or both (each "
            "policy also as 'NAME (plan admission)')."
        ),
    ] = Preempt.off,
    traffic: Annotated[
        str | None,
        typer.Option(
            help="A day of traffic: 'daily' (a seeded daily curve with bursts) or a CSV of "
            "per-minute counts (header minute,jobs); compares autoscaling with clusters fixed "
            "at the peak and the mean size and with Ray Serve's rule."
        ),
    ] = None,
    rate_scale: Annotated[
        float, typer.Option(help="--traffic: the curve's mean maps to this x the spec's rate.")
    ] = 1.0,
    minute_s: Annotated[
        float, typer.Option(help="--traffic: simulated seconds per minute (less compresses).")
    ] = 60.0,
    autoscale: Annotated[
        str | None, typer.Option(help="--traffic: MIN:MAX workers (default 1 to the peak size).")
    ] = None,
    start_s: Annotated[
        float, typer.Option(help="--traffic: seconds a new worker takes before it can load.")
    ] = 30.0,
    capacity_table: Annotated[
        str | None,
        typer.Option(
            help="--traffic: size by this utilization-by-size table and margin (a `compass "
            "bench elastic --json` file, or {by_size, margin}); default: one utilization."
        ),
    ] = None,
) -> None:
    """Discrete-event simulation of the same planner and cache code in virtual time."""
    from compass._bench import sim_report
    from compass.sim.compare import SimConfig

    names = comma_list(policies)
    check_policies(names)
    spec = workload or default_workload()
    check_workload(spec)
    if workers is None:
        from compass.workflow.spec import load_workload

        workers = load_workload(spec).cluster.workers
    sweep = sweep_range(servers_sweep)
    if warmup and not capacity:
        fail("--warmup is for --capacity", 2)
    if warmup >= jobs:
        fail(f"--warmup {warmup} must be fewer than --jobs {jobs}", 2)
    check_output(json_path, "--json")
    check_plot(plot)
    if prefetch not in ("evict", "free"):
        fail(f"--prefetch must be evict or free, got {prefetch!r}", 2)
    evicts = prefetch == "evict"
    batch = batching_keywords(batching, batch_gain)
    # the simulator is imported here, not with the CLI: `compass worker start` never needs it
    from compass.sim.settings import with_learned_admission, with_preemption, with_step_batching

    runs_of, preempting = with_preemption(tuple(names), preempt.value)
    names = list(with_step_batching(runs_of, step_batch.value))
    admission = "plan"
    if learned_admission != Preempt.off:
        if not goodput:
            fail("--learned-admission is for --goodput", 2)
        admitted, admission = with_learned_admission(tuple(names), learned_admission.value)
        names = list(admitted)
    if (preempting and traffic is not None) or (preempt == Preempt.both and compare_real):
        fail("--preempt is for the plain simulation, --capacity, --goodput and (on, not both) "
             "--compare-real", 2)  # fmt: skip
    if replicate and (goodput or compare_real or traffic is not None):
        fail("--replicate is for the plain simulation and --capacity", 2)
    if step_batch != Preempt.on and traffic is not None:
        fail("--step-batch is for the plain simulation, --capacity, --goodput and "
             "--compare-real", 2)  # fmt: skip
    if view == View.auto:
        from compass.sim.modes import auto_view

        view = View.mesh if goodput or compare_real else View(auto_view(workers))
    if view == View.mesh and (candidates is not None or holders is not None):
        fail("--candidates and --holders need --view bounded", 2)
    if view == View.bounded and (goodput or compare_real):
        fail("--view bounded is for the plain simulation and --capacity", 2)
    seen: dict[str, Any] = {"view": view.value}
    if candidates is not None:
        seen["candidates"] = candidates
    if holders is not None:
        seen["holders"] = holders or None  # 0: every holder
    if capacity_table is not None and traffic is None:
        fail("--capacity-table is for --traffic", 2)
    if traffic is not None:
        if capacity or goodput or compare_real or sweep:
            fail("--traffic does not combine with --capacity, --goodput, --compare-real or "
                 "--servers-sweep", 2)  # fmt: skip
        from compass._bench import elastic

        curve = elastic.TrafficConfig(
            workload=spec,
            traffic=traffic,
            seed=seed,
            minute_s=minute_s,
            rate_scale=rate_scale,
            start_s=start_s,
            policy=names[0],
            capacity_table=capacity_table or "",
        )
        _traffic(curve, autoscale, json_path)
        return
    if goodput:
        from compass._bench import goodput as goodput_bench
        from compass.sim.capacity import parse_seeds

        if capacity or compare_real or sweep:
            fail("--goodput does not combine with --capacity, --compare-real or --servers-sweep", 2)
        try:
            load_list = [float(x) for x in comma_list(loads)]
        except ValueError:
            fail(f"--loads {loads!r}: expected comma-separated numbers", 2)
        if not load_list or not all(0 < x < float("inf") for x in load_list):
            fail(f"--loads {loads!r}: every load must be a number > 0", 2)
        grid = goodput_bench.GoodputConfig(
            workload=spec,
            workers=workers,
            policies=tuple(names),
            loads=tuple(load_list),
            seeds=tuple(parse_seeds(seeds)),
            jobs=jobs,
            deadline_x=deadline_x,
            priority_mix=priority_mix,
            shed={Shed.on: (True,), Shed.off: (False,), Shed.both: (True, False)}[shed],
            arrival=arrival,
            cv=cv,
            host_lanes=host_lanes,
            **batch,
            preempt=preempting,
            admission=admission,
        )
        goodput_bench.run_cli(grid, json_path, plot)
        return
    if capacity:
        from compass.sim.capacity import CapacitySearch

        if compare_real or sweep:
            fail("--capacity does not combine with --compare-real or --servers-sweep", 2)
        seed_list, slos = capacity_args(seeds, slo, max_load)
        sim_report.run_capacity_cli(
            SimConfig(
                workload=spec,
                workers=workers,
                policies=tuple(names),
                arrival=arrival,
                cv=cv,
                jobs=jobs,
                heartbeat_ms=heartbeat_ms,
                staleness_ms=staleness_ms,
                host_lanes=host_lanes,
                prefetch_evicts=evicts,
                **seen,
                **batch,
                preempt=preempting,
                warmup=warmup,
                replicate=replicate,
            ),
            CapacitySearch(seeds=seed_list, slos=tuple(slos), max_load=max_load),
            json_path,
            plot,
        )
        return
    if compare_real:
        from compass._bench import e2e, fidelity

        real = e2e.E2EConfig(
            workload=spec,
            workers=workers,
            policies=tuple(names),
            arrival=arrival,
            cv=cv,
            load=load,
            jobs=jobs,
            seed=seed,
            time_scale=time_scale_for(time_scale, spec),
            host_lanes=host_lanes,
            preempt=preempting,
            **batch,
        )
        fidelity.run(real, json_path)
        return
    config = SimConfig(
        workload=spec,
        workers=workers,
        policies=tuple(names),
        arrival=arrival,
        cv=cv,
        load=load,
        jobs=jobs,
        seed=seed,
        heartbeat_ms=heartbeat_ms,
        staleness_ms=staleness_ms,
        host_lanes=host_lanes,
        prefetch_evicts=evicts,
        servers_sweep=sweep,
        target_slowdown=target_slowdown,
        ingress=ingress,
        **seen,
        **batch,
        preempt=preempting,
        replicate=replicate,
    )
    sim_report.run_cli(config, json_path, plot)


def _traffic(config: TrafficConfig, autoscale: str | None, json_path: str | None) -> None:
    """``compass sim --traffic``: ``config``'s flags checked, ``--autoscale``'s bounds
    parsed into it, then the run."""
    from compass._bench import elastic
    from compass.elastic.rule import parse_bounds

    rate_scale, minute_s, start_s = config.rate_scale, config.minute_s, config.start_s
    if not 0 < rate_scale < float("inf"):
        fail(f"--rate-scale must be a number > 0, got {rate_scale:g}", 2)
    if not 0 < minute_s < float("inf") or not 0 <= start_s < float("inf"):
        fail(f"--minute-s must be > 0 and --start-s >= 0, got {minute_s:g}, {start_s:g}", 2)
    if autoscale is not None:
        config = dataclasses.replace(config, bounds=parse_bounds(autoscale))
    elastic.run_traffic(config, json_path)


@workload_app.command("generate")
def workload_generate(
    seed: Annotated[int, typer.Option(help="Same seed, same workload.")] = 0,
    json_path: Annotated[
        str | None, typer.Option("--json", help="Write the spec here (default: stdout).")
    ] = None,
    stepwise: Annotated[
        float,
        typer.Option(
            help="Chance that a model task of 100 ms or more runs in steps (a generation); "
            "the rest of the workload is the one drawn without."
        ),
    ] = 0.0,
) -> None:
    """Draw a realistic workload spec (compass.workflow.generate) and print a summary line."""
    from compass.workflow.generate import generate_spec, summary_line
    from compass.workflow.spec import parse_workload

    check_output(json_path, "--json")
    try:
        spec = generate_spec(seed, stepwise=stepwise)
    except ConfigError as exc:
        fail(str(exc), 2)
    line = summary_line(parse_workload(spec, source=f"generated-{seed}"))
    text = json.dumps(spec, indent=2) + "\n"
    if json_path is None:
        typer.echo(text, nl=False)
        typer.echo(line, err=True)
        return
    Path(json_path).write_text(text, encoding="utf-8")
    typer.echo(f"{line}; written to {json_path}")
