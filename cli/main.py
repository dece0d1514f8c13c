"""The ``compass`` command line: flags and environment in, library calls out. No logic here.

Every mistake a user can make on the command line (a bad flag value, a missing or broken
workload file, an unknown policy) ends as one line on stderr and a non-zero exit: :func:`main`
maps usage errors, :class:`CompassError` and ``OSError`` to that line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

import compass
from compass.config import (
    DEFAULT_PORT,
    GPU_CACHE_FRACTION,
    HOST_CACHE_FRACTION,
    CacheConfig,
    Limits,
    SchedConfig,
    SwimConfig,
    Timeouts,
    TLSConfig,
    WorkerConfig,
)
from compass.errors import CompassError, ConfigError, WorkflowError

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
workload_app = typer.Typer(help="Workload spec files.", no_args_is_help=True)
app.add_typer(workload_app, name="workload")

MiB = 1 << 20
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"

Token = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="COMPASS_TOKEN", help="Shared cluster token (or COMPASS_TOKEN)."
    ),
]
TlsCert = Annotated[
    str | None,
    typer.Option(
        "--tls-cert",
        envvar="COMPASS_TLS_CERT",
        help="Mutual TLS: this side's certificate, PEM (with --tls-key and --tls-ca).",
        show_default=False,
    ),
]
TlsKey = Annotated[
    str | None,
    typer.Option(
        "--tls-key",
        envvar="COMPASS_TLS_KEY",
        help="Mutual TLS: the private key of --tls-cert, PEM.",
        show_default=False,
    ),
]
TlsCa = Annotated[
    str | None,
    typer.Option(
        "--tls-ca",
        envvar="COMPASS_TLS_CA",
        help="Mutual TLS: the cluster CA, PEM; only certificates it signed are trusted.",
        show_default=False,
    ),
]


def _tls(cert: str | None, key: str | None, ca: str | None) -> TLSConfig | None:
    """The three --tls-* flags as one TLSConfig: all or none."""
    given = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
    if not any(given.values()):
        return None
    missing = [flag for flag, value in given.items() if not value]
    if missing or cert is None or key is None or ca is None:
        raise ConfigError(
            f"mutual TLS needs --tls-cert, --tls-key and --tls-ca together; missing "
            f"{', '.join(missing)}"
        )
    return TLSConfig(cert=cert, key=key, ca=ca)


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


class OnMiss(StrEnum):
    drop = "drop"
    finish = "finish"


class Shed(StrEnum):
    on = "on"
    off = "off"
    both = "both"


class Batching(StrEnum):
    on = "on"
    off = "off"


class BatchGain(StrEnum):
    """The curves of :data:`compass.workflow.batching.BATCH_GAINS` (a test pins them equal)."""

    none = "none"
    mild = "mild"
    strong = "strong"


def _loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"compass: {_one_line(message)}", err=True)
    raise typer.Exit(code)


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _logging(level: LogLevel, log_format: LogFormat = LogFormat.text) -> None:
    if log_format == LogFormat.json:
        from compass.worker.metrics import JsonLogFormatter

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLogFormatter())
        logging.basicConfig(level=level.value.upper(), handlers=[handler])
        logging.captureWarnings(True)  # a warning printed raw would break a JSON log pipeline
        return
    logging.basicConfig(
        level=level.value.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"compass {compass.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_version
        ),
    ] = False,
) -> None:
    """Decentralized scheduling of ML workflows across GPU workers."""


def _env(name: str) -> str:
    return "COMPASS_" + name.upper()


CACHE_DEFAULT = (
    f"default: {GPU_CACHE_FRACTION:.0%} of free GPU memory, or {HOST_CACHE_FRACTION:.0%} of "
    "host memory; with --workload, its GPU memory"
)


@worker_app.command("start")
def worker_start(
    host: Annotated[
        str, typer.Option(envvar=_env("host"), help="Address to bind (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(envvar=_env("port"), min=0, max=65535, help="Port to bind; 0: a free one."),
    ] = DEFAULT_PORT,
    token: Token = None,
    allow_weak_token: Annotated[
        bool,
        typer.Option(
            envvar=_env("allow_weak_token"),
            help="Accept a token under 128 bits of estimated entropy, or none on a non-loopback "
            "address (a trusted network only).",
        ),
    ] = False,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    join: Annotated[
        list[str] | None,
        typer.Option(
            "--join",
            envvar=_env("join"),
            help="HOST:PORT of a cluster member (repeatable; in the variable, space-separated).",
        ),
    ] = None,
    join_timeout: Annotated[
        float,
        typer.Option(
            envvar=_env("join_timeout"),
            min=0.001,
            help="Seconds to keep retrying --join before exiting with an error.",
        ),
    ] = 60.0,
    drain_timeout: Annotated[
        float,
        typer.Option(
            envvar=_env("drain_timeout"),
            min=0.0,
            help="Seconds a worker drains on SIGTERM or Ctrl-C (no new work; it finishes what "
            "it holds, then leaves); 0 stops at once. A second signal stops at once.",
        ),
    ] = 25.0,
    advertise_address: Annotated[
        str,
        typer.Option(
            envvar=_env("advertise_address"),
            help="HOST[:PORT] peers reach this worker at (NAT, or --host 0.0.0.0); "
            "default: the bound address, or this host's primary address for 0.0.0.0.",
        ),
    ] = "",
    name: Annotated[
        str, typer.Option(envvar=_env("name"), help="Unique worker name (default: <host>-<port>).")
    ] = "",
    app_ref: Annotated[
        str | None,
        typer.Option(
            "--app", envvar=_env("app"), help="Python module (or module:attr) with a compass.App."
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            envvar=_env("workload"), help="Workload spec JSON: run its workflows emulated."
        ),
    ] = None,
    policy: Annotated[
        str, typer.Option(envvar=_env("policy"), help="Placement policy (same on every worker).")
    ] = "compass",
    lanes: Annotated[
        int, typer.Option(envvar=_env("lanes"), min=1, help="Execution lanes (tasks run at once).")
    ] = 1,
    host_lanes: Annotated[
        int,
        typer.Option(
            envvar=_env("host_lanes"),
            min=0,
            help="Lanes for model-less tasks, off the GPU (0: they share it).",
        ),
    ] = 1,
    time_scale: Annotated[
        float, typer.Option(envvar=_env("time_scale"), help="Emulated time multiplier.")
    ] = 1.0,
    cache_mb: Annotated[
        int | None,
        typer.Option(
            envvar=_env("cache_mb"),
            min=1,
            help=f"Model cache capacity in MiB ({CACHE_DEFAULT}).",
            show_default=False,
        ),
    ] = None,
    slab_mb: Annotated[
        int, typer.Option(envvar=_env("slab_mb"), min=1, help="Slab size in MiB.")
    ] = 64,
    backend: Annotated[
        str, typer.Option(envvar=_env("backend"), help="auto, cupy, host, strict or capacity.")
    ] = "auto",
    device: Annotated[
        int,
        typer.Option(
            envvar=_env("device"), min=0, help="CUDA device of the model cache (cupy backend)."
        ),
    ] = 0,
    heartbeat_ms: Annotated[
        float,
        typer.Option(envvar=_env("heartbeat_ms"), help="Heartbeat interval when nothing changes."),
    ] = 10.0,
    heartbeat_min_ms: Annotated[
        float,
        typer.Option(
            envvar=_env("heartbeat_min_ms"),
            help="Least gap between heartbeats; changes go out after it.",
        ),
    ] = 1.0,
    heartbeat_max_rate: Annotated[
        float,
        typer.Option(
            envvar=_env("heartbeat_max_rate"),
            help="Most heartbeat messages a second, over all peers.",
        ),
    ] = 20000.0,
    peer_timeout_ms: Annotated[
        float,
        typer.Option(
            envvar=_env("peer_timeout_ms"),
            help="A suspected peer that does not refute is dropped at most this long after.",
        ),
    ] = 2000.0,
    probe_period_ms: Annotated[
        float,
        typer.Option(
            envvar=_env("probe_period_ms"), help="Failure detection: probe one peer this often."
        ),
    ] = 200.0,
    probe_timeout_ms: Annotated[
        float,
        typer.Option(
            envvar=_env("probe_timeout_ms"),
            help="A probe not acked within this goes through --indirect-probes others.",
        ),
    ] = 100.0,
    indirect_probes: Annotated[
        int,
        typer.Option(
            envvar=_env("indirect_probes"),
            help="Peers asked to probe one that did not ack, before it is suspected.",
        ),
    ] = 3,
    suspicion_mult: Annotated[
        float,
        typer.Option(
            envvar=_env("suspicion_mult"),
            help="A confirmed suspicion lasts this many periods (x log10 of the workers).",
        ),
    ] = 3.0,
    adjust_threshold: Annotated[
        float,
        typer.Option(envvar=_env("adjust_threshold"), help="Dynamic adjustment threshold."),
    ] = 0.1,
    warm: Annotated[
        bool,
        typer.Option(envvar=_env("warm"), help="Idle workers load models the cluster is short of."),
    ] = True,
    max_frame_mb: Annotated[
        int, typer.Option(envvar=_env("max_frame_mb"), min=1, help="Largest frame accepted, MiB.")
    ] = 1024,
    max_jobs: Annotated[
        int,
        typer.Option(
            envvar=_env("max_jobs"),
            min=1,
            help="Jobs in flight accepted as ingress; more are refused.",
        ),
    ] = 10000,
    max_job_mb: Annotated[
        float,
        typer.Option(
            envvar=_env("max_job_mb"),
            min=0.001,
            help="MiB of job inputs held as ingress: a job over it alone is refused "
            "(JobTooLarge), more jobs than fit together are refused for now (Overloaded).",
        ),
    ] = 4096.0,
    task_timeout: Annotated[
        float,
        typer.Option(
            envvar=_env("task_timeout"),
            min=0.001,
            help="Seconds a task may run unless it declares timeout_ms; past it its job fails.",
        ),
    ] = 300.0,
    max_stuck_tasks: Annotated[
        int,
        typer.Option(
            envvar=_env("max_stuck_tasks"),
            min=1,
            help="Timed-out task threads still running past which the worker takes no GPU work.",
        ),
    ] = 4,
    log_level: Annotated[
        LogLevel,
        typer.Option(envvar=_env("log_level"), case_sensitive=False, help="Logging on stderr."),
    ] = LogLevel.warning,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar=_env("log_format"),
            case_sensitive=False,
            help="text, or json: one JSON object per line (time, level, logger, message, ...).",
        ),
    ] = LogFormat.text,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar=_env("metrics_port"),
            min=0,
            max=65535,
            help="Serve Prometheus /metrics and /ready on this port (0: a free one; default: off).",
            show_default=False,
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(envvar=_env("metrics_host"), help="Address the metrics port binds.")
    ] = "127.0.0.1",
    trace_sample: Annotated[
        float,
        typer.Option(
            envvar=_env("trace_sample"),
            min=0.0,
            max=1.0,
            help="Fraction of the jobs submitted here that are traced (a client's trace=True "
            "always is); their traces are kept for `compass status --trace JOB`.",
        ),
    ] = 0.01,
    trace_keep: Annotated[
        int,
        typer.Option(envvar=_env("trace_keep"), min=0, help="Traces of recent jobs kept here."),
    ] = 512,
    otel_endpoint: Annotated[
        str | None,
        typer.Option(
            envvar=_env("otel_endpoint"),
            help="Export traced jobs' spans by OTLP/HTTP to this URL, e.g. "
            "http://collector:4318/v1/traces (needs compass[otel]).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Start a worker; prints 'compass worker listening on HOST:PORT' first.

    Every option also reads a COMPASS_* environment variable (shown with each); a flag wins.
    """
    from compass.security import check_token
    from compass.worker.process import run_worker

    if token is not None:
        check_token(token, allow_weak=allow_weak_token)
    elif not allow_weak_token and not _loopback(host):
        # no token at all: anyone who reaches the address could run jobs and join as a peer
        _fail(
            f"a worker bound to {host} needs a cluster token (--token or COMPASS_TOKEN; "
            "`compass token` makes one), or --allow-weak-token on a trusted network",
            2,
        )
    _logging(log_level, log_format)
    cache = CacheConfig(
        capacity_bytes=None if cache_mb is None else cache_mb * MiB,
        slab_bytes=slab_mb * MiB,
        backend=backend,
        device=device,
    )
    config = WorkerConfig(
        host=host,
        port=port,
        name=name,
        token=token,
        tls=_tls(tls_cert, tls_key, tls_ca),
        join=tuple(join or ()),
        join_timeout_s=join_timeout,
        drain_timeout_s=drain_timeout,
        advertise_address=advertise_address,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        trace_sample=trace_sample,
        trace_keep=trace_keep,
        otel_endpoint=otel_endpoint,
        app=app_ref,
        workload=workload,
        lanes=lanes,
        host_lanes=host_lanes,
        time_scale=time_scale,
        max_jobs=max_jobs,
        max_job_bytes=int(max_job_mb * MiB),
        task_timeout_s=task_timeout,
        max_stuck_tasks=max_stuck_tasks,
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
        swim=SwimConfig(
            probe_period_ms=probe_period_ms,
            probe_timeout_ms=probe_timeout_ms,
            indirect_probes=indirect_probes,
            suspicion_mult=suspicion_mult,
        ),
    )
    raise typer.Exit(run_worker(config))


