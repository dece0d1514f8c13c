"""``compass bench soak``: a local cluster under a steady stream of jobs for minutes, or a
million jobs, with one worker drained and restarted on the way; whether every job was answered
once, and whether the workers' memory and tables stayed flat.

The cluster runs the paper's workload emulated (``--workload``, a small ``--time-scale``), so
tasks materialize payloads of their declared output sizes (2 KB to 3 MB: the image and sound
workflows answer 3 MB). Jobs go to the workers in turn, as a load balancer deals them (one
:class:`~compass.Client` per worker, which knows every worker and fails over); a seeded share
carries a real 1 MiB numpy input instead of 256 bytes, and another share a deadline
(``deadline_ms``, a multiple of the workflow's best time). At most ``in_flight`` jobs are out
at once and ``rate`` are offered per second; the driver keeps counters, never a list of jobs,
so ``--jobs 1000000`` runs in flat memory (its own RSS is sampled too).

A third of the way in (by time or by jobs, whichever is further), the last worker is drained
and restarted as a supervisor would: SIGTERM, its exit waited for, the same command again
(same name, port and flags); its client then connects to it again. A third, not the middle,
so that the second half, whose memory is judged, starts with the new process warmed up.

Every ``sample_s`` the driver reads each worker's ``compass status``: its ``process``
(``rss_mb``, ``open_fds``, ``asyncio_tasks``, ``threads``) and the sizes of its ``tables``
(:mod:`compass.observe.usage`), kept as the JSON's ``samples``. Past ``MAX_SAMPLES`` per series
every other sample is dropped and the period doubled, so long runs keep a bounded series.

What it judges (the JSON's ``checks``):

- every job answered once: ``submitted == ok + failed + hung``, where ``failed`` is an error
  answer (a typed one: ``untyped`` counts those that were not a CompassError) and ``hung`` no
  answer within ``job_timeout_s``; ``hung == 0``;
- none ``twice``: the ingresses' answer records (the ``trace`` request, read and cleared every
  half second) name each job's key; a key answered under two job ids ran twice. Keys are kept
  for ``4 x job_timeout_s`` (a retry comes sooner), so this table is bounded too. Records a
  restarted worker wrote after its last read are not seen;
- RSS flat: ``rss_growth_mb_second_half``, per worker, is the least-squares slope of its RSS
  against time over the second half of the run (the samples of its last process), times the
  second half's length; under ``RSS_LIMIT_MB``. ``rss_last_minus_middle_mb`` is given beside;
- no ``false_deaths``: a worker's warning "peer X removed: ..." counts as one unless X, or
  the worker that wrote it, was being restarted then (from the SIGTERM until every view was
  whole again, plus ``GRACE_S``); so does (as ``declared_dead``) a worker's notice that a peer
  had declared it dead, by the same rule. A suspicion the worker refuted in time is no death
  (nothing is re-planned for it): ``suspicions_refuted`` counts them, per worker, from their
  status;
- ``nothing_replanned``, in a run without a restart: no worker re-planned a job
  (``replans``, per worker, from their status): none was taken for gone;
- ``restarted``: the restarted worker was back and every view whole within ``VIEW_LIMIT_S``.

While it runs, a line every ``PROGRESS_S`` says how far it is (jobs submitted, answered, hung,
the rate, each worker's RSS), and with a JSON path the results so far are kept beside it
(``PATH.partial``: ``complete`` false, the counts and the samples, replaced with each progress
line) until the whole JSON is written: an hour-long run that dies near its end leaves its figures.

``worker_pythonpath`` runs the workers from another checkout (a before/after with the same
driver; an old worker without ``process`` in its status is read from ``/proc/<pid>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compass import Client, LocalCluster
from compass.errors import CompassError, CompassTimeout, ConfigError
from compass.observe.usage import process_usage
from compass.wire.transport import new_event_loop

from .report import machine, write_json
from .soak_logs import false_deaths
from .soak_report import SLOW_S, finish

__all__ = ["DEFAULT_DURATION_S", "JobCounts", "SoakConfig", "rss_growth_mb", "run", "soak"]

PAPER = str(Path(__file__).resolve().parent / "workloads" / "paper.json")
FLOWS = ("translation", "question_answer", "img_to_sound", "object_detection")
#: a run given neither a job count nor a duration lasts this long
DEFAULT_DURATION_S = 600.0
#: the most RSS a worker may gain over the second half of the run
RSS_LIMIT_MB = 20.0
#: samples kept per series before every other one is dropped
MAX_SAMPLES = 1500
#: seconds between two progress lines
PROGRESS_S = 60.0
#: after a restart, losses of the restarted worker are expected this much longer
GRACE_S = 2.0
#: how long a restarted cluster may take to have every view whole again
VIEW_LIMIT_S = 30.0
TRACE_POLL_S = 0.5
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """One soak. ``jobs`` and ``duration_s``: it ends at whichever comes first (neither:
    :data:`DEFAULT_DURATION_S`). ``rate``: jobs offered per second (0: as fast as
    ``in_flight`` allows). ``big_share`` of the jobs carry ``big_bytes`` of real input,
    ``deadline_share`` a deadline of ``deadline_x`` times their workflow's best time."""

    workers: int = 3
    jobs: int | None = None
    duration_s: float | None = None
    in_flight: int = 16
    rate: float = 10.0
    big_share: float = 0.25
    big_bytes: int = MiB
    deadline_share: float = 0.2
    deadline_x: float = 4.0
    restart: bool = True
    time_scale: float = 0.02
    sample_s: float = 2.0
    job_timeout_s: float = 30.0
    seed: int = 0
    workload: str = PAPER
    worker_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.restart and self.workers < 2:
            raise ConfigError(
                "--workers 1 with a restart: nobody would take the jobs while it is away "
                "(give --workers 2 or more, or --no-restart)"
            )
        if self.jobs is not None and self.jobs < 1:
            raise ConfigError(f"--jobs must be at least 1, got {self.jobs}")
        if self.duration_s is not None and not 0 < self.duration_s < math.inf:
            raise ConfigError(
                f"--duration-s must be a number of seconds > 0, got {self.duration_s}"
            )
        if self.in_flight < 1:
            raise ConfigError(f"--in-flight must be at least 1, got {self.in_flight}")
        if not 0 <= self.rate < math.inf:
            raise ConfigError(f"--rate must be jobs per second >= 0, got {self.rate}")
        for name, share in (("big_share", self.big_share), ("deadline_share", self.deadline_share)):
            if not 0 <= share <= 1:
                raise ConfigError(f"{name} must be in [0, 1], got {share}")
        if self.big_bytes < 1:
            raise ConfigError(f"big_bytes must be at least 1, got {self.big_bytes}")
        if not 1 <= self.deadline_x < math.inf:
            raise ConfigError(f"deadline_x must be >= 1, got {self.deadline_x}")
        if not 0 < self.time_scale <= 10:
            raise ConfigError(f"--time-scale must be in (0, 10], got {self.time_scale}")
        if not 0 < self.sample_s < math.inf:
            raise ConfigError(f"--sample-s must be a number of seconds > 0, got {self.sample_s}")
        if not 0 < self.job_timeout_s < math.inf:
            raise ConfigError(f"job_timeout_s must be > 0, got {self.job_timeout_s}")

    @property
    def limit_s(self) -> float | None:
        """The run's length in seconds, if it has one."""
        if self.duration_s is None and self.jobs is None:
            return DEFAULT_DURATION_S
        return self.duration_s

    def args(self) -> list[str]:
        """``compass worker start`` flags of every worker."""
        return [
            "--workload", self.workload, "--time-scale", str(self.time_scale),
            *self.worker_args,
        ]  # fmt: skip


