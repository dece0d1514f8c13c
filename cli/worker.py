"""``compass worker start`` (one worker, every option also a ``COMPASS_*`` variable) and
``compass up`` (a local cluster of them on loopback)."""

from __future__ import annotations

import asyncio
import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from compass.config import (
    DEFAULT_PORT,
    GPU_CACHE_FRACTION,
    HOST_CACHE_FRACTION,
    JOB_ENVELOPE_BYTES,
    CacheConfig,
    Limits,
    SchedConfig,
    SwimConfig,
    WorkerConfig,
    check_view,
)

from .checks import (
    check_policies,
    check_workload,
    default_workload,
    fail,
    is_loopback,
    tls_config,
    usage_error,
)
from .options import TlsCa, TlsCert, TlsKey, Token
from .running import configure_logging, hold_cluster

if TYPE_CHECKING:
    from compass.elastic.replicate import ReplicaConfig
    from compass.elastic.table import Capacity

worker_app = typer.Typer(help="Run a worker.", no_args_is_help=True)
#: the commands of this module that sit at the top level: ``compass up``
commands = typer.Typer()

MiB = 1 << 20

#: every flag's default is read from here, the one source (but ``--port``: a worker started
#: from the command line listens on the well-known port, one made in Python on a free port)
WORKER = WorkerConfig()

CACHE_DEFAULT = (
    f"default: {GPU_CACHE_FRACTION:.0%} of free GPU memory, or {HOST_CACHE_FRACTION:.0%} of "
    "host memory; with --workload, its GPU memory"
)


def env(name: str) -> str:
    """The variable a worker option also reads: ``lanes`` -> ``COMPASS_LANES``."""
    return "COMPASS_" + name.upper()


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"


class LogFormat(StrEnum):
    text = "text"
    json = "json"


