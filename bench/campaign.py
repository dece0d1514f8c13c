"""A fault campaign: random faults, one at a time, on a cluster under a steady stream of jobs.

``compass bench restarts --scenario campaign`` (issue 32): ``workers`` emulated workers (the
restarts scenarios' workload and flags), all ``--join`` the first, take a job every
``job_gap_s`` for ``duration_s``, each dealt to the next worker in turn and failing over to the
others while that one is away (:func:`~bench.restarts.rolling`'s load balancer). Meanwhile, at
random intervals drawn from a generator seeded with ``seed``, one fault at a time:

- ``kill``: SIGKILL a worker, start it again with the same name, port and flags;
- ``pause``: SIGSTOP a worker for 0.5-3 s, then SIGCONT;
- ``restart``: SIGTERM a worker, wait for it to drain and exit, start it again;
- ``cut``: cut the link between two workers for 1-5 s, then mend it. Only where every worker
  runs on a host of its own, a network namespace (:mod:`bench.netns`: needs root and ``ip
  netns``; the driver's own thread enters a sixth host, so its clients reach the workers over
  the bridge as a client on another machine would); elsewhere the workers run on loopback and
  the campaign says why it has no cuts.

After each fault ends (the worker listens again, goes on, or the link is mended) the campaign
waits until every view is whole (every worker has every other as a peer and in its view, up to
:data:`VIEW_LIMIT_S`), then a recovery gap drawn from ``gap_s``, then the next fault. The jobs
are counted as the fixed scenarios count them (ok, failed, hung, twice: two ingresses answered
one job key, read from the traces), and at the end the views must be whole. It passes with 0
hung, 0 twice and whole views. The worker logs stay in ``log_dir``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compass import Client
from compass.cluster import WorkerProcess
from compass.errors import CompassError, CompassTimeout

from . import netns
from .report import print_table, write_json
from .restarts import (
    JOB_TIMEOUT_S,
    SLOW_S,
    VIEW_LIMIT_S,
    WORKER_ARGS,
    AnswerKeys,
    Outcome,
    free_port,
    submit_one,
    views_whole,
)

__all__ = ["KINDS", "Campaign", "Fault", "Settings", "run", "run_campaign"]

#: the faults, in the order a test forces them
KINDS = ("kill", "pause", "restart", "cut")
#: how long a pause and a cut last, at least and at most (seconds, drawn uniformly)
PAUSE_S = (0.5, 3.0)
CUT_S = (1.0, 5.0)
#: a job's whole call, failovers included: past this it is counted hung (each submission
#: has JOB_TIMEOUT_S of its own)
JOB_BOUND_S = 3 * JOB_TIMEOUT_S
#: where the workers listen: each host's address (namespaces) or 127.0.0.1 on free ports
NETNS_PORT = 7400
#: a graceful restart whose drain takes longer has its worker's queues looked at
SLOW_DRAIN_S = 3.0
#: a cluster that is not whole this long after its start does not start
STARTUP_S = 60.0


@dataclass(frozen=True)
class Settings:
    """A campaign's parameters. ``netns``: ``auto`` (namespaces where they can be made),
    ``on`` (they must be), ``off`` (loopback, no cuts). ``forced``: fault kinds applied first,
    in this order, whatever the duration (then random ones while the duration lasts)."""

    duration_s: float = 600.0
    workers: int = 5
    seed: int = 0
    netns: str = "auto"
    forced: tuple[str, ...] = ()
    gap_s: tuple[float, float] = (2.0, 8.0)
    job_gap_s: float = 0.05
    #: more flags for every worker (``--log-level info`` to look into a finding)
    worker_args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    log_dir: Path | None = None


@dataclass
class Fault:
    """One fault: when (seconds from the stream's start), to whom, how long it was held
    (pause, cut), and how long after its end every view was whole (None: not within
    :data:`VIEW_LIMIT_S`)."""

    kind: str
    at_s: float
    targets: list[str]
    held_s: float | None = None
    view_s: float | None = None
    exit_code: int | None = None  # kill, restart: the worker's (-9 after a SIGTERM: no drain)
    stop_s: float | None = None  # kill, restart: from the signal to the exit
    #: restart: the worker's queues (``compass status``) SLOW_DRAIN_S into a drain not done
    drain_queue: dict[str, Any] | None = None
    error: str | None = None  # what went wrong applying it (the campaign stopped there)


@dataclass
class Campaign:
    """What a campaign did and what happened to its jobs."""

    seed: int
    duration_s: float
    workers: int
    hosts: str  # "network namespaces" or "loopback"
    cut_skipped: str | None  # why there were no cuts
    jobs: Outcome = field(default_factory=lambda: Outcome("campaign"))
    faults: list[Fault] = field(default_factory=list)
    applied: dict[str, int] = field(default_factory=dict)
    views_whole: bool = False  # within VIEW_LIMIT_S of the last fault, and still at the end
    last_view_s: float | None = None
    ran_s: float = 0.0
    #: answered jobs' latency at the client (p50, p99, max), failovers included
    latency_ms: dict[str, float] = field(default_factory=dict)
    #: lines at ERROR level (or tracebacks) in the workers' logs, and the first of them
    log_errors: int = 0
    log_error_lines: list[str] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    log_dir: str = ""
    aborted: str | None = None  # a fault that could not be applied: the campaign stopped
    #: the jobs not answered with their result (the first 200): when each was sent (seconds
    #: from the stream's start), through which worker first, and what the client got
    problems: list[dict[str, Any]] = field(default_factory=list)
    #: the ingresses' answer records of jobs that failed or were slow (restarts.SLOW_S)
    slow_records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        whole = self.views_whole and self.aborted is None
        return self.jobs.hung == 0 and self.jobs.twice == 0 and whole


class CampaignCluster:
    """The campaign's worker processes, ``w0`` to ``w{size-1}``, each on a host of its own
    (``hosts``: host i runs worker i) or all on loopback; every one ``--join`` s ``w0``, which
    joins itself (DEPLOY.md's pattern), and is started again with its first command."""

    def __init__(
        self,
        size: int,
        *,
        hosts: netns.Namespaces | None,
        env: dict[str, str] | None,
        log_dir: Path,
        args: list[str],
    ) -> None:
        self.size = size
        self.args = args
        self.hosts = hosts
        self.env = dict(os.environ if env is None else env)
        self.token = secrets.token_hex(16)
        self.env["COMPASS_TOKEN"] = self.token
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.log_dir = log_dir
        self.workers: list[WorkerProcess] = []
        self._argv: list[list[str]] = []

    def _address(self, i: int) -> tuple[str, int]:
        if self.hosts is not None:
            return self.hosts.address(i), NETNS_PORT
        return "127.0.0.1", free_port()

    async def start(self) -> None:
        listen = [self._address(i) for i in range(self.size)]
        seed = f"{listen[0][0]}:{listen[0][1]}"
        for i, (host, port) in enumerate(listen):
            prefix = self.hosts.command(i) if self.hosts is not None else []
            self._argv.append([
                *prefix, sys.executable, "-m", "compass", "worker", "start",
                "--host", host, "--port", str(port), "--name", f"w{i}", *self.args,
                "--join", seed,
            ])  # fmt: skip
        self.workers.append(await self._spawn(0))
        started = await asyncio.gather(
            *(self._spawn(i) for i in range(1, self.size)), return_exceptions=True
        )
        # those that did start are ended with the cluster, also when another did not
        self.workers.extend(w for w in started if isinstance(w, WorkerProcess))
        for failed in started:
            if isinstance(failed, BaseException):
                raise failed
        if await views_whole(self, time.monotonic(), STARTUP_S) is None:
            raise CompassTimeout(f"the campaign's workers did not join within {STARTUP_S:.0f} s")

    async def _spawn(self, i: int) -> WorkerProcess:
        name = f"w{i}"
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *self._argv[i],
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
                env=self.env,
            )
        worker = WorkerProcess(name, process, log_path, self._argv[i])
        try:
            await worker.read_address(STARTUP_S)
        except BaseException:
            worker.kill()
            await worker.stop()
            raise
        return worker

    async def restart(self, i: int, fault: Fault, *, kill: bool) -> None:
        """SIGKILL (``kill``) or SIGTERM worker ``i``, wait for its exit (a drain not done in
        30 s is killed), start it again; its exit code and how long it took to exit in
        ``fault``, and the queues of a drain still going on after :data:`SLOW_DRAIN_S`."""
        worker = self.workers[i]
        if kill:
            worker.kill()
        t0 = time.monotonic()
        stopping = asyncio.ensure_future(worker.stop())
        done, _ = await asyncio.wait({stopping}, timeout=SLOW_DRAIN_S)
        if not done:  # what does it wait for?
            with contextlib.suppress(CompassError, OSError):
                async with self.client(i) as client:
                    fault.drain_queue = dict((await client.status(timeout=2.0)).queue)
        fault.exit_code = await stopping
        fault.stop_s = round(time.monotonic() - t0, 2)
        self.workers[i] = await self._spawn(i)

    def client(self, index: int) -> Client:
        return Client(self.workers[index].address, token=self.token)

    async def aclose(self) -> list[int]:
        for worker in self.workers:  # a stopped worker would not hear the SIGTERM
            if worker.running:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGCONT)
        return list(await asyncio.gather(*(w.stop(timeout=15.0) for w in self.workers)))