@dataclass
class JobCounts:
    """What happened to the jobs (the JSON's ``jobs``)."""

    submitted: int = 0
    ok: int = 0
    failed: int = 0
    hung: int = 0
    twice: int = 0
    #: failed with an error that is not a CompassError
    untyped: int = 0
    big: int = 0
    with_deadline: int = 0
    #: answered (either way) after more than SLOW_S, and the longest wait for an answer
    slow: int = 0
    max_latency_s: float = 0.0
    #: answer records read from the ingresses (a job run twice has two)
    ingress_records: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class _Keys:
    """The ingresses' answer records, by job key, for ``window_s``: a key answered under two
    job ids ran twice."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.twice = 0
        self.records = 0

    def add(self, key: str, job: str, now: float) -> None:
        self.records += 1
        known = self._seen.get(key)
        if known is None:
            self._seen[key] = (job, now)
        elif known[0] and known[0] != job:
            self.twice += 1
            self._seen[key] = ("", known[1])  # counted: a third run is not a second twice

    def expire(self, now: float) -> None:
        seen = self._seen
        while seen and next(iter(seen.values()))[1] < now - self.window_s:
            seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


@dataclass
class _Restart:
    worker: str
    index: int
    at_s: float = 0.0
    exit_s: float | None = None
    back_s: float | None = None
    view_s: float | None = None
    #: why it could not be started again (the run goes on without it)
    error: str | None = None
    #: wall-clock window in which losses of this worker are expected
    window: tuple[float, float] = (0.0, 0.0)


class _Soak:
    """One run: the stream, the sampler, the key watcher and the restart, over ``cluster``."""

    def __init__(
        self, config: SoakConfig, cluster: LocalCluster, checkpoint: Path | None = None
    ) -> None:
        self.config = config
        self.cluster = cluster
        #: where the results so far are kept with each progress line (None: nowhere)
        self.checkpoint = checkpoint
        self._told = 0.0  # when the last progress line was printed
        self.counts = JobCounts()
        self.keys = _Keys(4 * config.job_timeout_s)
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.sample_s = config.sample_s
        self.restart: _Restart | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._rng = random.Random(config.seed)
        data = np.random.default_rng(config.seed).integers(0, 256, config.big_bytes, np.uint8)
        data.setflags(write=False)
        self._big = data  # one array, sent by every big job: the driver holds no copies
        self._small = np.zeros(256, np.uint8)
        with open(config.workload, encoding="utf-8") as spec:
            flows = json.load(spec)["workflows"]
        self._flows = [name for name in FLOWS if name in flows] or sorted(flows)
        self._best_ms = {name: float(flows[name].get("best_ms", 0.0)) for name in self._flows}
        self._clients: list[Client] = []
        self._retired: list[Client] = []
        self._slots = asyncio.Semaphore(config.in_flight)
        self._stop = asyncio.Event()
        self.t0 = 0.0
        self.wall0 = 0.0
        self.elapsed_s = 0.0

    # -- the stream ---------------------------------------------------------------------------
    def _client_for(self, index: int) -> Client:
        addresses = self.cluster.addresses
        order = addresses[index:] + addresses[:index]
        return Client(order, token=self.cluster.token, retries=4)

    def _progress(self, submitted: int, elapsed: float) -> float:
        config, parts = self.config, []
        if config.jobs is not None:
            parts.append(submitted / config.jobs)
        limit = config.limit_s
        if limit is not None:
            parts.append(elapsed / limit)
        return max(parts)

    async def run(self) -> None:
        config = self.config
        self._clients = [self._client_for(i) for i in range(config.workers)]
        loop = asyncio.get_running_loop()
        self.t0, self.wall0 = loop.time(), time.time()
        watcher = asyncio.create_task(self._watch_keys())
        sampler = asyncio.create_task(self._sample_loop())
        try:
            async with asyncio.TaskGroup() as group:
                i = 0
                while self._progress(i, loop.time() - self.t0) < 1.0:
                    if config.rate:
                        delay = self.t0 + i / config.rate - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    await self._slots.acquire()
                    group.create_task(self._job(i))
                    i += 1
                    if (
                        config.restart
                        and self._restart_task is None
                        and self._progress(i, loop.time() - self.t0) >= 1 / 3
                    ):
                        self._restart_task = group.create_task(self._restart())
            self.elapsed_s = loop.time() - self.t0
        finally:
            self._stop.set()
            await asyncio.gather(watcher, sampler, return_exceptions=True)
            for client in [*self._clients, *self._retired]:
                await client.aclose()
        await self._sample()  # the last sample, after the stream
        await self._poll_keys()

    def _choose(self, i: int) -> tuple[str, bool, float | None]:
        rng, config = self._rng, self.config
        flow = rng.choice(self._flows)
        big = rng.random() < config.big_share
        deadline_ms = None
        if rng.random() < config.deadline_share:
            deadline_ms = config.deadline_x * self._best_ms[flow] * config.time_scale
        return flow, big, deadline_ms or None

    async def _job(self, i: int) -> None:
        counts, config = self.counts, self.config
        flow, big, deadline_ms = self._choose(i)
        client = self._clients[i % len(self._clients)]
        counts.submitted += 1
        counts.big += big
        counts.with_deadline += deadline_ms is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await client.submit(
                flow, timeout=config.job_timeout_s, deadline_ms=deadline_ms,
                data=self._big if big else self._small,
            )  # fmt: skip
        except CompassTimeout:
            counts.hung += 1
        except Exception as exc:  # every answer counts: a typed error, or not
            counts.failed += 1
            counts.untyped += not isinstance(exc, CompassError)
            name = type(exc).__name__
            counts.errors[name] = counts.errors.get(name, 0) + 1
        else:
            counts.ok += 1
        finally:
            self._slots.release()
            waited = loop.time() - started
            counts.slow += waited > SLOW_S
            counts.max_latency_s = round(max(counts.max_latency_s, waited), 3)

    # -- the restart --------------------------------------------------------------------------
    async def _restart(self) -> None:
        """Drain and restart the last worker as a supervisor would; its client then connects
        to it again (the old one, failed over elsewhere, finishes its jobs and is closed at
        the end)."""
        cluster, loop = self.cluster, asyncio.get_running_loop()
        index = len(cluster.workers) - 1
        worker = cluster.workers[index]
        restart = self.restart = _Restart(worker.name, index, at_s=loop.time() - self.t0)
        started = time.time()
        await self._poll_keys()  # what it answered so far, before it goes
        t = loop.time()
        await worker.stop()  # SIGTERM: it drains, then exits
        restart.exit_s = round(loop.time() - t, 2)
        try:
            await cluster.restart(index)  # gone already: started again with the same command
        except CompassError as exc:
            restart.error = str(exc)
        else:
            restart.back_s = round(loop.time() - t, 2)
            restart.view_s = await self._views_whole(loop.time())
            self._retired.append(self._clients[index])
            self._clients[index] = self._client_for(index)
        restart.window = (started, time.time() + GRACE_S)

    async def _views_whole(self, since: float) -> float | None:
        """Seconds from ``since`` until every worker has every other as a peer."""
        names = sorted(w.name for w in self.cluster.workers)
        loop = asyncio.get_running_loop()
        while loop.time() < since + VIEW_LIMIT_S:
            with contextlib.suppress(CompassError, OSError):
                statuses = await asyncio.gather(*(self._status(i) for i in range(len(names))))
                if all(
                    sorted(p["name"] for p in s["peers"]) == sorted(set(names) - {s["name"]})
                    for s in statuses
                ):
                    return round(loop.time() - since, 2)
            await asyncio.sleep(0.1)
        return None

    # -- what the workers hold ----------------------------------------------------------------
    async def _status(self, index: int) -> dict[str, Any]:
        async with self.cluster.client(index) as client:
            return (await client.status(timeout=5.0)).to_json()

    async def _sample_loop(self) -> None:
        while not self._stop.is_set():
            await self._sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.sample_s)

    async def _sample(self) -> None:
        t = round(asyncio.get_running_loop().time() - self.t0, 2)
        driver = process_usage()
        self._keep("driver", {"t": t, "rss_mb": driver["rss_mb"], "keys": len(self.keys)})
        for index, worker in enumerate(self.cluster.workers):
            if not worker.running:
                continue
            try:
                status = await self._status(index)
            except (CompassError, OSError):
                continue  # stopping or starting: no sample this time
            self._keep(worker.name, _worker_sample(t, status, worker.process.pid))
        if len(self.samples["driver"]) > MAX_SAMPLES:
            for name, series in self.samples.items():
                self.samples[name] = series[::2]
            self.sample_s *= 2
        if t - self._told >= PROGRESS_S:  # and the results so far, as often: not at each
            self._told = t  # sample (they are every sample kept, megabytes in a long run)
            print(self.progress_line(t), flush=True)
            if self.checkpoint is not None:
                self._keep_so_far(t, self.checkpoint)

    def progress_line(self, t: float) -> str:
        """How far the run is at ``t`` seconds: jobs, their rate, each worker's last RSS."""
        c = self.counts
        rss = ", ".join(
            f"{name} {series[-1]['rss_mb']:.0f}"
            for name, series in self.samples.items()
            if name != "driver" and series
        )
        rate = f"{c.submitted / t:,.0f} jobs/s" if t > 0 else "-"
        return (
            f"[{t:,.0f} s] submitted {c.submitted:,}, ok {c.ok:,}, failed {c.failed:,}, "
            f"hung {c.hung:,} ({rate}); RSS MB: {rss or '-'}"
        )

    def _keep_so_far(self, t: float, path: Path) -> None:
        """The results so far, at ``path`` (:func:`write_json`: whole, or the last ones)."""
        so_far = {"complete": False, "t": t, "jobs": asdict(self.counts), "samples": self.samples}
        write_json(str(path), so_far, announce=False)

    def _keep(self, name: str, sample: dict[str, Any]) -> None:
        self.samples.setdefault(name, []).append(sample)

    async def _poll_keys(self) -> None:
        now = time.monotonic()
        for index, worker in enumerate(self.cluster.workers):
            if not worker.running:
                continue
            with contextlib.suppress(CompassError, OSError):
                async with self.cluster.client(index) as client:
                    records = await client.records(clear=True, timeout=5.0)
                for record in records:
                    if record.key:
                        self.keys.add(record.key, record.job, now)
        self.keys.expire(now)

    async def _watch_keys(self) -> None:
        while not self._stop.is_set():
            await self._poll_keys()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), TRACE_POLL_S)