#: chosen by `compass up` for each worker; the rest of `worker start`'s options pass through
UP_OWNS = ("--host", "--port", "--name", "--join")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def up(
    ctx: typer.Context,
    workers: Annotated[int, typer.Option(min=1, help="How many workers.")] = 3,
    token: Token = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    workload: Annotated[str | None, typer.Option(help="Workload spec JSON (emulated).")] = None,
    app_ref: Annotated[
        str | None, typer.Option("--app", help="App module for every worker.")
    ] = None,
    policy: Annotated[str, typer.Option(help="Placement policy.")] = "compass",
    log_dir: Annotated[
        Path, typer.Option(help="Folder for the workers' logs (w0.log, w1.log, ...).")
    ] = Path("compass-logs"),
    gpus: Annotated[
        str | None,
        typer.Option(
            help="CUDA devices, e.g. 0,1,2,3: worker i gets --device of the i-th (in turn); "
            "workers start one after another."
        ),
    ] = None,
) -> None:
    """Start a local cluster of joined workers on loopback; Ctrl-C stops them all.

    Any other option is passed to every `compass worker start` (see its --help), e.g.
    `compass up --app my_app --cache-mb 4096 --lanes 2 --log-level info`. The workers listen on
    free ports chosen by the system; `compass worker start --port N` runs one on a fixed port.
    With neither --app nor --workload, the workers emulate the paper's workload. Workers on one
    GPU share it: each takes 80% of what is free when it starts, so give them --cache-mb.
    """
    from compass.cluster import LocalCluster
    from compass.wire.transport import new_event_loop

    extra = list(ctx.args)
    _check_worker_args(extra)
    tls = _tls(tls_cert, tls_key, tls_ca)
    if workload is not None and app_ref is not None:
        _fail("give --workload or --app, not both", 2)
    if workload is None and app_ref is None:
        workload = _default_workload()
    _check_policies([policy])
    if workload is not None:
        _check_workload(workload)
        source = ["--workload", str(Path(workload).resolve())]
    else:
        source = ["--app", str(app_ref)]
    args = ["--policy", policy, *source, *extra]
    logs = log_dir.resolve()
    devices = None if gpus is None else _gpus(gpus, extra)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        cluster = LocalCluster(workers, token=token, args=args, log_dir=logs, tls=tls)
        async with cluster if devices is None else _on_devices(cluster, devices):
            for worker in cluster.workers:
                typer.echo(f"{worker.name} {worker.address}")
            if token is None:
                typer.echo(f"token {cluster.token} (generated; set COMPASS_TOKEN to choose one)")
            typer.echo(f"logs in {logs}{os.sep} (w0.log ... w{workers - 1}.log)")
            typer.echo(
                f"ready: {workers} workers on free ports chosen by the system "
                "(`compass worker start --port N` for a fixed one); Ctrl-C stops them"
            )
            await stop.wait()
            typer.echo("stopping workers...")

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def _gpus(text: str, extra: list[str]) -> list[int]:
    """``--gpus 0,1,...`` as device numbers; refused beside a --device for every worker."""
    if any(arg.split("=", 1)[0] == "--device" for arg in extra):
        _fail("give --gpus (a device per worker) or --device (one for all), not both", 2)
    try:
        devices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        devices = []
    if not devices or min(devices) < 0:
        _fail(f"--gpus {text!r}: expected comma-separated device numbers, e.g. 0,1,2,3", 2)
    return devices


