"""``compass bench ...``: each benchmark's flags checked, then its runner in ``compass._bench``
(which prints a table and writes JSON)."""

from __future__ import annotations

import math
import signal
from types import FrameType
from typing import Annotated

import typer

from compass.config import SIM_WORKER

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
    Quick,
    SloFlag,
    Workers,
)
from .sim import Preempt

bench_app = typer.Typer(
    help="Benchmarks: each prints a table and writes JSON.", no_args_is_help=True
)


def stop_cleanly() -> None:
    """A benchmark (or the demo) stopped with SIGTERM stops as with Ctrl-C: its event loop's
    tasks are cancelled, so the local clusters it started end their worker processes (by
    default SIGTERM ends the process at once and leaves them running)."""
    signal.signal(signal.SIGTERM, _as_ctrl_c)


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """SIGTERM handled by the SIGINT handler of the moment: under :class:`asyncio.Runner`, its
    own, which cancels the main task and raises nothing. Raising ``KeyboardInterrupt`` at
    once (``signal.default_int_handler``) lands wherever the main thread is; inside logging's
    release after a fork (uvloop runs the at-fork hooks around each spawn) it was ignored,
    with logging's lock left held: the benchmark ran on, deaf to the signal."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIG_IGN or SIG_DFL: no Python handler to share
        raise KeyboardInterrupt


bench_app.callback()(stop_cleanly)


@bench_app.command("wire")
def bench_wire(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Wire protocol against a raw uvloop Protocol: round trip, pipelined, bulk."""
    from compass._bench import wire

    check_output(json_path, "--json")
    wire.run(quick=quick, json_path=json_path)


@bench_app.command("fuzz")
def bench_fuzz(
    frames: Annotated[int, typer.Option(min=1, help="Hostile frames and peer messages.")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the frame generator.")] = 0,
    idle: Annotated[
        int, typer.Option(min=0, help="Idle unauthenticated sockets opened first.")
    ] = 3000,
    json_path: JsonPath = None,
) -> None:
    """A worker process under random and mutated frames, malformed peer messages and idle
    sockets: drops, crashes, RSS, and whether it kept serving."""
    from compass._bench import fuzz

    check_output(json_path, "--json")
    fuzz.run(frames=frames, seed=seed, idle=idle, json_path=json_path)


@bench_app.command("cache")
def bench_cache(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Slab allocation and eviction decision cost with 100 models resident."""
    from compass._bench import cache

    check_output(json_path, "--json")
    cache.run(quick=quick, json_path=json_path)


@bench_app.command("gpu")
def bench_gpu(
    quick: Annotated[bool, typer.Option("--quick", help="A 2 GiB prefetch, not 8.")] = False,
    json_path: JsonPath = None,
) -> None:
    """The first run on a GPU: arena, dtypes, the eviction race, load bandwidth, pinned memory,
    two workers on one device, pytest -m gpu. Without CUDA: one line, exit 0."""
    from compass._bench import gpu

    check_output(json_path, "--json")
    if gpu.run(json_path=json_path, quick=quick).get("passed") is False:
        raise typer.Exit(1)


@bench_app.command("plan")
def bench_plan(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Microseconds to plan one job of each paper workflow over 5 to 240 workers."""
    from compass._bench import plan

    check_output(json_path, "--json")
    plan.run(quick=quick, json_path=json_path)


@bench_app.command("stream")
def bench_stream(
    jobs: Annotated[int, typer.Option(min=2, help="Jobs a side at each load.")] = 100,
    step_ms: Annotated[float, typer.Option(min=0.1, help="Milliseconds a step takes.")] = 10.0,
    steps: Annotated[int, typer.Option(min=1, help="Steps of each job.")] = 20,
    hold_s: Annotated[
        float, typer.Option(min=0.1, help="Seconds the slow reader reads nothing.")
    ] = 10.0,
    json_path: JsonPath = None,
) -> None:
    """Streamed jobs on a real worker: time to first output against the answer at load 1 and
    2, throughput streamed and not, and what a slow reader costs the worker."""
    from compass._bench import stream

    check_output(json_path, "--json")
    stream.run(jobs=jobs, step_ms=step_ms, steps=steps, hold_s=hold_s, json_path=json_path)


@bench_app.command("job")
def bench_job(
    jobs: Annotated[int, typer.Option(min=1, help="Jobs to time.")] = 2000,
    json_path: JsonPath = None,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            help="What tracing costs: untraced, sampled, every job traced, and every trace "
            "returned, in one run (traced_over_plain in the JSON).",
        ),
    ] = False,
    view: Annotated[
        str, typer.Option(help="The worker's view: bounded (the default) or mesh.")
    ] = "bounded",
) -> None:
    """A one-task no-op job, client to worker and back: p50/p99 microseconds."""
    from compass._bench import job
    from compass.config import VIEWS

    if view not in VIEWS:
        fail(f"--view must be one of {', '.join(VIEWS)}, got {view!r}", 2)
    check_output(json_path, "--json")
    job.run(jobs=jobs, json_path=json_path, trace=trace, view=view)


