"""``compass bench e2e``: the paper's workload on a real local cluster, every policy on the same
seeded arrivals, in one run.

Workers run in emulated mode (``--workload``): task times and model loads follow the spec,
scaled by ``--time-scale``; the wire, planning, cache decisions and slab accounting are the real
code. Latencies are reported in unscaled milliseconds, so they read like the paper's.

``batching`` and ``batch_gain`` transform the workload (:func:`compass.workflow.batching.
apply_batching`) before anything runs; the workers get the transformed workload as a spec file
written for each cluster, so they run exactly what the driver measures against.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from compass.client import Client
from compass.cluster import LocalCluster
from compass.config import SIM_WORKER
from compass.errors import CompassError, ConfigError
from compass.objective import outcome_of
from compass.sim.arrivals import Arrival, workload_arrivals
from compass.sim.goodput import priorities
from compass.sim.settings import NO_PREEMPTION, NO_STEP_BATCHING
from compass.wire.transport import new_event_loop
from compass.workflow.batching import BATCH_GAINS, apply_batching, without_step_batches
from compass.workflow.best import best_time_s
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload, load_workload, write_workload

from .report import machine, write_json
from .timeline import collect as collect_timeline
from .timeline import plot_timeline, write_chrome_trace

__all__ = ["E2EConfig", "run", "run_capacity", "run_policy", "workload_for"]

DEFAULT_WORKLOAD = str(Path(__file__).resolve().parent / "workloads" / "paper.json")


@dataclass(frozen=True, slots=True)
class E2EConfig:
    workload: str = DEFAULT_WORKLOAD
    workers: int = 5
    policies: tuple[str, ...] = ("compass", "jsq", "heft", "hash")
    arrival: str = "poisson"
    cv: float = 1.0
    load: float = 1.0
    jobs: int = 200
    seed: int = 0
    time_scale: float = 0.25
    heartbeat_ms: float = SIM_WORKER.sched.heartbeat_ms
    heartbeat_min_ms: float = SIM_WORKER.sched.heartbeat_min_ms
    #: model-less tasks on this many host lanes per worker (0: on the GPU lane, as in the paper,
    #: and as the simulator it is compared with runs them)
    host_lanes: int = SIM_WORKER.host_lanes
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    #: the workers schedule at step boundaries (``--preempt``), except in the runs of the
    #: policies named ``"NAME (no preemption)"`` (``--preempt both``, as ``compass sim`` names
    #: them)
    preempt: bool = False
    #: off: every task runs one item at a time; on: tasks batch as the workload declares, and
    #: model tasks that declare no curve take ``batch_gain``'s (None: they do not batch)
    batching: bool = True
    batch_gain: str | None = None
    #: every job's deadline, as a multiple of its workflow's best time (None: no deadline);
    #: the summary then holds goodput, attainment, and the jobs refused and dropped
    deadline_x: float | None = None
    #: with ``deadline_x``: the fraction of jobs at priority 1 (the rest at 0), drawn as the
    #: simulator's goodput draws them
    priority_mix: float = 0.0

    def __post_init__(self) -> None:
        if self.workers < 1 or self.jobs < 1:
            raise ConfigError("e2e needs at least one worker and one job")
        if self.deadline_x is not None and not 1 <= self.deadline_x < float("inf"):
            raise ConfigError(f"--deadline-x must be >= 1, got {self.deadline_x!r}")
        if self.priority_mix and self.deadline_x is None:
            raise ConfigError("--priority-mix needs --deadline-x (priorities matter to goodput)")
        if not 0 <= self.priority_mix <= 1:
            raise ConfigError(f"--priority-mix must be in [0, 1], got {self.priority_mix!r}")
        if not 0 < self.time_scale <= 10:
            raise ConfigError(f"--time-scale must be in (0, 10], got {self.time_scale}")
        if self.batch_gain is not None and self.batch_gain not in BATCH_GAINS:
            raise ConfigError(
                f"--batch-gain {self.batch_gain!r}: expected one of {', '.join(BATCH_GAINS)}"
            )


def workload_for(config: E2EConfig) -> Workload:
    """The workload ``config`` runs: its spec file with its batching applied."""
    workload = load_workload(config.workload)
    return apply_batching(workload, batching=config.batching, gain=config.batch_gain)


def arrivals_for(config: E2EConfig, workload: Workload) -> list[Arrival]:
    return workload_arrivals(
        workload, config.jobs, process=config.arrival, load=config.load, cv=config.cv,
        seed=config.seed,
    )  # fmt: skip


def _input_payload(workload: Workload, workflow: str) -> dict[str, Any]:
    wf = workload.workflows[workflow]
    nbytes = max(wf.tasks[root].profile.input_bytes for root in wf.roots)
    return {"data": np.zeros(nbytes, dtype=np.uint8)}


async def run_policy(
    config: E2EConfig,
    workload: Workload,
    policy: str,
    arrivals: Sequence[Arrival],
    *,
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    keep_plans: bool = False,
    timeline: bool = False,
) -> dict[str, Any]:
    """Replay ``arrivals`` on a fresh cluster running ``policy``; the summary of the run.

    With ``keep_plans`` the summary also holds ``plans``: where each job's tasks ran, in
    arrival order (read from the ingresses' traces); with ``timeline``, ``timeline``: every
    worker's task spans and model loads (:func:`compass._bench.timeline.collect`).
    """
    n = workers or config.workers
    scale = config.time_scale
    async with _cluster(config, workload, policy, n) as cluster:
        clients_needed = max(a.client for a in arrivals) + 1
        # client i talks to worker i % n, as in the simulator: every worker is an ingress
        clients = [
            Client(cluster.addresses[i % n], token=cluster.token, name=f"client{i}")
            for i in range(clients_needed)
        ]
        for client in clients:
            await client.connect()
        await settled(clients[:n])
        payloads = {wf: _input_payload(workload, wf) for wf in workload.workflows}
        best = best_ms(workload)
        # a deadline in real milliseconds: the workload's, run time_scale times as fast
        deadlines = {
            wf: None if config.deadline_x is None else config.deadline_x * best[wf] * scale
            for wf in workload.workflows
        }
        shed: Counter[str] = Counter()
        levels = priorities(len(arrivals), config.priority_mix, config.seed)
        level_of = {id(a): level for a, level in zip(arrivals, levels, strict=True)}

        async def submit(arrival: Arrival) -> None:
            try:
                await clients[arrival.client].submit(
                    arrival.workflow, timeout=600, deadline_ms=deadlines[arrival.workflow],
                    priority=level_of[id(arrival)], **payloads[arrival.workflow],
                )  # fmt: skip
            except CompassError as exc:
                shed[outcome_of(exc)] += 1
                raise

        try:
            latencies, elapsed = await replay(arrivals, scale, submit, (CompassError,), progress)
            statuses, traces = await _collect(cluster, keep_plans)
            spans = await collect_timeline(cluster) if timeline else None
        finally:
            for client in clients:
                await client.aclose()
    summary = summarize(workload, latencies, statuses, elapsed)
    with_latencies(summary, workload, latencies)
    if any(s["queue"].get("preempt") for s in statuses):  # the workers said they preempt
        summary["suspensions"] = sum(s["queue"]["suspensions"] for s in statuses)
    if config.deadline_x is not None:
        x = config.deadline_x
        met = sum(1 for sd in summary["slowdowns"] if sd is not None and sd <= x)
        summary["attainment"] = met / len(arrivals)
        summary["goodput"] = config.load * met / len(arrivals)  # x the workload's rate
        summary["refused"] = shed["unreachable"]
        summary["dropped"] = shed["dropped"]
        # finished past the deadline: answered DeadlineExceeded (on_miss="drop")
        summary["late"] = shed["late"]
        by_level: dict[str, list[bool]] = {}
        for level, sd in zip(levels, summary["slowdowns"], strict=True):
            by_level.setdefault(str(level), []).append(sd is not None and sd <= x)
        summary["attainment_by_priority"] = {
            level: sum(met_) / len(met_) for level, met_ in sorted(by_level.items())
        }
    if keep_plans:
        summary["plans"] = _plans(cluster, traces, arrivals)
    if spans is not None:
        summary["timeline"] = spans
    return summary


Latencies = list[tuple[str, float | None]]


async def replay(
    arrivals: Sequence[Arrival],
    scale: float,
    submit: Callable[[Arrival], Awaitable[None]],
    failures: tuple[type[BaseException], ...],
    progress: Callable[[int], None] | None = None,
) -> tuple[Latencies, float]:
    """Start ``submit(arrival)`` at each arrival's time, ``scale`` real seconds per workload
    second, each running concurrently with the later ones. Returns each job's workflow and
    latency in workload seconds (None where ``submit`` raised one of ``failures``), in arrival
    order, and the workload seconds the whole replay took."""
    latencies: Latencies = [("", None)] * len(arrivals)
    done = 0

    async def one(i: int, arrival: Arrival) -> None:
        nonlocal done
        t0 = time.perf_counter()
        try:
            await submit(arrival)
            latencies[i] = (arrival.workflow, (time.perf_counter() - t0) / scale)
        except failures:
            latencies[i] = (arrival.workflow, None)
        done += 1
        if progress is not None:
            progress(done)

    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.TaskGroup() as group:
        for i, arrival in enumerate(arrivals):
            delay = start + arrival.t_s * scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(one(i, arrival))
    return latencies, (loop.time() - start) / scale


def with_latencies(summary: dict[str, Any], workload: Workload, latencies: Latencies) -> None:
    """Add each run's ``latencies_ms`` (answered jobs) and ``slowdowns`` (per job in arrival
    order, None for a failed one: what an SLO's attainment counts) to ``summary``."""
    best = best_ms(workload)
    summary["latencies_ms"] = [s * 1000.0 for _, s in latencies if s is not None]
    summary["slowdowns"] = [None if s is None else s * 1000.0 / best[wf] for wf, s in latencies]


@contextlib.asynccontextmanager
async def _cluster(
    config: E2EConfig, workload: Workload, policy: str, workers: int
) -> AsyncIterator[LocalCluster]:
    """A fresh cluster of ``workers`` running ``policy`` on exactly ``workload``: the workers
    read it from a spec file written here, since it may not be ``config.workload`` as the file
    has it (batching transforms it). They preempt with ``config.preempt``, unless ``policy`` is
    named ``"NAME (no preemption)"`` (then they run NAME without); a policy named ``"NAME (no
    step batching)"`` runs NAME on ``workload`` with its step-wise tasks one job each
    (``--step-batch``, as ``compass sim`` names them)."""
    if policy.endswith(NO_STEP_BATCHING):
        policy = policy.removesuffix(NO_STEP_BATCHING)
        workload = without_step_batches(workload)
    preempt = config.preempt and not policy.endswith(NO_PREEMPTION)
    policy = policy.removesuffix(NO_PREEMPTION)
    with tempfile.TemporaryDirectory(prefix="compass-e2e-") as folder:
        spec = Path(folder) / "workload.json"
        write_workload(workload, spec)
        args = [
            "--workload", str(spec),
            "--policy", policy,
            "--time-scale", str(config.time_scale),
            "--heartbeat-ms", str(config.heartbeat_ms),
            "--heartbeat-min-ms", str(config.heartbeat_min_ms),
            "--host-lanes", str(config.host_lanes),
            *config.extra_args,
            *(["--preempt"] if preempt else []),
        ]  # fmt: skip
        async with LocalCluster(workers, args=args) as cluster:
            yield cluster


async def settled(clients: Sequence[Client], timeout_s: float = 120.0) -> None:
    """Wait until the workers' caches settle (no load under way, the same models resident
    over three looks 50 ms apart): jobs then meet the cluster as a deployment would, warmed,
    whatever the time scale, and as the simulator's ``warm_start`` models it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: list[Any] = []
    same = 0
    while same < 3 and loop.time() < deadline:
        statuses = [await client.status() for client in clients]
        now = [(s.cache["resident"], s.cache["loading"]) for s in statuses]
        loading = any(s.cache["loading"] for s in statuses)
        same = same + 1 if now == last and not loading else 0
        last = now
        await asyncio.sleep(0.05)


async def _collect(
    cluster: LocalCluster, with_traces: bool
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """Every worker's status and, if asked, the final placement of each job it answered."""
    statuses: list[dict[str, Any]] = []
    plans: dict[str, dict[str, str]] = {}
    for index in range(len(cluster.workers)):
        async with cluster.client(index) as client:
            statuses.append((await client.status()).to_json())
            if with_traces:
                for record in await client.records():
                    plans[record.job] = dict(record.plan)
    return statuses, plans


def _plans(
    cluster: LocalCluster, by_id: dict[str, dict[str, str]], arrivals: Sequence[Arrival]
) -> list[dict[str, str]]:
    """Each arrival's final placement. Ingress ``w`` numbers its jobs ``w-<instance>-1,
    w-<instance>-2, ...`` in the order it receives them, which is arrival order for the
    clients attached to it."""
    n = len(cluster.workers)
    counts = [0] * n
    by_count = {(job.rsplit("-", 2)[0], int(job.rsplit("-", 1)[1])): p for job, p in by_id.items()}
    plans = []
    for arrival in arrivals:
        ingress = arrival.client % n
        counts[ingress] += 1
        plans.append(by_count[cluster.workers[ingress].name, counts[ingress]])
    return plans


def summarize(
    workload: Workload,
    latencies: Sequence[tuple[str, float | None]],
    statuses: Sequence[dict[str, Any]],
    elapsed_s: float,
) -> dict[str, Any]:
    """The same keys as :meth:`compass.sim.result.SimResult.summary`, from a real run, plus
    ``batch_sizes``: runs of model tasks per batch size over every worker, as
    :func:`compass.sim.compare.batch_sizes` counts a simulated run's."""
    ok = [(wf, s) for wf, s in latencies if s is not None]
    latency_ms = np.array([s for _, s in ok]) * 1000.0
    best = best_ms(workload)
    slowdown = np.array([s * 1000.0 / best[wf] for wf, s in ok])
    stats = [s["stats"] for s in statuses]
    caches = [s["cache"]["stats"] for s in statuses]
    hits = sum(s["cache_hits"] for s in stats)
    misses = sum(s["cache_misses"] for s in stats)
    tasks = sum(s["tasks_run"] for s in stats) or 1
    batches: Counter[str] = Counter()
    for status in statuses:
        for runs in status.get("batches", {}).values():
            batches.update(runs)
    by_workflow: dict[str, list[float]] = {}
    for (wf, s), sd in zip(ok, slowdown, strict=True):
        del s
        by_workflow.setdefault(wf, []).append(float(sd))

    def pct(q: float) -> float | None:
        return float(np.percentile(latency_ms, q)) if len(latency_ms) else None

    return {
        "completed": len(ok),
        "failed": len(latencies) - len(ok),
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
        "median_slowdown": float(np.median(slowdown)) if len(slowdown) else None,
        "mean_slowdown": float(np.mean(slowdown)) if len(slowdown) else None,
        "cache_hit_rate": hits / (hits + misses) if hits + misses else None,
        "model_gb_loaded": sum(c["bytes_loaded"] for c in caches) / 1e9,
        "evictions": sum(c["evictions"] for c in caches),
        "utilization": {
            s["name"]: (st["exec_s"] + st["fetch_s"]) / elapsed_s if elapsed_s > 0 else 0.0
            for s, st in zip(statuses, stats, strict=True)
        },
        "breakdown_ms": {
            key: sum(st[f"{key}_s"] for st in stats) / tasks * 1000.0
            for key in ("queue", "fetch", "transfer", "exec")
        },
        "slowdown_by_workflow": {
            wf: float(np.median(values)) for wf, values in sorted(by_workflow.items())
        },
        "moves": sum(st["moves"] for st in stats),
        "batch_sizes": {size: batches[size] for size in sorted(batches, key=int)},
        "elapsed_s": elapsed_s,
    }


def _advance(bar: Any, task: Any, completed: int) -> None:
    bar.update(task, completed=completed)


#: the least real time the shortest workflow's best time should take in an emulated run: a
#: hop between workers costs 0.5-1 ms of real time whatever the time scale (two event loops,
#: the wire), so a run at a scale where the shortest workflow takes a few real milliseconds
#: measures that cost, not the workload (the short generated workload ran 19% slower than
#: simulated at time scale 1.0 and within 6% at 4.0, docs/RESULTS.md)
SHORTEST_REAL_MS = 25.0

#: the time scale used when the workload's workflows are all long enough
DEFAULT_TIME_SCALE = 0.25


def auto_time_scale(workload: Workload) -> float:
    """The time scale for an emulated run of ``workload``: :data:`DEFAULT_TIME_SCALE`, or
    slower, so that its shortest workflow takes :data:`SHORTEST_REAL_MS` of real time at
    best (at most 10)."""
    shortest = min(best_ms(workload).values())
    return min(10.0, max(DEFAULT_TIME_SCALE, round(SHORTEST_REAL_MS / shortest, 2)))


def best_ms(workload: Workload) -> dict[str, float]:
    """Each workflow's best time in ms, computed as the simulator does (a lower bound: any
    number of workers, each with a host lane; the declared ``best_ms`` is not trusted)."""
    profiles = Profiles.from_workload(workload)
    return {
        name: best_time_s(wf, profiles, host_lanes=1) * 1000.0 or math.inf
        for name, wf in workload.workflows.items()
    }


def run(
    config: E2EConfig,
    *,
    json_path: str | None = None,
    plot_path: str | None = None,
    servers_sweep: tuple[int, int] | None = None,
    target_slowdown: float = 2.0,
    per_policy_tables: bool = True,
    trace_path: str | None = None,
    timeline_path: str | None = None,
) -> dict[str, Any]:
    """Every policy of ``config`` on the same arrivals; prints tables, writes JSON and a plot;
    ``trace_path``: every policy's run as a Chrome trace (one process per worker); and
    ``timeline_path``: as a per-worker Gantt chart (:mod:`compass._bench.timeline`)."""
    from . import sim_report as report

    workload = workload_for(config)
    report.warn_declared_best(workload, Console(stderr=True), host_lanes=1)
    arrivals = arrivals_for(config, workload)
    results: dict[str, dict[str, Any]] = {}
    latencies: dict[str, list[float]] = {}
    timelines: dict[str, list[dict[str, Any]]] = {}
    sweep: dict[str, dict[int, float | None]] = {}
    out: dict[str, Any] = {"config": {**asdict(config), "machine": machine(), "mode": "real"}}
    runner = asyncio.Runner(loop_factory=new_event_loop)
    try:
        with report.progress_bar() as bar:
            for policy in config.policies:
                task = bar.add_task(f"{policy} on {config.workers} workers", total=len(arrivals))
                summary = runner.run(
                    run_policy(
                        config,
                        workload,
                        policy,
                        arrivals,
                        progress=functools.partial(_advance, bar, task),
                        timeline=bool(trace_path or timeline_path),
                    )
                )
                if "timeline" in summary:
                    timelines[policy] = summary.pop("timeline")
                latencies[policy] = summary.pop("latencies_ms")
                del summary["slowdowns"]
                results[policy] = summary
        out["results"] = results
        if config.deadline_x is not None:
            print(f"deadlines {config.deadline_x:g}x best time, load {config.load:g}:")
            for policy, summary in results.items():
                levels = ", ".join(
                    f"p{level} {share:.0%}"
                    for level, share in summary["attainment_by_priority"].items()
                )
                print(f"  {policy}: goodput {summary['goodput']:.2f}x the rate, attainment "
                      f"{summary['attainment']:.0%} ({levels}), refused {summary['refused']}, "
                      f"dropped {summary['dropped']}, late {summary['late']}")  # fmt: skip
        report.print_results(
            results,
            name=f"{workload.name} on {config.workers} worker processes",
            workers=config.workers,
            arrival=config.arrival,
            load=config.load,
            per_policy=per_policy_tables,
        )
        if servers_sweep is not None:
            needed, sweep = _servers_needed(
                runner, config, workload, arrivals, servers_sweep, target_slowdown
            )
            out["servers_needed"] = needed
            out["sweep"] = {p: {str(n): v for n, v in sorted(t.items())} for p, t in sweep.items()}
            report.print_servers_needed(needed, servers_sweep, target_slowdown)
    finally:
        runner.close()
    write_json(json_path, out)
    if plot_path:
        report.plot_results(plot_path, workload, latencies, results, sweep, target_slowdown)
        print(f"wrote {plot_path}")
    if trace_path:
        write_chrome_trace(trace_path, timelines)
        print(f"wrote {trace_path} (Chrome trace: open it in https://ui.perfetto.dev)")
    if timeline_path:
        plot_timeline(timeline_path, timelines)
        print(f"wrote {timeline_path}")
    return out


def _servers_needed(
    runner: asyncio.Runner,
    config: E2EConfig,
    workload: Workload,
    arrivals: Sequence[Arrival],
    sweep: tuple[int, int],
    target: float,
) -> tuple[dict[str, int | None], dict[str, dict[int, float | None]]]:
    """Per policy, the fewest workers in the range whose median slowdown meets ``target``.

    The search is the simulator's (:func:`compass.sim.compare.fewest_workers`); here every point
    it asks for is a real cluster run on the same arrivals.
    """
    from compass.sim.compare import fewest_workers

    needed: dict[str, int | None] = {}
    table: dict[str, dict[int, float | None]] = {}
    for policy in config.policies:

        def median(n: int, policy: str = policy) -> float | None:
            run = run_policy(config, workload, policy, arrivals, workers=n)
            value: float | None = runner.run(run)["median_slowdown"]
            return value

        needed[policy], table[policy] = fewest_workers(median, sweep[0], sweep[1], target)
    return needed, table


#: the loads a real capacity search tries before bisecting: each one is a cluster run
CAPACITY_LADDER = (0.5, 1.0, 2.0, 3.0, 4.0)


def run_capacity(
    config: E2EConfig,
    *,
    seeds: Sequence[int] = (0,),
    slos: Sequence[Any] | None = None,
    max_load: float = 4.0,
    steps: int = 2,
    json_path: str | None = None,
    plot_path: str | None = None,
) -> dict[str, Any]:
    """``compass bench e2e --capacity``: the simulator's capacity search
    (:func:`compass.sim.capacity.search_capacity`, same JSON) with every point a run of
    :func:`run_policy` on a fresh cluster: a coarse grid up to ``max_load``, then ``steps``
    bisections. With preemption on, ``suspensions`` holds each preempting run's count."""
    from compass.sim import capacity

    from . import sim_report

    workload = workload_for(config)
    chosen = list(capacity.BUILTIN_SLOS if slos is None else slos)
    grid = capacity.load_grid(max_load, CAPACITY_LADDER)
    runner = asyncio.Runner(loop_factory=new_event_loop)
    #: preempting runs: policy -> "seed S load L" -> the suspensions the workers made
    suspensions: dict[str, dict[str, int]] = {}

    def one(policy: str, seed: int, load: float) -> list[float | None]:
        point = replace(config, load=load, seed=seed)
        run = run_policy(point, workload, policy, arrivals_for(point, workload))
        summary = runner.run(run)
        if "suspensions" in summary:
            point_name = f"seed {seed} load {load:g}"
            suspensions.setdefault(policy, {})[point_name] = summary["suspensions"]
        slowdowns: list[float | None] = summary["slowdowns"]
        return slowdowns

    def progress(policy: str, seed: int, load: float, seconds: float) -> None:
        print(f"  {policy} seed {seed} load {load:g}: {seconds:.1f} s")

    try:
        found = capacity.search_capacity(
            one,
            policies=config.policies,
            seeds=seeds,
            slos=chosen,
            grid=grid,
            max_steps=steps,
            progress=progress,
        )
    finally:
        runner.close()
    bound = capacity.physical_bound(workload, config.workers, host_lanes=config.host_lanes)
    out: dict[str, Any] = {
        "config": {
            **asdict(config),
            "machine": machine(),
            "mode": "real",
            "seeds": list(seeds),
            "slos": capacity.slo_config(chosen),
            "grid": list(grid),
            "max_load": max_load,
            "max_steps": steps,
            "physical_bound": bound,
        },
        **found,
        **({"suspensions": suspensions} if suspensions else {}),
    }
    sim_report.print_capacity(out, title=f"{workload.name} on {config.workers} worker processes")
    write_json(json_path, out)
    if plot_path:
        sim_report.plot_attainment(plot_path, out)
        print(f"wrote {plot_path}")
    return out