class _Faults:
    """Applies the campaign's faults, one at a time, and records each."""

    def __init__(
        self,
        cluster: CampaignCluster,
        keys: AnswerKeys,
        settings: Settings,
        result: Campaign,
        kinds: tuple[str, ...],
    ) -> None:
        self.cluster = cluster
        self.keys = keys
        self.settings = settings
        self.result = result
        self.kinds = kinds
        self.rng = random.Random(settings.seed)

    async def run(self, t0: float) -> None:
        """Faults until ``duration_s`` from ``t0`` (and every forced one, however long)."""
        forced = list(self.settings.forced)
        end = t0 + self.settings.duration_s
        while True:
            gap = self.rng.uniform(*self.settings.gap_s)
            if not forced and time.monotonic() + gap >= end:
                return
            await asyncio.sleep(gap)
            kind = forced.pop(0) if forced else self.rng.choice(self.kinds)
            fault = Fault(kind, round(time.monotonic() - t0, 2), [])
            try:
                await self.apply(fault)
            except (CompassError, OSError) as exc:  # a worker that did not start again
                fault.error = f"{type(exc).__name__}: {exc}"
                self.result.faults.append(fault)
                self.result.aborted = f"{kind} of {fault.targets}: {fault.error}"
                return
            ended = time.monotonic()
            fault.view_s = await views_whole(self.cluster, ended)
            self.result.faults.append(fault)
            self.result.applied[kind] = self.result.applied.get(kind, 0) + 1

    async def apply(self, fault: Fault) -> None:
        rng, cluster = self.rng, self.cluster
        i = rng.randrange(cluster.size)
        fault.targets = [cluster.workers[i].name]
        if fault.kind in ("kill", "restart"):
            # its last answers, read before they go with it (a job it answered whose answer
            # is lost with it, run again elsewhere, is a job answered twice)
            await self.keys.poll_one(i)
            await cluster.restart(i, fault, kill=fault.kind == "kill")
        elif fault.kind == "pause":
            fault.held_s = round(rng.uniform(*PAUSE_S), 2)
            process = cluster.workers[i].process
            process.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(fault.held_s)
            finally:
                process.send_signal(signal.SIGCONT)
        elif fault.kind == "cut":
            assert cluster.hosts is not None
            j = rng.choice([k for k in range(cluster.size) if k != i])
            fault.targets.append(cluster.workers[j].name)
            fault.held_s = round(rng.uniform(*CUT_S), 2)
            await cluster.hosts.cut(i, j)
            try:
                await asyncio.sleep(fault.held_s)
            finally:
                await cluster.hosts.mend(i, j)
        else:
            raise ValueError(f"unknown fault {fault.kind!r}: expected one of {KINDS}")