@bench_app.command("client")
def bench_client(
    rounds: Annotated[int, typer.Option(min=1, help="Large submissions per side.")] = 10,
    mib: Annotated[int, typer.Option(min=2, max=900, help="Large submission, MiB.")] = 128,
    json_path: JsonPath = None,
) -> None:
    """A small call's latency behind a 128 MiB submission: one connection against two."""
    from compass._bench import client

    check_output(json_path, "--json")
    client.run(rounds=rounds, mib=mib, json_path=json_path)


@bench_app.command("http")
def bench_http(
    quick: Quick = False,
    json_path: JsonPath = None,
    before: Annotated[
        str | None,
        typer.Option(help="Also a front door run from this checkout: a before/after, one run."),
    ] = None,
) -> None:
    """The HTTP front door (Open Inference Protocol, JSON and binary; OpenAI streaming) against
    the native client: no-op p50/p99 and jobs/s, a 3 MB tensor, streamed chunks per second,
    native with the front door on and off."""
    from compass._bench import front

    check_output(json_path, "--json")
    front.run(quick=quick, json_path=json_path, before=before)


@bench_app.command("chain")
def bench_chain(
    workers: Annotated[
        int, typer.Option(min=1, help="Worker processes the chain alternates over.")
    ] = 2,
    tasks: Annotated[int, typer.Option(help="Chain length: 10, 100 or 1000.")] = 1000,
    repeats: Annotated[
        int, typer.Option(min=1, help="Runs of each side; the best is reported.")
    ] = 3,
    dask: Annotated[bool, typer.Option(help="Also run the chain on Dask distributed.")] = True,
    json_path: JsonPath = None,
) -> None:
    """A chain of tiny tasks alternating between workers, compass against Dask distributed."""
    from compass._bench import chain
    from compass._bench.apps import CHAIN_LENGTHS

    if tasks not in CHAIN_LENGTHS:
        fail(f"--tasks {tasks}: must be one of {', '.join(map(str, CHAIN_LENGTHS))}", 2)
    check_output(json_path, "--json")
    chain.run(tasks=tasks, workers=workers, repeats=repeats, json_path=json_path, with_dask=dask)


