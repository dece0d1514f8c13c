"""The ``compass`` command line: flags and environment in, library calls out. No logic here."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from typing import Annotated, Any

import typer

from compass.config import (
    CacheConfig,
    Limits,
    SchedConfig,
    Timeouts,
    WorkerConfig,
)
from compass.errors import CompassError

app = typer.Typer(
    name="compass",
    help="Decentralized scheduling of ML workflows across GPU workers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
worker_app = typer.Typer(help="Run a worker.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks: each prints a table and writes JSON.", no_args_is_help=True
)
app.add_typer(worker_app, name="worker")
app.add_typer(bench_app, name="bench")

MiB = 1 << 20

Token = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="COMPASS_TOKEN", help="Shared cluster token (or COMPASS_TOKEN)."
    ),
]


def _fail(message: str, code: int = 1) -> None:
    typer.echo(f"compass: {message}", err=True)
    raise typer.Exit(code)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@worker_app.command("start")
def worker_start(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind; 0 picks a free one.")] = 0,
    token: Token = None,
    join: Annotated[
        list[str] | None, typer.Option("--join", help="HOST:PORT of a cluster member (repeatable).")
    ] = None,
    name: Annotated[str, typer.Option(help="Unique worker name (default: <host>-<port>).")] = "",
    app_ref: Annotated[
        str | None, typer.Option("--app", help="Python module (or module:attr) with a compass.App.")
    ] = None,
    workload: Annotated[
        str | None, typer.Option(help="Workload spec JSON: run its workflows emulated.")
    ] = None,
    policy: Annotated[
        str, typer.Option(help="Placement policy (same on every worker).")
    ] = "compass",
    lanes: Annotated[int, typer.Option(help="Execution lanes (tasks run at once).")] = 1,
    host_lanes: Annotated[
        int, typer.Option(help="Lanes for model-less tasks, off the GPU (0: they share it).")
    ] = 1,
    time_scale: Annotated[float, typer.Option(help="Emulated time multiplier.")] = 1.0,
    cache_mb: Annotated[int | None, typer.Option(help="Model cache capacity in MiB.")] = None,
    slab_mb: Annotated[int, typer.Option(help="Slab size in MiB.")] = 64,
    backend: Annotated[str, typer.Option(help="auto, cupy, host or capacity.")] = "auto",
    heartbeat_ms: Annotated[
        float, typer.Option(help="Heartbeat interval when nothing changes.")
    ] = 10.0,
    heartbeat_min_ms: Annotated[
        float, typer.Option(help="Least gap between heartbeats; changes go out after it.")
    ] = 1.0,
    heartbeat_max_rate: Annotated[
        float, typer.Option(help="Most heartbeat messages a second, over all peers.")
    ] = 20000.0,
    peer_timeout_ms: Annotated[float, typer.Option(help="Drop a peer silent this long.")] = 2000.0,
    adjust_threshold: Annotated[float, typer.Option(help="Dynamic adjustment threshold.")] = 0.25,
    warm: Annotated[
        bool, typer.Option(help="Idle workers load models the cluster is short of.")
    ] = True,
    max_frame_mb: Annotated[int, typer.Option(help="Largest frame accepted, MiB.")] = 1024,
    max_jobs: Annotated[
        int, typer.Option(help="Jobs in flight accepted as ingress; more are refused.")
    ] = 10000,
    log_level: Annotated[str, typer.Option(help="Logging level on stderr.")] = "warning",
) -> None:
    """Start a worker; prints 'compass worker listening on HOST:PORT' first."""
    from compass.worker.process import run_worker

    _logging(log_level)
    try:
        cache = CacheConfig(
            capacity_bytes=None if cache_mb is None else cache_mb * MiB,
            slab_bytes=slab_mb * MiB,
            backend=backend,
        )
        config = WorkerConfig(
            host=host,
            port=port,
            name=name,
            token=token,
            join=tuple(join or ()),
            app=app_ref,
            workload=workload,
            lanes=lanes,
            host_lanes=host_lanes,
            time_scale=time_scale,
            max_jobs=max_jobs,
            limits=Limits(max_frame_bytes=max_frame_mb * MiB),
            cache=cache,
            sched=SchedConfig(
                policy=policy,
                heartbeat_ms=heartbeat_ms,
                heartbeat_min_ms=heartbeat_min_ms,
                heartbeat_max_rate=heartbeat_max_rate,
                peer_timeout_ms=peer_timeout_ms,
                adjust_threshold=adjust_threshold,
                warm=warm,
            ),
        )
    except CompassError as exc:
        _fail(str(exc), 2)
    raise typer.Exit(run_worker(config))


@app.command()
def up(
    workers: Annotated[int, typer.Option(help="How many workers.")] = 3,
    token: Token = None,
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON (emulated).")] = None,
    app_ref: Annotated[
        str | None, typer.Option("--app", help="App module for every worker.")
    ] = None,
    policy: Annotated[str, typer.Option(help="Placement policy.")] = "compass",
) -> None:
    """Start a local cluster of joined workers on loopback; Ctrl-C stops them all."""
    from compass.cluster import LocalCluster
    from compass.wire.transport import new_event_loop

    if workload is None and app_ref is None:
        workload = _default_workload()
    args = ["--policy", policy]
    args += ["--workload", workload] if workload else ["--app", str(app_ref)]

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with LocalCluster(workers, token=token, args=args, log_dir="compass-logs") as cluster:
            for worker in cluster.workers:
                typer.echo(f"{worker.name} {worker.address}")
            typer.echo(f"token {cluster.token}   logs compass-logs/   Ctrl-C stops the cluster")
            await stop.wait()
            typer.echo("stopping workers...")

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    except CompassError as exc:
        _fail(str(exc))
    finally:
        loop.close()


@app.command()
def status(
    address: Annotated[str, typer.Argument(help="HOST:PORT of a worker.")],
    token: Token = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 5.0,
) -> None:
    """Print one worker's status."""
    from compass.client import Client

    async def get() -> dict[str, Any]:
        timeouts = Timeouts(connect=timeout, handshake=timeout, request=timeout)
        async with Client(address, token=token, timeouts=timeouts) as client:
            return await client.status()

    try:
        info = asyncio.run(get())
    except CompassError as exc:
        _fail(f"{address}: {exc}")
    if as_json:
        typer.echo(json.dumps(info, indent=2, sort_keys=True))
        return
    peers = ", ".join(f"{p['name']}@{p['address']}" for p in info["peers"]) or "none"
    queue = info.get("queue", {})
    cache = info.get("cache", {})
    typer.echo(
        f"{info['name']} at {info['address']}  compass {info['version']}  "
        f"up {info['uptime_s']:.1f} s  policy {info.get('policy')}\n"
        f"peers: {peers}\n"
        f"queue: {queue.get('ready', 0)} ready, {queue.get('running', 0)} running, "
        f"wait {queue.get('wait_ms', 0):.1f} ms; host lanes: {queue.get('host_ready', 0)} "
        f"ready, {queue.get('host_running', 0)} running of {queue.get('host_lanes', 0)}\n"
        f"cache: {sorted(cache.get('resident', []))} "
        f"free {cache.get('free_bytes', 0) / 1e9:.2f} GB "
        f"of {cache.get('capacity_bytes', 0) / 1e9:.2f} GB"
    )
    if info.get("cluster"):
        typer.echo("view (what this worker plans on):")
        for row in info["cluster"]:
            typer.echo(
                f"  {row['name']}: wait {row['wait_ms']:.1f} ms, models {row['models']}, "
                f"age {row['age_ms']:.1f} ms, placements counted {row['placements_counted']}"
            )