def _worker_sample(t: float, status: dict[str, Any], pid: int) -> dict[str, Any]:
    process = status.get("process") or _proc_usage(pid)  # a worker from before the field
    return {
        "t": t,
        "instance": status.get("instance", ""),
        "rss_mb": process.get("rss_mb"),
        "open_fds": process.get("open_fds"),
        "asyncio_tasks": process.get("asyncio_tasks"),
        "threads": process.get("threads"),
        "jobs_in_flight": status.get("jobs_in_flight"),
        "peers": len(status.get("peers", ())),
        "lost": len(status.get("lost", ())),
        "peers_lost": status.get("stats", {}).get("peers_lost"),
        "replans": status.get("stats", {}).get("replans"),
        "suspicions_refuted": status.get("stats", {}).get("suspicions_refuted"),
        "tables": status.get("tables", {}),
    }


def _counted(samples: list[dict[str, Any]], counter: str) -> int:
    """What a worker's ``counter`` counted over its samples, its processes' counts summed (a
    restarted worker counts from 0 again)."""
    total, last = 0, 0
    for sample in samples:
        value = sample.get(counter)
        if value is None:
            continue
        total += value - last if value >= last else value
        last = value
    return total


def _proc_usage(pid: int) -> dict[str, Any]:
    """RSS, fds and threads of process ``pid`` read from ``/proc`` (Linux)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = round(int(line.split()[1]) * 1024 / 1e6, 1)
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["open_fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


# -- judging ----------------------------------------------------------------------------------


def rss_growth_mb(series: Sequence[dict[str, Any]], end_s: float) -> float | None:
    """MB gained over the second half of a run ending at ``end_s``: the least-squares slope
    of ``rss_mb`` against ``t`` over the samples from ``end_s / 2`` (those of the last
    process, by ``instance``), times ``end_s / 2``. None with fewer than three samples."""
    if not series:
        return None
    last = series[-1].get("instance", "")
    points = [
        (s["t"], s["rss_mb"])
        for s in series
        if s["t"] >= end_s / 2 and s.get("instance", "") == last and s.get("rss_mb") is not None
    ]
    if len(points) < 3:
        return None
    t = np.array([p[0] for p in points], dtype=float)
    rss = np.array([p[1] for p in points], dtype=float)
    if np.ptp(t) == 0:
        return None
    slope = np.polyfit(t, rss, 1)[0]
    return round(float(slope) * end_s / 2, 1)


def _last_minus_middle(series: Sequence[dict[str, Any]], end_s: float) -> float | None:
    """RSS at the last sample minus RSS at the first sample of the second half (same process)."""
    if not series:
        return None
    last = series[-1]
    second = [
        s for s in series if s["t"] >= end_s / 2 and s.get("instance", "") == last.get("instance")
    ]
    if len(second) < 2 or last.get("rss_mb") is None or second[0].get("rss_mb") is None:
        return None
    return round(float(last["rss_mb"]) - float(second[0]["rss_mb"]), 1)


# -- the run ----------------------------------------------------------------------------------


async def soak(
    config: SoakConfig,
    *,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Run one soak on a fresh local cluster; its results (the JSON, see the module docstring).
    ``checkpoint``: where the results so far are kept meanwhile."""
    cluster = LocalCluster(config.workers, args=config.args(), env=env, log_dir=log_dir)
    async with cluster:
        run = _Soak(config, cluster, checkpoint)
        await run.run()
        restarts = [(r.worker, *r.window) for r in [run.restart] if r is not None]
        lost, declared, events = false_deaths(
            [w.log_path for w in cluster.workers], restarts, run.wall0
        )
    counts = run.counts
    counts.twice = run.keys.twice
    counts.ingress_records = run.keys.records
    end_s = max((s["t"] for s in run.samples.get("driver", [])), default=run.elapsed_s)
    names = [w.name for w in cluster.workers]
    growth = {n: rss_growth_mb(run.samples.get(n, []), end_s) for n in names}
    middle = {n: _last_minus_middle(run.samples.get(n, []), end_s) for n in names}
    replans = {n: _counted(run.samples.get(n, []), "replans") for n in names}
    checks = {
        "every_job_answered_once": counts.submitted == counts.ok + counts.failed + counts.hung,
        "none_hung": counts.hung == 0,
        "none_twice": counts.twice == 0,
        "errors_typed": counts.untyped == 0,
        "rss_flat": all(g is not None and g < RSS_LIMIT_MB for g in growth.values()),
        "no_false_deaths": lost == 0 and declared == 0,
    }
    if run.restart is not None:  # back, and every view whole again
        checks["restarted"] = run.restart.view_s is not None
    else:  # no worker left: a busy one was never taken for gone
        checks["nothing_replanned"] = sum(replans.values()) == 0
    return {
        "config": {
            **asdict(config),
            "limit_s": config.limit_s,
            "worker_args": config.args(),
            "machine": machine(),
            "rss_limit_mb": RSS_LIMIT_MB,
        },
        "jobs": asdict(counts),
        "duration_s": round(run.elapsed_s, 2),
        "jobs_per_s": round(counts.submitted / run.elapsed_s, 2) if run.elapsed_s else None,
        "restart": None if run.restart is None else _restart_json(run.restart),
        "rss_growth_mb_second_half": growth,
        "rss_growth_method": (
            "least-squares slope of RSS against time over the second half of the run (samples "
            "of the worker's last process), times the second half's length"
        ),
        "rss_last_minus_middle_mb": middle,
        "driver_rss_growth_mb_second_half": rss_growth_mb(run.samples.get("driver", []), end_s),
        "false_deaths": lost,
        "false_death_events": events,
        "declared_dead": declared,
        "suspicions_refuted": {
            n: _counted(run.samples.get(n, []), "suspicions_refuted") for n in names
        },
        "replans": replans,
        "checks": checks,
        "passed": all(checks.values()),
        "samples": run.samples,
    }


def _restart_json(r: _Restart) -> dict[str, Any]:
    return {
        "worker": r.worker, "at_s": round(r.at_s, 2), "exit_s": r.exit_s, "back_s": r.back_s,
        "view_s": r.view_s, "error": r.error,
    }  # fmt: skip


def run(
    config: SoakConfig,
    *,
    worker_pythonpath: str | None = None,
    json_path: str | None = None,
    plot_path: str | None = None,
    log_dir: str | None = None,
) -> dict[str, Any]:
    """Run one soak; print its table and verdict, write JSON and the RSS plot."""
    env = None
    if worker_pythonpath:
        env = dict(os.environ)
        env["PYTHONPATH"] = worker_pythonpath
        env["PYTHONSAFEPATH"] = "1"  # `python -m` would put the working directory first
    checkpoint = Path(f"{json_path}.partial") if json_path else None
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        out = runner.run(
            soak(
                config,
                env=env,
                log_dir=Path(log_dir) if log_dir else None,
                checkpoint=checkpoint,
            )
        )
    out["config"]["worker_pythonpath"] = worker_pythonpath
    finish(out, json_path, checkpoint, plot_path)
    return out