@bench_app.command("e2e")
def bench_e2e(
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON.")] = None,
    workers: Workers = 5,
    policies: Policies = "compass,jsq,heft,hash",
    arrival: Arrival = "poisson",
    cv: Annotated[float, typer.Option(help="Gamma arrivals: std / mean of inter-arrivals.")] = 1.0,
    load: Annotated[float, typer.Option(help="Multiplies the spec's arrival rate.")] = 1.0,
    jobs: Jobs = 200,
    seed: Annotated[int, typer.Option(help="Arrival sequence seed.")] = 0,
    time_scale: Annotated[float | None, typer.Option(help=TIME_SCALE_HELP)] = None,
    heartbeat_ms: Annotated[
        float, typer.Option(help="Worker heartbeat interval.")
    ] = SIM_WORKER.sched.heartbeat_ms,
    heartbeat_min_ms: Annotated[
        float, typer.Option(help="Least gap between a worker's heartbeats.")
    ] = SIM_WORKER.sched.heartbeat_min_ms,
    host_lanes: HostLanes = SIM_WORKER.host_lanes,
    servers_sweep: Annotated[str | None, typer.Option(help="LO..HI: servers needed.")] = None,
    target_slowdown: Annotated[float, typer.Option(help="For --servers-sweep.")] = 2.0,
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here (needs matplotlib).")] = None,
    capacity: Capacity = False,
    seeds: Annotated[str, typer.Option(help="--capacity: arrival seeds, 0-4 or 0,1,2.")] = "0",
    slo: SloFlag = None,
    max_load: MaxLoad = 4.0,
    steps: Annotated[int, typer.Option(min=0, help="--capacity: bisection steps.")] = 2,
    batching: BatchingFlag = Batching.on,
    batch_gain: BatchGainFlag = None,
    deadline_x: Annotated[
        float | None,
        typer.Option(help="Give every job a deadline of X times its best time: goodput."),
    ] = None,
    priority_mix: Annotated[
        float, typer.Option(help="With --deadline-x: the fraction of jobs at priority 1.")
    ] = 0.0,
    trace: Annotated[
        str | None,
        typer.Option(
            "--trace",
            metavar="PATH",
            help="Write every task and model load of the run as a Chrome trace (Perfetto).",
            show_default=False,
        ),
    ] = None,
    timeline: Annotated[
        str | None,
        typer.Option(
            "--timeline",
            metavar="PNG",
            help="Draw a per-worker Gantt chart of the run's tasks and loads (matplotlib).",
            show_default=False,
        ),
    ] = None,
    preempt: Annotated[
        Preempt,
        typer.Option(
            help="The workers schedule at step boundaries (compass worker start --preempt): "
            "on, off, or both (each policy also as 'NAME (no preemption)')."
        ),
    ] = Preempt.off,
    step_batch: Annotated[
        Preempt,
        typer.Option(
            help="Step-wise tasks that declare a batch run their steps as one batch: on, off "
            "(each runs one job), or both (each policy also as 'NAME (no step batching)')."
        ),
    ] = Preempt.on,
) -> None:
    """The paper's workload on a real local cluster: every policy on the same arrivals."""
    from compass._bench import e2e
    from compass.sim.settings import with_preemption, with_step_batching

    names = comma_list(policies)
    check_policies(names)
    preempted, preempting = with_preemption(tuple(names), preempt.value)
    runs = with_step_batching(preempted, step_batch.value)
    if workload is not None:
        check_workload(workload)
    sweep = sweep_range(servers_sweep)
    check_output(json_path, "--json")
    check_plot(plot)
    check_output(trace, "--trace")
    check_plot(timeline, "--timeline")
    if capacity and (trace or timeline):
        fail("--trace and --timeline record one run of each policy, not --capacity", 2)
    config = e2e.E2EConfig(
        workload=workload or e2e.DEFAULT_WORKLOAD,
        workers=workers,
        policies=runs,
        arrival=arrival,
        cv=cv,
        load=load,
        jobs=jobs,
        seed=seed,
        time_scale=time_scale_for(time_scale, workload or e2e.DEFAULT_WORKLOAD),
        heartbeat_ms=heartbeat_ms,
        heartbeat_min_ms=heartbeat_min_ms,
        host_lanes=host_lanes,
        deadline_x=deadline_x,
        priority_mix=priority_mix,
        preempt=preempting,
        **batching_keywords(batching, batch_gain),
    )
    if capacity:
        if sweep:
            fail("--capacity does not combine with --servers-sweep", 2)
        seed_list, slos = capacity_args(seeds, slo, max_load)
        e2e.run_capacity(
            config,
            seeds=seed_list,
            slos=slos,
            max_load=max_load,
            steps=steps,
            json_path=json_path,
            plot_path=plot,
        )
        return
    e2e.run(
        config,
        json_path=json_path,
        plot_path=plot,
        servers_sweep=sweep,
        target_slowdown=target_slowdown,
        trace_path=trace,
        timeline_path=timeline,
    )