@contextlib.asynccontextmanager
async def _on_devices(cluster: Any, devices: list[int]) -> AsyncIterator[Any]:
    """Start ``cluster``'s workers one after another, worker i on ``devices[i % n]`` (so each
    sees the memory its predecessors on the same device left), and stop them on the way out."""
    try:
        first = await cluster.spawn("w0", extra=["--device", str(devices[0])])
        for i in range(1, cluster.size):
            device = ["--device", str(devices[i % len(devices)])]
            await cluster.spawn(f"w{i}", join=first.address, extra=device)
        await cluster.wait_joined()
        yield cluster
    finally:
        await cluster.aclose()


def _check_worker_args(args: list[str]) -> None:
    """Refuse what `compass up` chooses itself, and check the rest as `worker start` would."""
    for arg in args:
        if arg.split("=", 1)[0] in UP_OWNS:
            _fail(
                f"compass up chooses {arg.split('=', 1)[0]} for its workers; "
                "start a worker with `compass worker start` to choose it",
                2,
            )
    command = typer.main.get_command(app)
    start = command.commands["worker"].commands["start"]  # type: ignore[attr-defined]
    try:
        start.make_context("compass worker start", list(args))
    except typer.TyperException as exc:
        message = _usage_error(exc, args)
        _fail(f"{message}; passed to every worker (see compass worker start --help)", 2)