@worker_app.command("start")
def worker_start(
    host: Annotated[
        str, typer.Option(envvar=env("host"), help="Address to bind (loopback by default).")
    ] = WORKER.host,
    port: Annotated[
        int,
        typer.Option(envvar=env("port"), min=0, max=65535, help="Port to bind; 0: a free one."),
    ] = DEFAULT_PORT,
    token: Token = None,
    allow_weak_token: Annotated[
        bool,
        typer.Option(
            envvar=env("allow_weak_token"),
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
            envvar=env("join"),
            help="HOST:PORT of a cluster member (repeatable; in the variable, space-separated).",
        ),
    ] = None,
    join_timeout: Annotated[
        float,
        typer.Option(
            envvar=env("join_timeout"),
            min=0.001,
            help="Seconds to keep retrying --join before exiting with an error.",
        ),
    ] = WORKER.join_timeout_s,
    drain_timeout: Annotated[
        float,
        typer.Option(
            envvar=env("drain_timeout"),
            min=0.0,
            help="Seconds a worker drains on SIGTERM or Ctrl-C (no new work; it finishes what "
            "it holds, then leaves); 0 stops at once. A second signal stops at once.",
        ),
    ] = WORKER.drain_timeout_s,
    advertise_address: Annotated[
        str,
        typer.Option(
            envvar=env("advertise_address"),
            help="HOST[:PORT] peers reach this worker at (NAT, or --host 0.0.0.0); "
            "default: the bound address, or this host's primary address for 0.0.0.0.",
        ),
    ] = WORKER.advertise_address,
    name: Annotated[
        str, typer.Option(envvar=env("name"), help="Unique worker name (default: <host>-<port>).")
    ] = WORKER.name,
    app_ref: Annotated[
        str | None,
        typer.Option(
            "--app", envvar=env("app"), help="Python module (or module:attr) with a compass.App."
        ),
    ] = WORKER.app,
    workload: Annotated[
        str | None,
        typer.Option(
            envvar=env("workload"), help="Workload spec JSON: run its workflows emulated."
        ),
    ] = WORKER.workload,
    policy: Annotated[
        str, typer.Option(envvar=env("policy"), help="Placement policy (same on every worker).")
    ] = WORKER.sched.policy,
    lanes: Annotated[
        int, typer.Option(envvar=env("lanes"), min=1, help="Execution lanes (tasks run at once).")
    ] = WORKER.lanes,
    host_lanes: Annotated[
        int,
        typer.Option(
            envvar=env("host_lanes"),
            min=0,
            help="Lanes for model-less tasks, off the GPU (0: they share it).",
        ),
    ] = WORKER.host_lanes,
    time_scale: Annotated[
        float, typer.Option(envvar=env("time_scale"), help="Emulated time multiplier.")
    ] = WORKER.time_scale,
    cache_mb: Annotated[
        int | None,
        typer.Option(
            envvar=env("cache_mb"),
            min=1,
            help=f"Model cache capacity in MiB ({CACHE_DEFAULT}).",
            show_default=False,
        ),
    ] = None if WORKER.cache.capacity_bytes is None else WORKER.cache.capacity_bytes // MiB,
    slab_mb: Annotated[
        int, typer.Option(envvar=env("slab_mb"), min=1, help="Slab size in MiB.")
    ] = WORKER.cache.slab_bytes // MiB,
    backend: Annotated[
        str, typer.Option(envvar=env("backend"), help="auto, cupy, host, strict or capacity.")
    ] = WORKER.cache.backend,
    device: Annotated[
        int,
        typer.Option(
            envvar=env("device"), min=0, help="CUDA device of the model cache (cupy backend)."
        ),
    ] = WORKER.cache.device,
    heartbeat_ms: Annotated[
        float,
        typer.Option(envvar=env("heartbeat_ms"), help="Heartbeat interval when nothing changes."),
    ] = WORKER.sched.heartbeat_ms,
    heartbeat_min_ms: Annotated[
        float,
        typer.Option(
            envvar=env("heartbeat_min_ms"),
            help="Least gap between heartbeats; changes go out after it.",
        ),
    ] = WORKER.sched.heartbeat_min_ms,
    heartbeat_max_rate: Annotated[
        float,
        typer.Option(
            envvar=env("heartbeat_max_rate"),
            help="Most heartbeat messages a second, over all peers.",
        ),
    ] = WORKER.sched.heartbeat_max_rate,
    peer_timeout_ms: Annotated[
        float,
        typer.Option(
            envvar=env("peer_timeout_ms"),
            help="A suspected peer that does not refute is dropped at most this long after.",
        ),
    ] = WORKER.sched.peer_timeout_ms,
    probe_period_ms: Annotated[
        float,
        typer.Option(
            envvar=env("probe_period_ms"), help="Failure detection: probe one peer this often."
        ),
    ] = WORKER.swim.probe_period_ms,
    probe_timeout_ms: Annotated[
        float,
        typer.Option(
            envvar=env("probe_timeout_ms"),
            help="A probe not acked within this goes through --indirect-probes others.",
        ),
    ] = WORKER.swim.probe_timeout_ms,
    indirect_probes: Annotated[
        int,
        typer.Option(
            envvar=env("indirect_probes"),
            help="Peers asked to probe one that did not ack, before it is suspected.",
        ),
    ] = WORKER.swim.indirect_probes,
    suspicion_mult: Annotated[
        float,
        typer.Option(
            envvar=env("suspicion_mult"),
            help="A confirmed suspicion lasts this many periods (x log10 of the workers).",
        ),
    ] = WORKER.swim.suspicion_mult,
    peer_idle_s: Annotated[
        float,
        typer.Option(
            envvar=env("peer_idle_s"),
            help="Close a channel to a peer idle this many seconds (0: never); it is "
            "opened again when there is something to send.",
        ),
    ] = WORKER.peer_idle_s,
    max_peer_channels: Annotated[
        int,
        typer.Option(
            envvar=env("max_peer_channels"),
            help="Open channels to peers at most; past it the least recently used idle "
            "one is closed (0: no cap).",
        ),
    ] = WORKER.max_peer_channels,
    adjust_threshold: Annotated[
        float,
        typer.Option(envvar=env("adjust_threshold"), help="Dynamic adjustment threshold."),
    ] = WORKER.sched.adjust_threshold,
    warm: Annotated[
        bool,
        typer.Option(envvar=env("warm"), help="Idle workers load models the cluster is short of."),
    ] = WORKER.sched.warm,
    preempt: Annotated[
        bool,
        typer.Option(
            envvar=env("preempt"),
            help="Scheduling at step boundaries: a queued task of a higher priority, or a short "
            "job that waiting would slow down more, takes a step-wise task's lane between two "
            "of its steps (the task resumes after it); a step-wise task whose job is past its "
            "deadline stops at its next step.",
        ),
    ] = WORKER.sched.preempt,
    admission: Annotated[
        str,
        typer.Option(
            envvar=env("admission"),
            help="How this worker admits a job with a deadline as its ingress: plan (its plan's "
            "estimate makes the deadline) or learned (besides, only as many jobs of a workflow "
            "and priority as did not lose more than 10% of their work to drops on the way).",
        ),
    ] = WORKER.sched.admission,
    view: Annotated[
        str,
        typer.Option(
            envvar=env("view"),
            help="What a planner sees: bounded (a job's candidates, whose load it watches; "
            "caches spread as rumors) or mesh (every worker heartbeats every peer).",
        ),
    ] = WORKER.sched.view,
    candidates: Annotated[
        int,
        typer.Option(
            envvar=env("candidates"),
            help="Bounded view: workers sampled per job beyond the holders of its models.",
        ),
    ] = WORKER.sched.candidates,
    holders: Annotated[
        int,
        typer.Option(
            envvar=env("holders"),
            help="Bounded view: holders in view per model a job needs (0: every holder).",
        ),
    ] = WORKER.sched.holders,
    max_frame_mb: Annotated[
        int,
        typer.Option(
            envvar=env("max_frame_mb"),
            min=1,
            help="Largest frame accepted, MiB. A job travels in one frame, so this bounds one "
            "job's inputs too (--max-job-mb): a client refuses a job larger than a frame "
            "before sending it (JobTooLarge).",
        ),
    ] = WORKER.limits.max_frame_bytes // MiB,
    max_jobs: Annotated[
        int,
        typer.Option(
            envvar=env("max_jobs"),
            min=1,
            help="Jobs in flight accepted as ingress; more are refused.",
        ),
    ] = WORKER.max_jobs,
    max_job_mb: Annotated[
        float | None,
        typer.Option(
            envvar=env("max_job_mb"),
            min=0.001,
            show_default=f"{WORKER.job_bytes // MiB}: what one frame carries, --max-frame-mb "
            f"less {JOB_ENVELOPE_BYTES // MiB}",
            help="MiB of one job's inputs taken as ingress; a job past it is refused "
            "(JobTooLarge), an HTTP body past it too (413). More than one frame carries, or "
            "than --max-held-mb, is refused at start.",
        ),
    ] = None,
    max_held_mb: Annotated[
        float,
        typer.Option(
            envvar=env("max_held_mb"),
            min=0.001,
            help="MiB of job inputs held as ingress, all jobs' together; a job past it is "
            "refused for now (Overloaded).",
        ),
    ] = WORKER.max_held_bytes / MiB,
    keep_answers_mb: Annotated[
        float,
        typer.Option(
            envvar=env("keep_answers_mb"),
            min=0.0,
            help="MiB of answers kept as ingress for a client's retry of a job (its key); "
            "past it the oldest are shed, and a retry of theirs gets AnswerNotKept.",
        ),
    ] = WORKER.keep_answer_bytes / MiB,
    task_timeout: Annotated[
        float,
        typer.Option(
            envvar=env("task_timeout"),
            min=0.001,
            help="Seconds a task may run unless it declares timeout_ms; past it its job fails.",
        ),
    ] = WORKER.task_timeout_s,
    max_stuck_tasks: Annotated[
        int,
        typer.Option(
            envvar=env("max_stuck_tasks"),
            min=1,
            help="Timed-out task threads still running past which the worker takes no GPU work.",
        ),
    ] = WORKER.max_stuck_tasks,
    log_level: Annotated[
        LogLevel,
        typer.Option(envvar=env("log_level"), case_sensitive=False, help="Logging on stderr."),
    ] = LogLevel.warning,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar=env("log_format"),
            case_sensitive=False,
            help="text, or json: one JSON object per line (time, level, logger, message, ...).",
        ),
    ] = LogFormat.text,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar=env("metrics_port"),
            min=0,
            max=65535,
            help="Serve Prometheus /metrics and /ready on this port (0: a free one; default: off).",
            show_default=False,
        ),
    ] = WORKER.metrics_port,
    metrics_host: Annotated[
        str, typer.Option(envvar=env("metrics_host"), help="Address the metrics port binds.")
    ] = WORKER.metrics_host,
    http_port: Annotated[
        int | None,
        typer.Option(
            envvar=env("http_port"),
            min=0,
            max=65535,
            help="Serve the HTTP front door (Open Inference Protocol /v2, OpenAI /v1) on this "
            "port of --host (0: a free one; default: off). The cluster token is its bearer token.",
            show_default=False,
        ),
    ] = WORKER.http_port,
    http_private_health: Annotated[
        bool,
        typer.Option(
            envvar=env("http_private_health"),
            help="The front door's /v2/health routes need the bearer token too.",
        ),
    ] = WORKER.http_private_health,
    http_idle_s: Annotated[
        float,
        typer.Option(
            envvar=env("http_idle_s"),
            min=0.001,
            help="Seconds a front-door connection may go without a whole request head "
            "(idle keep-alive, or a client too slow to send one) before it is closed.",
        ),
    ] = WORKER.http_idle_s,
    stream_window: Annotated[
        int,
        typer.Option(
            envvar=env("stream_window"),
            min=1,
            help="Partial outputs a streamed job's step-wise sink may make ahead of its "
            "caller's reading when it runs on the job's ingress; its next step then waits.",
        ),
    ] = WORKER.stream_window,
    stream_stall_s: Annotated[
        float,
        typer.Option(
            envvar=env("stream_stall_s"),
            min=0.001,
            help="Seconds a step may wait for a streamed job's caller to read before the job "
            "fails with StreamOverrun (a caller that stopped reading holds a lane no longer).",
        ),
    ] = WORKER.stream_stall_s,
    trace_sample: Annotated[
        float,
        typer.Option(
            envvar=env("trace_sample"),
            min=0.0,
            max=1.0,
            help="Fraction of the jobs submitted here that are traced (a client's trace=True "
            "always is); their traces are kept for `compass status --trace JOB`.",
        ),
    ] = WORKER.trace_sample,
    trace_keep: Annotated[
        int,
        typer.Option(envvar=env("trace_keep"), min=0, help="Traces of recent jobs kept here."),
    ] = WORKER.trace_keep,
    otel_endpoint: Annotated[
        str | None,
        typer.Option(
            envvar=env("otel_endpoint"),
            help="Export traced jobs' spans by OTLP/HTTP to this URL, e.g. "
            "http://collector:4318/v1/traces (needs compass[otel]).",
            show_default=False,
        ),
    ] = WORKER.otel_endpoint,
    capacity_table: Annotated[
        Path | None,
        typer.Option(
            envvar=env("capacity_table"),
            help="Capacity table the desired worker count sizes with (compass_desired_workers): "
            'JSON {"by_size": [[workers, utilization], ...], "margin": m}, or a `compass bench '
            "elastic --json` file (the --workload's table). Default: one utilization.",
            show_default=False,
        ),
    ] = None,
    replicate: Annotated[
        bool,
        typer.Option(
            envvar=env("replicate"),
            help="Warm a hot model here ahead of need when the cluster's rule picks this "
            "worker: its holders' queue waits rise and this one has headroom "
            "(compass.elastic.replicate, over this worker's view). Off by default, as in "
            "compass sim.",
        ),
    ] = WORKER.replicate is not None,
) -> None:
    """Start a worker; prints 'compass worker listening on HOST:PORT' first.

    Every option also reads a COMPASS_* environment variable (shown with each); a flag wins.
    """
    from compass.security import check_token
    from compass.worker.process import run_worker

    if token is not None:
        check_token(token, allow_weak=allow_weak_token)
    elif not allow_weak_token and not is_loopback(host):
        # no token at all: anyone who reaches the address could run jobs and join as a peer
        fail(
            f"a worker bound to {host} needs a cluster token (--token or COMPASS_TOKEN; "
            "`compass token` makes one), or --allow-weak-token on a trusted network",
            2,
        )
    configure_logging(log_level.value, as_json=log_format == LogFormat.json)
    cache = CacheConfig(
        capacity_bytes=None if cache_mb is None else cache_mb * MiB,
        slab_bytes=slab_mb * MiB,
        backend=backend,
        device=device,
    )
    table = None if capacity_table is None else _capacity(capacity_table, workload)
    config = WorkerConfig(
        host=host,
        port=port,
        name=name,
        token=token,
        tls=tls_config(tls_cert, tls_key, tls_ca),
        join=tuple(join or ()),
        join_timeout_s=join_timeout,
        drain_timeout_s=drain_timeout,
        advertise_address=advertise_address,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        http_port=http_port,
        http_private_health=http_private_health,
        http_idle_s=http_idle_s,
        stream_window=stream_window,
        stream_stall_s=stream_stall_s,
        trace_sample=trace_sample,
        trace_keep=trace_keep,
        otel_endpoint=otel_endpoint,
        capacity=() if table is None else table.by_size,
        capacity_margin=1.0 if table is None else table.margin,
        replicate=_replica_config() if replicate else None,
        app=app_ref,
        workload=workload,
        lanes=lanes,
        host_lanes=host_lanes,
        time_scale=time_scale,
        max_jobs=max_jobs,
        max_job_bytes=None if max_job_mb is None else int(max_job_mb * MiB),
        max_held_bytes=int(max_held_mb * MiB),
        keep_answer_bytes=int(keep_answers_mb * MiB),
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
            preempt=preempt,
            admission=admission,
            view=check_view(view),
            candidates=candidates,
            holders=holders,
        ),
        peer_idle_s=peer_idle_s,
        max_peer_channels=max_peer_channels,
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