@bench_app.command("peers")
def bench_peers(
    system: Annotated[str, typer.Option(help="The peer to run beside compass: ray-serve.")],
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON.")] = None,
    workers: Workers = 5,
    loads: Annotated[str, typer.Option(help="Comma-separated load multiples.")] = "0.5,1,2",
    jobs: Jobs = 200,
    seed: Annotated[int, typer.Option(help="Arrival sequence seed.")] = 0,
    time_scale: Annotated[
        float,
        typer.Option(
            help="Real seconds per spec second. 1 (real time) by default: a peer's fixed cost "
            "per call does not shrink with the time scale (docs/RESULTS.md)."
        ),
    ] = 1.0,
    capacity: Capacity = False,
    seeds: Annotated[str, typer.Option(help="--capacity: arrival seeds, 0-4 or 0,1,2.")] = "0",
    max_load: MaxLoad = 4.0,
    steps: Annotated[int, typer.Option(min=0, help="--capacity: bisection steps.")] = 0,
    servers_sweep: Annotated[
        str | None, typer.Option(help="LO..HI: servers needed at load 1.")
    ] = None,
    target_slowdown: Annotated[float, typer.Option(help="For --servers-sweep.")] = 2.0,
    overheads: Annotated[bool, typer.Option(help="Also a no-op job and a chain.")] = True,
    models_per_replica: Annotated[
        int | None, typer.Option(min=1, help="Ray Serve: models per replica (default: fit).")
    ] = None,
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here (needs matplotlib).")] = None,
) -> None:
    """compass against another serving system on the same workload, arrivals and time scale."""
    from compass._bench import e2e, peers, peers_ray
    from compass.sim.capacity import parse_seeds

    if workload is not None:
        check_workload(workload)
    sweep = sweep_range(servers_sweep)
    check_output(json_path, "--json")
    check_plot(plot)
    try:
        load_list = [float(x) for x in comma_list(loads)]
    except ValueError:
        fail(f"--loads {loads!r}: expected comma-separated numbers", 2)
    spec = workload or e2e.DEFAULT_WORKLOAD
    config = e2e.E2EConfig(
        workload=spec,
        workers=workers,
        policies=("compass",),
        jobs=jobs,
        seed=seed,
        time_scale=time_scale,
    )
    comparison = peers.PeersConfig(
        system=system,
        loads=tuple(load_list),
        capacity_search=capacity,
        seeds=parse_seeds(seeds),
        max_load=max_load,
        steps=steps,
        servers_sweep=sweep,
        target_slowdown=target_slowdown,
        overheads=overheads,
        ray_config=peers_ray.RayServeConfig(models_per_replica=models_per_replica),
    )
    peers.run(config, comparison, json_path=json_path, plot_path=plot)


@bench_app.command("generalize")
def bench_generalize(
    workloads: Annotated[int, typer.Option(min=1, help="Generated workloads: seeds 0..N-1.")] = 20,
    policies: Annotated[
        str | None, typer.Option(help="Comma-separated; default compass,jsq,heft,hash,jit.")
    ] = None,
    seeds: Annotated[str, typer.Option(help="Arrival seeds per workload, 0-4 or 0,1,2.")] = "0",
    slo: SloFlag = None,
    max_load: MaxLoad = 8.0,
    jobs: Jobs = 500,
    arrival: Arrival = "poisson",
    json_path: JsonPath = None,
) -> None:
    """Compass's simulated capacity against the best baseline's on generated workloads."""
    from compass._bench import generalize

    names = comma_list(policies) if policies is not None else None
    if names is not None:
        check_policies(names)
    seed_list, slos = capacity_args(seeds, slo, max_load)
    check_output(json_path, "--json")
    generalize.run(
        workloads=workloads,
        policies=names,
        seeds=seed_list,
        slos=slos,
        jobs=jobs,
        max_load=max_load,
        arrival=arrival,
        json_path=json_path,
    )