@app.command()
def status(
    address: Annotated[str, typer.Argument(help="HOST:PORT of a worker.")] = DEFAULT_ADDRESS,
    token: Token = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 5.0,
    trace: Annotated[
        str | None,
        typer.Option(
            "--trace",
            metavar="JOB",
            help="Print the trace this worker kept of job JOB (it was the job's ingress).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print one worker's status, or with --trace a job's trace."""
    from compass.client import Client

    tls = _tls(tls_cert, tls_key, tls_ca)

    async def get() -> Any:
        timeouts = Timeouts(connect=timeout, handshake=timeout, request=timeout)
        async with Client(address, token=token, timeouts=timeouts, tls=tls) as client:
            return await client.status() if trace is None else await client.trace(trace)

    try:
        info = asyncio.run(get())
    except CompassError as exc:
        _fail(f"{address}: {exc}", 2 if isinstance(exc, ConfigError) else 1)
    if trace is not None:
        from compass._cli.traces import trace_lines

        if as_json:
            typer.echo(json.dumps(info.to_json(), indent=2))
        else:
            typer.echo("\n".join(trace_lines(info)))
        return
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
        f"cache ({cache.get('backend', '?')} on {cache.get('device', '?')}): "
        f"{sorted(cache.get('resident', []))} "
        f"free {cache.get('free_bytes', 0) / 1e9:.2f} GB "
        f"of {cache.get('capacity_bytes', 0) / 1e9:.2f} GB, "
        f"{cache.get('staged_bytes', 0) / 1e9:.2f} GB of weights staged on the host"
    )
    if cache.get("fallback"):
        typer.echo(f"cache fallback: {cache['fallback']}")
    if info.get("cluster"):
        typer.echo("view (what this worker plans on):")
        for row in info["cluster"]:
            typer.echo(
                f"  {row['name']}: wait {row['wait_ms']:.1f} ms, models {row['models']}, "
                f"age {row['age_ms']:.1f} ms, placements counted {row['placements_counted']}"
            )
    traces = info.get("traces")
    if traces:
        typer.echo(
            f"traces: {traces['traced']} jobs traced here (sampling {traces['sample']:.2%}), "
            f"{traces['kept']} kept; `compass status --trace JOB` prints one"
        )
        for brief in traces["recent"]:
            state = "ok" if brief["ok"] else "failed"
            typer.echo(
                f"  {brief['job']} ({brief['workflow']}): {brief['latency_ms']:.1f} ms, "
                f"{brief['tasks']} tasks, {state}"
            )


@app.command()
def submit(
    target: Annotated[
        list[str],
        typer.Argument(
            metavar="[HOST:PORT] WORKFLOW",
            help=f"The workflow to run, at any worker (the ingress; default {DEFAULT_ADDRESS}).",
            show_default=False,
        ),
    ],
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="NAME=VALUE (VALUE parsed as JSON if it can be)."),
    ] = None,
    token: Token = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result.")] = 60.0,
    deadline_ms: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Answer within this many ms, or not at all: refused at once when no plan "
            "can (DeadlineUnreachable), dropped when it falls too late (DeadlineExceeded).",
        ),
    ] = None,
    priority: Annotated[
        int, typer.Option(min=0, max=9, help="0-9; a higher priority's tasks run first.")
    ] = 0,
    on_miss: Annotated[
        OnMiss, typer.Option(help="finish: run the job to the end even past its deadline.")
    ] = OnMiss.drop,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace", help="Trace the job and print its trace as a table after the result."
        ),
    ] = False,
    trace_json: Annotated[
        str | None,
        typer.Option(
            "--trace-json",
            metavar="PATH",
            help="Trace the job and write its trace here as JSON.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run one job and print its result."""
    from compass.client import Client

    tls = _tls(tls_cert, tls_key, tls_ca)

    if len(target) > 2:
        _fail(f"expected [HOST:PORT] WORKFLOW, got {' '.join(target)!r}", 2)
    address, workflow = (DEFAULT_ADDRESS, target[0]) if len(target) == 1 else target
    kwargs: dict[str, Any] = {}
    for item in inputs or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--input {item!r}: expected NAME=VALUE", 2)
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value

    traced = trace or trace_json is not None
    _check_output(trace_json, "--trace-json")

    async def run() -> Any:
        async with Client(address, token=token, tls=tls) as client:
            return await client.submit_job(
                workflow, timeout=timeout, deadline_ms=deadline_ms, priority=priority,
                on_miss=on_miss.value, trace=traced, **kwargs,
            )  # fmt: skip

    try:
        result = asyncio.run(run())
    except CompassError as exc:
        _fail(f"{address}: {exc}", 2 if isinstance(exc, ConfigError) else 1)
    typer.echo(_show(result.value))
    if not traced:
        return
    job_trace = result.trace
    if job_trace is None:
        _fail(f"{address} answered job {result.job_id} without its trace (an older worker?)")
    if trace_json is not None:
        Path(trace_json).write_text(json.dumps(job_trace.to_json(), indent=2) + "\n")
    if trace:  # on stderr: stdout stays the result alone, for scripts
        from compass._cli.traces import trace_lines

        typer.echo("\n".join(trace_lines(job_trace)), err=True)


@app.command("token")
def new_token() -> None:
    """Print a new random cluster token (256 bits, hex): `export COMPASS_TOKEN=$(compass token)`."""
    from compass.security import new_token as make_token

    typer.echo(make_token())


def _show(value: Any) -> str:
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _default_workload() -> str:
    from compass._bench.e2e import DEFAULT_WORKLOAD

    return str(DEFAULT_WORKLOAD)


def _check_workload(path: str) -> None:
    """Read ``path`` as a workload now, so a bad file fails before anything starts."""
    from compass.workflow.spec import load_workload

    load_workload(path)


def _check_policies(names: Sequence[str]) -> None:
    from compass.sched import POLICY_NAMES

    if not names:
        raise ConfigError("no policy given")
    for name in names:
        if name not in POLICY_NAMES:
            raise ConfigError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")


def _check_output(path: str | None, flag: str) -> None:
    """Fail now, not after a long run, if ``path`` cannot be written."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        _fail(f"{flag} {path}: is a folder, expected a file path", 2)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"{flag} {path}: cannot create its folder: {exc.strerror}", 2)
    if not os.access(target.parent, os.W_OK):
        _fail(f"{flag} {path}: folder {str(target.parent)!r} is not writable", 2)


def _check_plot(path: str | None, flag: str = "--plot") -> None:
    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        _fail(f"{flag} {path}: needs matplotlib: pip install 'compass[bench]'", 2)
    _check_output(path, flag)


JsonPath = Annotated[str | None, typer.Option("--json", help="Write results as JSON here.")]
Quick = Annotated[bool, typer.Option("--quick", help="A shorter run.")]


@bench_app.command("wire")
def bench_wire(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Wire protocol against a raw uvloop Protocol: round trip, pipelined, bulk."""
    from compass._bench import wire

    _check_output(json_path, "--json")
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

    _check_output(json_path, "--json")
    fuzz.run(frames=frames, seed=seed, idle=idle, json_path=json_path)


@bench_app.command("cache")
def bench_cache(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Slab allocation and eviction decision cost with 100 models resident."""
    from compass._bench import cache

    _check_output(json_path, "--json")
    cache.run(quick=quick, json_path=json_path)


@bench_app.command("gpu")
def bench_gpu(
    quick: Annotated[bool, typer.Option("--quick", help="A 2 GiB prefetch, not 8.")] = False,
    json_path: JsonPath = None,
) -> None:
    """The first run on a GPU: arena, dtypes, the eviction race, load bandwidth, pinned memory,
    two workers on one device, pytest -m gpu. Without CUDA: one line, exit 0."""
    from compass._bench import gpu

    _check_output(json_path, "--json")
    if gpu.run(json_path=json_path, quick=quick).get("passed") is False:
        raise typer.Exit(1)


@bench_app.command("plan")
def bench_plan(quick: Quick = False, json_path: JsonPath = None) -> None:
    """Microseconds to plan one job of each paper workflow over 5 to 240 workers."""
    from compass._bench import plan

    _check_output(json_path, "--json")
    plan.run(quick=quick, json_path=json_path)


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
) -> None:
    """A one-task no-op job, client to worker and back: p50/p99 microseconds."""
    from compass._bench import job

    _check_output(json_path, "--json")
    job.run(jobs=jobs, json_path=json_path, trace=trace)


@bench_app.command("client")
def bench_client(
    rounds: Annotated[int, typer.Option(min=1, help="Large submissions per side.")] = 10,
    mib: Annotated[int, typer.Option(min=2, max=900, help="Large submission, MiB.")] = 128,
    json_path: JsonPath = None,
) -> None:
    """A small call's latency behind a 128 MiB submission: one connection against two."""
    from compass._bench import client

    _check_output(json_path, "--json")
    client.run(rounds=rounds, mib=mib, json_path=json_path)


@bench_app.command("restarts")
def bench_restarts(
    scenario: Annotated[
        list[str] | None,
        typer.Option(help="same_name, crash_loop, seed_restart, drain or rolling (repeatable)."),
    ] = None,
    worker_pythonpath: Annotated[
        str | None, typer.Option(help="Run the workers from this checkout (a before/after).")
    ] = None,
    json_path: JsonPath = None,
) -> None:
    """Restarts, crashes, drains and a rolling restart on a local cluster: jobs ok, hung,
    failed or run twice, and the time until every view is whole again."""
    from compass._bench import restarts

    names = scenario or list(restarts.SCENARIOS)
    unknown = [n for n in names if n not in restarts.SCENARIOS]
    if unknown:
        _fail(f"--scenario {unknown[0]!r}: expected one of {', '.join(restarts.SCENARIOS)}", 2)
    _check_output(json_path, "--json")
    restarts.run(names, worker_pythonpath=worker_pythonpath, json_path=json_path)


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
        _fail(f"--tasks {tasks}: must be one of {', '.join(map(str, CHAIN_LENGTHS))}", 2)
    _check_output(json_path, "--json")
    chain.run(tasks=tasks, workers=workers, repeats=repeats, json_path=json_path, with_dask=dask)


Policies = Annotated[
    str, typer.Option(help="Comma-separated policies: compass, jsq, heft, hash, random, ...")
]
Arrival = Annotated[str, typer.Option(help="uniform, poisson or gamma.")]
HostLanes = Annotated[
    int,
    typer.Option(min=0, help="Host lanes per worker for model-less tasks (0: they use the GPU)."),
]
Workers = Annotated[int, typer.Option(min=1, help="Worker processes.")]
Jobs = Annotated[int, typer.Option(min=1, help="Jobs per policy.")]
Capacity = Annotated[
    bool,
    typer.Option(
        "--capacity", help="Search each policy's highest load multiple that meets each SLO."
    ),
]
SloFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--slo",
        help="--capacity: an SLO besides median2, p95x3, p99x5: pNNxS or medianS (repeatable).",
    ),
]
MaxLoad = Annotated[float, typer.Option(help="--capacity: the highest load multiple tried.")]
BatchingFlag = Annotated[
    Batching,
    typer.Option(
        "--batching",
        case_sensitive=False,
        help="Batched execution on every worker (off: every task runs one item at a time).",
    ),
]
BatchGainFlag = Annotated[
    BatchGain | None,
    typer.Option(
        "--batch-gain",
        case_sensitive=False,
        help="A batch curve for every model task whose spec declares none: none (a batch of b "
        "costs b runs), mild (each extra item +15% of a run), strong (+5%); default: only "
        "tasks whose spec declares a batch profile batch.",
        show_default=False,
    ),
]


def _batching(batching: Batching, gain: BatchGain | None) -> dict[str, Any]:
    """The two batching flags as the keywords the runners take."""
    return {"batching": batching == Batching.on, "batch_gain": None if gain is None else gain.value}


def _capacity_args(seeds: str, slo: list[str] | None, max_load: float) -> tuple[Any, Any]:
    """``--seeds``, ``--slo`` and ``--max-load`` checked: (seeds, SLOs: built-ins first)."""
    from compass.sim.capacity import BUILTIN_SLOS, parse_seeds, parse_slo

    if not 0 < max_load < float("inf"):
        _fail(f"--max-load {max_load}: must be a finite number > 0", 2)
    slos = list(BUILTIN_SLOS)
    for text in (t for value in slo or [] for t in _names(value)):
        extra = parse_slo(text)
        if extra.name not in {s.name for s in slos}:
            slos.append(extra)
    return parse_seeds(seeds), slos


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


_TIME_SCALE_HELP = (
    "Real seconds per spec second (default: 0.25, slower for workloads whose shortest "
    "workflow would take under 25 ms real)."
)


def _time_scale(given: float | None, spec: str) -> float:
    """``--time-scale``, or the one the workload needs (:func:`e2e.auto_time_scale`)."""
    if given is not None:
        return given
    from compass._bench import e2e
    from compass.workflow.spec import load_workload

    scale = e2e.auto_time_scale(load_workload(spec))
    if scale != e2e.DEFAULT_TIME_SCALE:
        print(f"time scale {scale:g}: the workload's shortest workflow needs it (--time-scale)")
    return float(scale)


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
    time_scale: Annotated[float | None, typer.Option(help=_TIME_SCALE_HELP)] = None,
    heartbeat_ms: Annotated[float, typer.Option(help="Worker heartbeat interval.")] = 10.0,
    heartbeat_min_ms: Annotated[
        float, typer.Option(help="Least gap between a worker's heartbeats.")
    ] = 1.0,
    host_lanes: HostLanes = 0,
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
) -> None:
    """The paper's workload on a real local cluster: every policy on the same arrivals."""
    from compass._bench import e2e

    names = _names(policies)
    _check_policies(names)
    if workload is not None:
        _check_workload(workload)
    sweep = _sweep(servers_sweep)
    _check_output(json_path, "--json")
    _check_plot(plot)
    _check_output(trace, "--trace")
    _check_plot(timeline, "--timeline")
    if capacity and (trace or timeline):
        _fail("--trace and --timeline record one run of each policy, not --capacity", 2)
    config = e2e.E2EConfig(
        workload=workload or e2e.DEFAULT_WORKLOAD,
        workers=workers,
        policies=tuple(names),
        arrival=arrival,
        cv=cv,
        load=load,
        jobs=jobs,
        seed=seed,
        time_scale=_time_scale(time_scale, workload or e2e.DEFAULT_WORKLOAD),
        heartbeat_ms=heartbeat_ms,
        heartbeat_min_ms=heartbeat_min_ms,
        host_lanes=host_lanes,
        deadline_x=deadline_x,
        priority_mix=priority_mix,
        **_batching(batching, batch_gain),
    )
    if capacity:
        if sweep:
            _fail("--capacity does not combine with --servers-sweep", 2)
        seed_list, slos = _capacity_args(seeds, slo, max_load)
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
        _check_workload(workload)
    sweep = _sweep(servers_sweep)
    _check_output(json_path, "--json")
    _check_plot(plot)
    try:
        load_list = [float(x) for x in _names(loads)]
    except ValueError:
        _fail(f"--loads {loads!r}: expected comma-separated numbers", 2)
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

    names = _names(policies) if policies is not None else None
    if names is not None:
        _check_policies(names)
    seed_list, slos = _capacity_args(seeds, slo, max_load)
    _check_output(json_path, "--json")
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
    _check_output(json_path, "--json")
    if json_path is not None:
        argv += ["--json", json_path]
    defaults.main(argv)