@commands.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
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
    policy: Annotated[str, typer.Option(help="Placement policy.")] = WORKER.sched.policy,
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
    autoscale: Annotated[
        str | None,
        typer.Option(
            help="MIN:MAX: start MIN workers, then start and drain workers to the cluster's "
            "desired count (compass_desired_workers), within the bounds."
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

    bounds = None
    if autoscale is not None:
        from compass.elastic.rule import parse_bounds

        bounds = parse_bounds(autoscale)
        if gpus is not None:
            fail("--autoscale starts workers on this host's default device; not with --gpus", 2)
        workers = bounds[0]
    extra = list(ctx.args)
    _check_worker_args(extra)
    tls = tls_config(tls_cert, tls_key, tls_ca)
    if workload is not None and app_ref is not None:
        fail("give --workload or --app, not both", 2)
    if workload is None and app_ref is None:
        workload = default_workload()
    check_policies([policy])
    if workload is not None:
        check_workload(workload)
        source = ["--workload", str(Path(workload).resolve())]
    else:
        source = ["--app", str(app_ref)]
    args = ["--policy", policy, *source, *extra]
    logs = log_dir.resolve()
    devices = None if gpus is None else _gpus(gpus, extra)
    cluster = LocalCluster(workers, token=token, args=args, log_dir=logs, tls=tls)

    def ready() -> None:
        for worker in cluster.workers:
            typer.echo(f"{worker.name} {worker.address}")
        if token is None:
            typer.echo(f"token {cluster.token} (generated; set COMPASS_TOKEN to choose one)")
        typer.echo(f"logs in {logs}{os.sep} (w0.log ... w{workers - 1}.log)")
        typer.echo(
            f"ready: {workers} workers on free ports chosen by the system "
            "(`compass worker start --port N` for a fixed one); Ctrl-C stops them"
        )

    async def follow(held: LocalCluster, stop: asyncio.Event) -> None:
        from compass.elastic.local import LocalAutoscaler

        assert bounds is not None
        await LocalAutoscaler(held, *bounds, say=typer.echo).run(stop)

    hold_cluster(
        cluster,
        devices=devices,
        ready=ready,
        stopping=lambda: typer.echo("stopping workers..."),
        during=None if bounds is None else follow,
    )


def _replica_config() -> ReplicaConfig:
    """``--replicate``'s rule: the thresholds the simulator measured (docs/RESULTS.md)."""
    from compass.elastic.replicate import ReplicaConfig

    return ReplicaConfig()


def _capacity(path: Path, workload: str | None) -> Capacity:
    """``--capacity-table``'s table; from a bench JSON of several workloads, the
    --workload's."""
    from compass.elastic.table import read_capacity
    from compass.errors import CompassError
    from compass.workflow.spec import load_workload

    try:
        name = None if workload is None else load_workload(workload).name
        return read_capacity(path, name)
    except CompassError as error:
        fail(f"--capacity-table: {error}", 2)


def _gpus(text: str, extra: list[str]) -> list[int]:
    """``--gpus 0,1,...`` as device numbers; refused beside a --device for every worker."""
    if any(arg.split("=", 1)[0] == "--device" for arg in extra):
        fail("give --gpus (a device per worker) or --device (one for all), not both", 2)
    try:
        devices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        devices = []
    if not devices or min(devices) < 0:
        fail(f"--gpus {text!r}: expected comma-separated device numbers, e.g. 0,1,2,3", 2)
    return devices


def _check_worker_args(args: list[str]) -> None:
    """Refuse what `compass up` chooses itself, and check the rest as `worker start` would."""
    for arg in args:
        if arg.split("=", 1)[0] in UP_OWNS:
            fail(
                f"compass up chooses {arg.split('=', 1)[0]} for its workers; "
                "start a worker with `compass worker start` to choose it",
                2,
            )
    start = typer.main.get_group(worker_app).commands["start"]
    try:
        start.make_context("compass worker start", list(args))
    except typer.TyperException as exc:
        message = usage_error(exc, args)
        fail(f"{message}; passed to every worker (see compass worker start --help)", 2)