async def _stream(
    cluster: CampaignCluster,
    settings: Settings,
    outcome: Outcome,
    latencies: list[float],
    problems: list[dict[str, Any]],
    stop: asyncio.Event,
    jobs: asyncio.TaskGroup,
) -> None:
    """A job every ``job_gap_s`` until ``stop``, each to the next worker in turn (a fresh
    connection each, as behind a load balancer), failing over to the others; the latency of
    each answered one in ``latencies`` (ms), what went wrong with the others in ``problems``."""

    async def routed(i: int) -> None:
        start = time.monotonic()
        addresses = [w.address for w in cluster.workers]
        first = i % len(addresses)
        order = addresses[first:] + addresses[:first]
        result: BaseException | None
        try:
            async with asyncio.timeout(JOB_BOUND_S):
                async with Client(order, token=cluster.token, retries=4) as client:
                    result = await submit_one(client, i)
        except TimeoutError:
            result = CompassTimeout(f"job {i} not answered within {JOB_BOUND_S:.0f} s")
        except (CompassError, OSError) as exc:
            result = exc
        outcome.count(result)
        if result is None:
            latencies.append((time.monotonic() - start) * 1e3)
        elif len(problems) < 200:
            problems.append({
                "i": i, "at_s": round(start - t0, 2), "via": cluster.workers[first].name,
                "error": type(result).__name__, "message": str(result)[:300],
                "job": getattr(result, "job_id", None),
            })  # fmt: skip

    t0 = time.monotonic()
    i = 0
    while not stop.is_set():
        jobs.create_task(routed(i))
        i += 1
        with contextlib.suppress(TimeoutError):  # paced from t0: a late tick is not made up
            await asyncio.wait_for(
                stop.wait(), max(t0 + i * settings.job_gap_s - time.monotonic(), 0)
            )