@bench_app.command("batching")
def bench_batching(
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

    names = _names(policies)
    _check_policies(names)
    spec = workload or _default_workload()
    _check_workload(spec)
    seed_list, slos = _capacity_args(seeds, slo, max_load)
    _check_output(json_path, "--json")
    batching.run(
        CapacitySearch(seeds=seed_list, slos=tuple(slos), max_load=max_load),
        workloads=workloads,
        curves=_names(curves),
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
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here (needs matplotlib).")] = None,
) -> None:
    """What the full mesh costs each worker as the cluster grows: CPU idle and under a light
    job stream, messages and bytes sent, connections, RSS, and the time to drop a killed
    worker and to spread a queue change, on real local clusters of each size."""
    from compass._bench import scale

    config = scale.ScaleConfig(workers=scale.parse_sizes(workers), seconds=seconds, probes=probes)
    _check_output(json_path, "--json")
    _check_plot(plot)
    scale.run(config, json_path=json_path, plot_path=plot)


@app.command()
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
    ] = 10.0,
    staleness_ms: Annotated[
        float | None, typer.Option(help="Age of the peer state planners see.")
    ] = None,
    host_lanes: HostLanes = 0,
    ingress: Annotated[
        str,
        typer.Option(
            help="Where jobs enter: client (client i at worker i), spread (dealt over every "
            "worker, as a load balancer would), auto (spread from 64 workers on)."
        ),
    ] = "auto",
    servers_sweep: Annotated[str | None, typer.Option(help="LO..HI: servers needed.")] = None,
    target_slowdown: Annotated[float, typer.Option(help="For --servers-sweep.")] = 2.0,
    compare_real: Annotated[
        bool, typer.Option(help="Also run the same config on a real cluster and compare.")
    ] = False,
    time_scale: Annotated[
        float | None, typer.Option(help=f"--compare-real: {_TIME_SCALE_HELP}")
    ] = None,
    json_path: JsonPath = None,
    plot: Annotated[str | None, typer.Option(help="Write a PNG here (needs matplotlib).")] = None,
    capacity: Capacity = False,
    seeds: Annotated[str, typer.Option(help="--capacity: arrival seeds, 0-4 or 0,1,2.")] = "0-4",
    slo: SloFlag = None,
    max_load: MaxLoad = 8.0,
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
) -> None:
    """Discrete-event simulation of the same planner and cache code in virtual time."""
    from compass._bench import sim_report
    from compass.sim.compare import SimConfig

    names = _names(policies)
    _check_policies(names)
    spec = workload or _default_workload()
    _check_workload(spec)
    if workers is None:
        from compass.workflow.spec import load_workload

        workers = load_workload(spec).cluster.workers
    sweep = _sweep(servers_sweep)
    _check_output(json_path, "--json")
    _check_plot(plot)
    if prefetch not in ("evict", "free"):
        _fail(f"--prefetch must be evict or free, got {prefetch!r}", 2)
    evicts = prefetch == "evict"
    batch = _batching(batching, batch_gain)
    if goodput:
        from compass._bench import goodput as goodput_bench
        from compass.sim.capacity import parse_seeds

        if capacity or compare_real or sweep:
            _fail(
                "--goodput does not combine with --capacity, --compare-real or --servers-sweep", 2
            )
        try:
            load_list = [float(x) for x in _names(loads)]
        except ValueError:
            _fail(f"--loads {loads!r}: expected comma-separated numbers", 2)
        if not load_list or not all(0 < x < float("inf") for x in load_list):
            _fail(f"--loads {loads!r}: every load must be a number > 0", 2)
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
        )
        goodput_bench.run_cli(grid, json_path, plot)
        return
    if capacity:
        from compass.sim.capacity import CapacitySearch

        if compare_real or sweep:
            _fail("--capacity does not combine with --compare-real or --servers-sweep", 2)
        seed_list, slos = _capacity_args(seeds, slo, max_load)
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
                **batch,
            ),
            CapacitySearch(seeds=seed_list, slos=tuple(slos), max_load=max_load),
            json_path,
            plot,
        )
        return
    if compare_real:
        from compass._bench import e2e, fidelity

        config = e2e.E2EConfig(
            workload=spec,
            workers=workers,
            policies=tuple(names),
            arrival=arrival,
            cv=cv,
            load=load,
            jobs=jobs,
            seed=seed,
            time_scale=_time_scale(time_scale, spec),
            host_lanes=host_lanes,
            **batch,
        )
        fidelity.run(config, json_path)
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
        **batch,
    )
    sim_report.run_cli(config, json_path, plot)