@app.command()
def submit(
    address: Annotated[str, typer.Argument(help="HOST:PORT of any worker (the ingress).")],
    workflow: Annotated[str, typer.Argument(help="Workflow name.")],
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="NAME=VALUE (VALUE parsed as JSON if it can be)."),
    ] = None,
    token: Token = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result.")] = 60.0,
) -> None:
    """Run one job and print its result."""
    from compass.client import Client

    kwargs: dict[str, Any] = {}
    for item in inputs or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--input {item!r}: expected NAME=VALUE", 2)
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value

    async def run() -> Any:
        async with Client(address, token=token) as client:
            return await client.submit(workflow, timeout=timeout, **kwargs)

    try:
        result = asyncio.run(run())
    except CompassError as exc:
        _fail(str(exc))
    typer.echo(_show(result))


def _show(value: Any) -> str:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _default_workload() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "bench", "workloads", "paper.json")


JsonPath = Annotated[str | None, typer.Option("--json", help="Write results as JSON here.")]
Quick = Annotated[bool, typer.Option("--quick", help="A shorter run.")]


@bench_app.command("wire")
def bench_wire(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Wire protocol against a raw uvloop Protocol: round trip, pipelined, bulk."""
    from bench import wire

    wire.run(quick=quick, json_path=json_path)


@bench_app.command("cache")
def bench_cache(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Slab allocation and eviction decision cost with 100 models resident."""
    from bench import cache

    cache.run(quick=quick, json_path=json_path)


@bench_app.command("plan")
def bench_plan(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Microseconds to plan one job of each paper workflow over 5 to 240 workers."""
    from bench import plan

    plan.run(quick=quick, json_path=json_path)


@bench_app.command("job")
def bench_job(
    jobs: Annotated[int, typer.Option(help="Jobs to time.")] = 2000, json_path: JsonPath = None
) -> None:
    """A one-task no-op job, client to worker and back: p50/p99 microseconds."""
    from bench import job

    job.run(jobs=jobs, json_path=json_path)


@bench_app.command("chain")
def bench_chain(
    workers: Annotated[int, typer.Option(help="Worker processes the chain alternates over.")] = 2,
    tasks: Annotated[int, typer.Option(help="Chain length: 10, 100 or 1000.")] = 1000,
    repeats: Annotated[int, typer.Option(help="Runs of each side; the best is reported.")] = 3,
    dask: Annotated[bool, typer.Option(help="Also run the chain on Dask distributed.")] = True,
    json_path: JsonPath = None,
) -> None:
    """A chain of tiny tasks alternating between workers, compass against Dask distributed."""
    from bench import chain

    chain.run(tasks=tasks, workers=workers, repeats=repeats, json_path=json_path, with_dask=dask)


Policies = Annotated[
    str, typer.Option(help="Comma-separated policies: compass, jsq, heft, hash, random, ...")
]
Arrival = Annotated[str, typer.Option(help="uniform, poisson or gamma.")]
HostLanes = Annotated[
    int, typer.Option(help="Host lanes per worker for model-less tasks (0: they use the GPU).")
]


def _names(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _sweep(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    lo, sep, hi = text.partition("..")
    try:
        low, high = int(lo), int(hi)
    except ValueError:
        low = high = 0
    if not sep or not 1 <= low <= high:
        _fail(f"--servers-sweep {text!r}: expected LO..HI with 1 <= LO <= HI", 2)
    return low, high


@bench_app.command("e2e")
def bench_e2e(
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON.")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 5,
    policies: Policies = "compass,jsq,heft,hash",
    arrival: Arrival = "poisson",
    cv: Annotated[float, typer.Option(help="Gamma arrivals: std / mean of inter-arrivals.")] = 1.0,
    load: Annotated[float, typer.Option(help="Multiplies the spec's arrival rate.")] = 1.0,
    jobs: Annotated[int, typer.Option(help="Jobs per policy.")] = 200,
    seed: Annotated[int, typer.Option(help="Arrival sequence seed.")] = 0,
    time_scale: Annotated[float, typer.Option(help="Real seconds per spec second.")] = 0.25,
    heartbeat_ms: Annotated[float, typer.Option(help="Worker heartbeat interval.")] = 10.0,
    heartbeat_min_ms: Annotated[
        float, typer.Option(help="Least gap between a worker's heartbeats.")
    ] = 1.0,
    host_lanes: HostLanes = 0,
    servers_sweep: Annotated[str | None, typer.Option(help="LO..HI: servers needed.")] = None,
    target_slowdown: Annotated[float, typer.Option(help="For --servers-sweep.")] = 2.0,
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here.")] = None,
) -> None:
    """The paper's workload on a real local cluster: every policy on the same arrivals."""
    from bench import e2e

    try:
        config = e2e.E2EConfig(
            workload=workload or e2e.DEFAULT_WORKLOAD,
            workers=workers,
            policies=tuple(_names(policies)),
            arrival=arrival,
            cv=cv,
            load=load,
            jobs=jobs,
            seed=seed,
            time_scale=time_scale,
            heartbeat_ms=heartbeat_ms,
            heartbeat_min_ms=heartbeat_min_ms,
            host_lanes=host_lanes,
        )
        e2e.run(
            config,
            json_path=json_path,
            plot_path=plot,
            servers_sweep=_sweep(servers_sweep),
            target_slowdown=target_slowdown,
        )
    except CompassError as exc:
        _fail(str(exc), 2)


@app.command()
def sim(
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON.")] = None,
    workers: Annotated[int, typer.Option(help="Simulated workers (up to hundreds).")] = 5,
    policies: Policies = "compass,jsq,heft,hash",
    arrival: Arrival = "poisson",
    cv: Annotated[float, typer.Option(help="Gamma arrivals: std / mean of inter-arrivals.")] = 1.0,
    load: Annotated[float, typer.Option(help="Multiplies the spec's arrival rate.")] = 1.0,
    jobs: Annotated[int, typer.Option(help="Jobs per policy.")] = 1000,
    seed: Annotated[int, typer.Option(help="Arrival sequence seed.")] = 0,
    heartbeat_ms: Annotated[
        float, typer.Option(help="How often peers' state reaches the views (virtual ms).")
    ] = 10.0,
    staleness_ms: Annotated[
        float | None, typer.Option(help="Age of the peer state planners see.")
    ] = None,
    host_lanes: HostLanes = 0,
    servers_sweep: Annotated[str | None, typer.Option(help="LO..HI: servers needed.")] = None,
    target_slowdown: Annotated[float, typer.Option(help="For --servers-sweep.")] = 2.0,
    compare_real: Annotated[
        bool, typer.Option(help="Also run the same config on a real cluster and compare.")
    ] = False,
    time_scale: Annotated[float, typer.Option(help="--compare-real: real s per spec s.")] = 0.25,
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here.")] = None,
) -> None:
    """Discrete-event simulation of the same planner and cache code in virtual time."""
    from compass.sim import report

    try:
        if compare_real:
            from bench import e2e, fidelity

            config = e2e.E2EConfig(
                workload=workload or _default_workload(),
                workers=workers,
                policies=tuple(_names(policies)),
                arrival=arrival,
                cv=cv,
                load=load,
                jobs=jobs,
                seed=seed,
                time_scale=time_scale,
                host_lanes=host_lanes,
            )
            fidelity.run(config, json_path)
            return
        report.run_cli(
            workload or _default_workload(),
            workers,
            _names(policies),
            arrival,
            cv,
            load,
            jobs,
            seed,
            heartbeat_ms,
            staleness_ms,
            _sweep(servers_sweep),
            target_slowdown,
            json_path,
            plot,
            host_lanes,
        )
    except CompassError as exc:
        _fail(str(exc), 2)


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(help="About how long the whole demo runs.")] = 60.0,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 5,
) -> None:
    """Start a local cluster and race compass against hash and jsq on the paper's workload."""
    from bench import demo as demo_module

    try:
        demo_module.run(seconds=seconds, workers=workers)
    except CompassError as exc:
        _fail(str(exc))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