@bench_app.command("preempt")
def bench_preempt(
    generated: Annotated[
        int, typer.Option(min=0, help="Generated workloads with steps: seeds 0..N-1.")
    ] = 4,
    stepwise: Annotated[
        float, typer.Option(help="Their long model tasks' chance to run in steps.")
    ] = 0.5,
    policies: Annotated[str, typer.Option(help="Comma-separated, compass first.")] = (
        "compass,jsq,jit"
    ),
    seeds: Annotated[str, typer.Option(help="Arrival seeds, 0-2 or 0,1,2.")] = "0",
    jobs: Jobs = 500,
    max_load: MaxLoad = 6.0,
    json_path: JsonPath = None,
    switch: Annotated[
        str, typer.Option(help="What is on and off: preempt, or step-batch (preemption on).")
    ] = "preempt",
    paper: Annotated[
        bool, typer.Option(help="The paper's workload with steps too, before the generated.")
    ] = True,
) -> None:
    """Preemption at step boundaries (or step batching): capacity with and without it, on
    workloads with steps (simulated)."""
    from compass._bench import preempt
    from compass.sim.capacity import parse_seeds

    names = comma_list(policies)
    check_policies(names)
    if names[0] != "compass" or len(names) < 2:
        fail("--policies: compass first, then at least one baseline", 2)
    check_output(json_path, "--json")
    if switch not in ("preempt", "step-batch"):
        fail(f"--switch must be preempt or step-batch, got {switch!r}", 2)
    bench = preempt.PreemptBench(
        generated=generated, stepwise=stepwise, policies=tuple(names),
        seeds=tuple(parse_seeds(seeds)), jobs=jobs, max_load=max_load, switch=switch,
        paper=paper,
    )  # fmt: skip
    preempt.run(bench, json_path)


@bench_app.command("elastic")
def bench_elastic(
    seeds: Annotated[str, typer.Option(help="Curve and arrival seeds, 0-2 or 0,1,2.")] = "0-2",
    generated: Annotated[
        int, typer.Option(min=0, help="Generated workloads beside the paper's: seeds 1..N.")
    ] = 2,
    minute_s: Annotated[
        float, typer.Option(help="Simulated seconds per trace minute (60: real time).")
    ] = 1.0,
    start_s: Annotated[float, typer.Option(help="Seconds a new worker takes to start.")] = 30.0,
    workloads: Annotated[
        str, typer.Option(help="Only these workloads, e.g. paper,generated-1 (default: all).")
    ] = "",
    clusters: Annotated[
        str,
        typer.Option(
            help="Only these result keys, e.g. autoscale,ray-serve-rule-target-0.5 (default: "
            "all, Ray's targets up to the first at autoscale's attainment)."
        ),
    ] = "",
    calibration: Annotated[
        str,
        typer.Option(
            help="Reuse the capacity calibration of an earlier --json run (its workloads)."
        ),
    ] = "",
    real: Annotated[
        bool,
        typer.Option(
            "--real",
            help="Check the simulator on a real local cluster, a compressed curve (minutes).",
        ),
    ] = False,
    json_path: JsonPath = None,
) -> None:
    """A simulated day of traffic: autoscaling against peak, mean and Ray Serve's rule."""
    from compass._bench import elastic
    from compass.sim.capacity import parse_seeds

    if real:
        from compass._bench import elastic_real

        check_output(json_path, "--json")
        elastic_real.run_real(elastic_real.RealConfig(), json_path=json_path)
        return
    if not 0 < minute_s < float("inf") or not 0 <= start_s < float("inf"):
        fail(f"--minute-s must be > 0 and --start-s >= 0, got {minute_s:g}, {start_s:g}", 2)
    seed_list = parse_seeds(seeds)
    check_output(json_path, "--json")
    config = elastic.ElasticConfig(
        generated=tuple(range(1, generated + 1)),
        seeds=seed_list,
        minute_s=minute_s,
        start_s=start_s,
        workloads=tuple(w.strip() for w in workloads.split(",") if w.strip()),
        clusters=tuple(c.strip() for c in clusters.split(",") if c.strip()),
        calibration=calibration,
    )
    elastic.run(config, json_path=json_path)