@workload_app.command("generate")
def workload_generate(
    seed: Annotated[int, typer.Option(help="Same seed, same workload.")] = 0,
    json_path: Annotated[
        str | None, typer.Option("--json", help="Write the spec here (default: stdout).")
    ] = None,
) -> None:
    """Draw a realistic workload spec (compass.workflow.generate) and print a summary line."""
    from compass.workflow.generate import generate_spec, summary_line
    from compass.workflow.spec import parse_workload

    _check_output(json_path, "--json")
    spec = generate_spec(seed)
    line = summary_line(parse_workload(spec, source=f"generated-{seed}"))
    text = json.dumps(spec, indent=2) + "\n"
    if json_path is None:
        typer.echo(text, nl=False)
        typer.echo(line, err=True)
        return
    Path(json_path).write_text(text, encoding="utf-8")
    typer.echo(f"{line}; written to {json_path}")


@app.command()
def demo(
    seconds: Annotated[
        float, typer.Option(min=1, help="About how long the whole demo runs.")
    ] = 60.0,
    workers: Workers = 5,
) -> None:
    """Start a local cluster and race compass against hash and jsq on the paper's workload."""
    from compass._bench import demo as demo_module

    demo_module.run(seconds=seconds, workers=workers)


def _usage_error(exc: typer.TyperException, argv: Sequence[str]) -> str:
    """One line: what is wrong, and the value given where the message lacks it."""
    message = _one_line(exc.format_message())
    given = _given_value(getattr(exc, "param", None), argv)
    if given is not None and f"'{given}'" not in message:
        message = f"{message} (got {given!r})"
    return message