def _hosts(settings: Settings) -> tuple[netns.Namespaces | None, str | None]:
    """The namespaces to run in (None: loopback) and, without them, why there are no cuts."""
    if settings.netns == "off":
        return None, "--netns off: the workers run on loopback"
    reason = netns.unavailable()
    if reason is None:
        return netns.Namespaces(settings.workers + 1), None
    if settings.netns == "on":
        raise CompassError(f"--netns on, but network namespaces cannot be made here: {reason}")
    return None, f"the workers run on loopback ({reason})"


async def run_campaign(settings: Settings) -> Campaign:
    """Run one campaign; the worker processes are ended and the namespaces deleted after."""
    if settings.workers < 2:
        raise CompassError("a campaign needs at least 2 workers (a cut is between two)")
    hosts, cut_skipped = _hosts(settings)
    kinds = KINDS if hosts is not None else tuple(k for k in KINDS if k != "cut")
    unknown = [k for k in settings.forced if k not in kinds]
    if unknown:
        raise CompassError(f"cannot force {unknown[0]!r} here: the kinds are {', '.join(kinds)}")
    log_dir = settings.log_dir or Path(tempfile.mkdtemp(prefix="compass-campaign-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    result = Campaign(
        seed=settings.seed,
        duration_s=settings.duration_s,
        workers=settings.workers,
        hosts="loopback" if hosts is None else "network namespaces",
        cut_skipped=cut_skipped,
        applied=dict.fromkeys(kinds, 0),
        log_dir=str(log_dir),
    )
    cluster: CampaignCluster | None = None
    try:
        if hosts is not None:
            hosts.build()
            hosts.enter(settings.workers)  # the host after the workers': the client's
        cluster = CampaignCluster(
            settings.workers, hosts=hosts, env=settings.env, log_dir=log_dir,
            args=[*WORKER_ARGS, *settings.worker_args],
        )  # fmt: skip
        await cluster.start()
        keys = AnswerKeys(cluster, clear=True)
        faults = _Faults(cluster, keys, settings, result, kinds)
        stop_stream, stop_keys = asyncio.Event(), asyncio.Event()
        latencies: list[float] = []
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as watching:
            watching.create_task(keys.watch(stop_keys))
            async with asyncio.TaskGroup() as jobs:
                stream = _stream(
                    cluster, settings, result.jobs, latencies, result.problems, stop_stream, jobs
                )
                jobs.create_task(stream)
                await faults.run(t0)
                stop_stream.set()
            # every job answered (or counted hung): the views once more
            last = result.faults[-1].view_s if result.faults else 0.0
            result.last_view_s = last
            still = await views_whole(cluster, time.monotonic())
            result.views_whole = last is not None and still is not None
            stop_keys.set()
        result.ran_s = round(time.monotonic() - t0, 1)
        result.jobs.twice = keys.twice()
        result.slow_records = keys.slow
        result.latency_ms = _percentiles(latencies)
    finally:
        try:
            if cluster is not None:
                result.exit_codes = await cluster.aclose()
        finally:
            if hosts is not None:
                hosts.close()
    result.log_error_lines = _log_errors(log_dir)
    result.log_errors = len(result.log_error_lines)
    del result.log_error_lines[10:]
    return result


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    last = len(ordered) - 1
    return {
        "p50": round(ordered[min(int(0.5 * len(ordered)), last)], 1),
        "p99": round(ordered[min(int(0.99 * len(ordered)), last)], 1),
        "max": round(ordered[last], 1),
    }


def _log_errors(log_dir: Path) -> list[str]:
    """The lines of the workers' logs at ERROR level or above, and each traceback's first."""
    found = []
    for path in sorted(log_dir.glob("w*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback"):
                found.append(f"{path.name}: {line}")
    return found


def run(settings: Settings, json_path: str | None = None) -> Campaign:
    """Run a campaign; print its table, write JSON."""
    result = asyncio.run(run_campaign(settings))
    _print(result)
    data: dict[str, Any] = {
        "config": {
            "worker_args": WORKER_ARGS,
            "job_gap_s": settings.job_gap_s,
            "gap_s": list(settings.gap_s),
            "forced": list(settings.forced),
            "worker_args_more": list(settings.worker_args),
            "pause_s": list(PAUSE_S),
            "cut_s": list(CUT_S),
            "job_timeout_s": JOB_TIMEOUT_S,
            "view_limit_s": VIEW_LIMIT_S,
        },
        "results": [{**asdict(result), "passed": result.passed}],
    }
    write_json(json_path, data, announce=False)
    return result


def _print(c: Campaign) -> None:
    rows: list[list[Any]] = []
    for kind, count in c.applied.items():
        faults = [f for f in c.faults if f.kind == kind]
        views = [f.view_s for f in faults if f.view_s is not None]
        held = [f.held_s for f in faults if f.held_s is not None]
        rows.append([
            kind, count, statistics.median(held) if held else None,
            statistics.median(views) if views else None, max(views) if views else None,
            len(faults) - len(views),
        ])  # fmt: skip
    title = (
        f"campaign: seed {c.seed}, {c.duration_s:.0f} s, {c.workers} workers ({c.hosts}), "
        f"ran {c.ran_s:.0f} s"
    )
    columns = ["fault", "applied", "held (median s)", "views whole after: median s", "max s",
               f"not within {VIEW_LIMIT_S:.0f} s"]  # fmt: skip
    print_table(title, columns, rows)
    o = c.jobs
    errors = f" {o.errors}" if o.errors else ""
    print(
        f"jobs {o.jobs}: ok {o.ok}, failed {o.failed}{errors}, hung {o.hung}, twice {o.twice}; "
        f"views whole at the end: {'yes' if c.views_whole else 'NO'} (after the last fault: "
        f"{'never' if c.last_view_s is None else f'{c.last_view_s:.2f} s'})"
    )
    if c.latency_ms:
        lat = c.latency_ms
        print(f"answered jobs' latency: p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms, "
              f"max {lat['max']:.0f} ms")  # fmt: skip
    if c.log_errors:
        print(f"{c.log_errors} error lines in the workers' logs, the first: {c.log_error_lines[0]}")
    drains = [f for f in c.faults if f.kind == "restart" and f.exit_code not in (0, None)]
    if drains:
        print(
            f"graceful restarts that did not exit 0: {[(f.targets, f.exit_code) for f in drains]}"
        )
    for f in c.faults:
        if f.drain_queue is not None:
            print(f"  restart of {f.targets[0]} at {f.at_s:.1f} s drained for {f.stop_s} s; "
                  f"{SLOW_DRAIN_S:.0f} s in, its queues: {f.drain_queue}")  # fmt: skip
    for p in c.problems[:20]:
        before = [f for f in c.faults if f.at_s <= p["at_s"] + JOB_TIMEOUT_S]
        near = (
            f"{before[-1].kind} of {before[-1].targets} at {before[-1].at_s:.1f} s"
            if before
            else "-"
        )
        print(f"  job {p['i']} sent at {p['at_s']:.1f} s via {p['via']}: {p['error']} "
              f"(the last fault before its timeout: {near})")  # fmt: skip
    if c.slow_records:
        print(f"{len(c.slow_records)} answer records of jobs that failed or took "
              f"{SLOW_S:.0f} s or more (in the JSON)")  # fmt: skip
    if c.aborted:
        print(f"stopped early: {c.aborted}")
    if c.cut_skipped:
        print(f"no cut links: {c.cut_skipped}")
    print(f"{'PASS' if c.passed else 'FAIL'} (0 hung, 0 twice, views whole); worker logs in "
          f"{c.log_dir}", flush=True)  # fmt: skip