@bench_app.command("replicas")
def bench_replicas(
    seeds: Annotated[str, typer.Option(help="Arrival seeds, 0-2 or 0,1,2.")] = "0-2",
    generated: Annotated[
        int, typer.Option(min=0, help="Generated workloads beside the paper's: seeds 1..N.")
    ] = 2,
    small: Annotated[
        int, typer.Option(min=0, help="Generated workloads of 16-24 small models: seeds 1..N.")
    ] = 0,
    cold_s: Annotated[
        str | None,
        typer.Option(help="Sweep the rule's cold_s: seconds, comma-separated (with --cooldown-s)."),
    ] = None,
    cooldown_s: Annotated[
        str | None,
        typer.Option(help="Sweep the rule's cooldown_s: seconds, comma-separated."),
    ] = None,
    json_path: JsonPath = None,
    real: Annotated[
        bool,
        typer.Option(
            help="On real worker processes: a burst of one model's jobs on 3 emulated workers, "
            "with and without --replicate (every one of --seeds and --cache-mb)."
        ),
    ] = False,
    cache_mb: Annotated[
        str,
        typer.Option(
            help="--real: each worker's cache in MB, comma-separated (1000 holds one of the "
            "two models, 2000 both)."
        ),
    ] = "1000,2000",
    many_small: Annotated[
        bool,
        typer.Option(
            help="--real: also 8 small models on 4 workers whose caches hold 3 (a copy evicts "
            "a model in use); with --cache-mb '' only that."
        ),
    ] = False,
) -> None:
    """Hot models replicated ahead of need, elasticity off: with against without."""
    from compass._bench import elastic_replicas
    from compass.sim.capacity import parse_seeds

    check_output(json_path, "--json")
    if real:
        from compass._bench import replicas_real

        sizes = _numbers(cache_mb, "--cache-mb", "whole MB", 1)
        if (not sizes and not many_small) or any(mb % 1 for mb in sizes):
            raise typer.BadParameter(
                f"--cache-mb needs whole MB, comma-separated, got {cache_mb!r}"
            )
        caches = tuple(int(mb) for mb in sizes)
        replicas_real.run_sweep(
            replicas_real.ReplicasRealConfig(), parse_seeds(seeds), caches,
            json_path=json_path, many_small=many_small,
        )  # fmt: skip
        return
    config = elastic_replicas.ReplicasConfig(
        generated=tuple(range(1, generated + 1)),
        small=tuple(range(1, small + 1)),
        seeds=parse_seeds(seeds),
    )
    if cold_s is None and cooldown_s is None:
        elastic_replicas.run(config, json_path=json_path)
        return
    colds, cooldowns = (
        _numbers(cold_s or "", "--cold-s", "seconds", 0),
        _numbers(cooldown_s or "", "--cooldown-s", "seconds", 0),
    )
    elastic_replicas.sweep(config, colds, cooldowns, json_path=json_path)


def _numbers(text: str, option: str, what: str, least: float) -> tuple[float, ...]:
    """Comma-separated finite numbers of at least ``least`` (``what`` they are); a bad one is a
    one-line error naming ``option``."""
    try:
        values = tuple(float(v) for v in comma_list(text))
    except ValueError:
        values = (-math.inf,)
    if any(not least <= v < math.inf for v in values):
        raise typer.BadParameter(
            f"{option} needs {what} of at least {least:g}, comma-separated, got {text!r}"
        )
    return values