def _given_value(param: Any, argv: Sequence[str]) -> str | None:
    """The value the user gave ``param``: from the command line, else from its variable."""
    opts = getattr(param, "opts", None) or []
    for index, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in opts:
            if eq:
                return value
            return argv[index + 1] if index + 1 < len(argv) else None
    envvar = getattr(param, "envvar", None)
    return os.environ.get(envvar) if isinstance(envvar, str) else None


def main(argv: Sequence[str] | None = None) -> None:
    """The ``compass`` script: exits with the command's code; a user's mistake is one line on
    stderr (exit 2), never a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=args, prog_name="compass", standalone_mode=False)
    except typer.TyperException as exc:  # usage: a bad flag, a bad value, a missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            # a group called bare: its help (typer has already printed it where rich is used)
            if exc.format_message().strip():
                typer.echo(exc.format_message(), err=True)
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "compass"
        typer.echo(f"{where}: {_usage_error(exc, args)}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("compass: aborted", err=True)
        sys.exit(1)
    except (ConfigError, WorkflowError) as exc:  # a bad value or file, found past parsing
        typer.echo(f"compass: {_one_line(str(exc))}", err=True)
        sys.exit(2)
    except CompassError as exc:
        typer.echo(f"compass: {_one_line(str(exc))}", err=True)
        sys.exit(1)
    except OSError as exc:  # a file named on the command line that cannot be read or written
        typer.echo(f"compass: {_one_line(str(exc))}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