@bench_app.command("defaults")
def bench_defaults(
    workloads: Annotated[int, typer.Option(min=0, help="Generated workloads: seeds 0..N-1.")] = 8,
    seeds: Annotated[str, typer.Option(help="Arrival seeds per workload, 0-2 or 0,1,2.")] = "0-2",
    knobs: Annotated[
        str | None, typer.Option(help="Comma-separated settings (adjust_threshold,...); all.")
    ] = None,
    no_paper: Annotated[bool, typer.Option(help="Leave the paper workload out.")] = False,
    max_load: MaxLoad = 8.0,
    jobs: Jobs = 400,
    json_path: JsonPath = None,
) -> None:
    """Each departure from the paper against compass as shipped: simulated capacity ratios."""
    from compass._bench import defaults

    argv = ["--workloads", str(workloads), "--seeds", seeds, "--jobs", str(jobs)]
    argv += ["--max-load", str(max_load)]
    if knobs is not None:
        argv += ["--knobs", knobs]
    if no_paper:
        argv.append("--no-paper")
    check_output(json_path, "--json")
    if json_path is not None:
        argv += ["--json", json_path]
    defaults.main(argv)


@bench_app.command("batching")
def benchbatching_keywords(
    workloads: Annotated[
        int, typer.Option(min=0, help="Generated workloads besides the paper's: seeds 0..N-1.")
    ] = 3,
    seeds: Annotated[str, typer.Option(help="Arrival seeds per workload, 0-2 or 0,1,2.")] = "0-2",
    jobs: Jobs = 1000,
    policies: Annotated[str, typer.Option(help="Comma-separated; compass among them.")] = (
        "compass,jit,jsq,heft,hash"
    ),
    curves: Annotated[str, typer.Option(help="Comma-separated batch curves.")] = (
        "none,mild,strong"
    ),
    slo: SloFlag = None,
    max_load: MaxLoad = 8.0,
    workload: Annotated[
        str | None, typer.Option(help="Workload spec JSON in place of the paper's.")
    ] = None,
    json_path: JsonPath = None,
) -> None:
    """Simulated capacity of every policy with batching off and on, per batch curve, on the
    paper's and generated workloads; p99 at 1.5x the rate."""
    from compass._bench import batching
    from compass.sim.capacity import CapacitySearch

    names = comma_list(policies)
    check_policies(names)
    spec = workload or default_workload()
    check_workload(spec)
    seed_list, slos = capacity_args(seeds, slo, max_load)
    check_output(json_path, "--json")
    batching.run(
        CapacitySearch(seeds=seed_list, slos=tuple(slos), max_load=max_load),
        workloads=workloads,
        curves=comma_list(curves),
        policies=names,
        jobs=jobs,
        spec=spec,
        json_path=json_path,
    )


@bench_app.command("scale")
def bench_scale(
    workers: Annotated[
        str, typer.Option(help="Comma-separated cluster sizes, each at least 2.")
    ] = "2,4,8,16",
    seconds: Annotated[
        float, typer.Option(help="Seconds of each measured window (idle, then a job stream).")
    ] = 10.0,
    probes: Annotated[
        int, typer.Option(min=1, help="Queue changes timed per size (spread p99).")
    ] = 20,
    view: Annotated[
        str, typer.Option(help="The workers' view: bounded (the default) or mesh.")
    ] = "bounded",
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here (needs matplotlib).")] = None,
) -> None:
    """What the shared view costs each worker as the cluster grows: CPU idle and under a light
    job stream, messages and bytes sent, connections, RSS, and the time to drop a killed
    worker and to spread a queue change, on real local clusters of each size."""
    from compass._bench import scale

    config = scale.ScaleConfig(
        workers=scale.parse_sizes(workers), seconds=seconds, probes=probes, view=view
    )
    check_output(json_path, "--json")
    check_plot(plot)
    scale.run(config, json_path=json_path, plot_path=plot)


@bench_app.command("versions")
def bench_versions(
    quick: Quick = False,
    json_path: JsonPath = None,
    model_mb: Annotated[int, typer.Option(min=1, help="Size of the model fingerprinted.")] = 256,
) -> None:
    """What learned times add to a worker's state, and fingerprinting the weights at start
    against staging them (issue 39, items 2 and 3)."""
    from compass._bench import versions

    check_output(json_path, "--json")
    versions.run(quick=quick, model_mb=model_mb, json_path=json_path)
