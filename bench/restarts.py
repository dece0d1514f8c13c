"""Restarts lose nothing: the operational events of a deployment, on real worker processes.

Each scenario starts its own local cluster (emulated paper workload, round robin so that every
worker holds tasks of every ingress), does what an operator or an orchestrator does, and counts
what happened to the jobs submitted meanwhile:

- ``same_name``: a worker stopped (SIGTERM) and started again with the same command; jobs
  submitted to it afterwards;
- ``crash_loop``: a worker killed (SIGKILL) and started again within a second, five times;
- ``seed_restart``: three workers that all ``--join`` the first (DEPLOY.md's pattern), the seed
  stopped and started again with the same flags; the time until every view is whole;
- ``drain``: a worker with queued work stopped with Ctrl-C (SIGINT) while a client that knows
  both workers has jobs in flight there: their answers, and the worker's exit time;
- ``rolling``: every worker of four restarted in turn (SIGTERM, wait for the exit, start with
  the same name and flags) under a steady stream of jobs dealt to the workers in turn, as a
  load balancer would (each job fails over to the next worker while its own is away);
- ``campaign`` (:mod:`bench.campaign`, run alone): random faults, one at a time, for minutes
  (kill, pause, graceful restart, cut link) under such a stream.

A job is ``ok`` (answered with its result), ``failed`` (answered with an error), ``hung`` (no
answer within its timeout) or run ``twice`` (two ingresses answered the same job key: the
ingresses' traces, read every 100 ms, name each job's key). ``view_s`` is the time from the last
restart until every worker has every other as a peer and in its view (``None``: not within the
limit). ``worker_pythonpath`` runs the workers from another checkout (to measure a commit
before a fix with the same driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from compass import Client, LocalCluster
from compass.cluster import WorkerProcess
from compass.errors import CompassError, CompassTimeout

from .report import write_json

__all__ = [
    "SCENARIOS",
    "AnswerKeys",
    "Fleet",
    "Outcome",
    "free_port",
    "run",
    "run_scenario",
    "submit_one",
    "views_whole",
    "worker_env",
]

PAPER = str(Path(__file__).resolve().parent / "workloads" / "paper.json")
FLOWS = ("translation", "question_answer", "img_to_sound", "object_detection")
WORKER_ARGS = [
    "--workload", PAPER, "--time-scale", "0.02", "--policy", "round_robin",
    "--heartbeat-ms", "20", "--peer-timeout-ms", "1000",
]  # fmt: skip
#: the emulated workers' time scale: real seconds per second of the workload's time
TIME_SCALE = float(WORKER_ARGS[WORKER_ARGS.index("--time-scale") + 1])
#: a job not answered within this is counted hung
JOB_TIMEOUT_S = 20.0
#: a job answered after this long is slow (its answer record is kept)
SLOW_S = 10.0
#: how long a view may take to be whole again before the scenario says it never was
VIEW_LIMIT_S = 15.0


class Fleet(Protocol):
    """What the counting below reads: the worker processes, and a client for each
    (:class:`~compass.LocalCluster`, or the campaign's workers in network namespaces)."""

    workers: list[WorkerProcess]

    def client(self, index: int) -> Client: ...


@dataclass
class Outcome:
    """What happened to a scenario's jobs, and how long the views took to be whole."""

    scenario: str
    jobs: int = 0
    ok: int = 0
    failed: int = 0
    hung: int = 0
    twice: int = 0
    view_s: float | None = None
    exit_s: float | None = None  # drain: SIGTERM to exit
    errors: dict[str, int] = field(default_factory=dict)

    def count(self, result: BaseException | None) -> None:
        self.jobs += 1
        if result is None:
            self.ok += 1
        elif isinstance(result, CompassTimeout):
            self.hung += 1
        else:
            self.failed += 1
            name = type(result).__name__
            self.errors[name] = self.errors.get(name, 0) + 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def submit_one(client: Client, i: int) -> BaseException | None:
    """Job ``i`` (the workflows in turn) through ``client``: None once answered, else the
    error it was answered with."""
    try:
        await client.submit(FLOWS[i % 4], data=np.zeros(256, np.uint8), timeout=JOB_TIMEOUT_S)
    except CompassError as exc:
        return exc
    return None


async def _jobs(client: Client, count: int, outcome: Outcome) -> None:
    for result in await asyncio.gather(*(submit_one(client, i) for i in range(count))):
        outcome.count(result)


async def views_whole(cluster: Fleet, since: float, limit_s: float = VIEW_LIMIT_S) -> float | None:
    """Seconds from ``since`` until every worker has every other as a peer and in its view
    (looked at once at least, however long ago ``since`` was); None past ``limit_s``."""
    names = sorted(w.name for w in cluster.workers)
    deadline = max(since + limit_s, time.monotonic())
    while True:
        with contextlib.suppress(CompassError, OSError):
            statuses = await asyncio.gather(*(_status(cluster, i) for i in range(len(names))))
            if all(
                sorted(p["name"] for p in s["peers"]) == sorted(set(names) - {s["name"]})
                and sorted(r["name"] for r in s["cluster"]) == names
                for s in statuses
            ):
                return round(time.monotonic() - since, 2)
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.05)


async def _status(cluster: Fleet, index: int) -> dict[str, Any]:
    async with cluster.client(index) as client:
        return (await client.status(timeout=2.0)).to_json()


class AnswerKeys:
    """Reads every worker's trace while a scenario runs: which job ids answered each key.

    ``clear``: each read empties the trace it read, so a long run reads only what is new; a
    read then waits up to 10 s (a worker stopped for a while answers it when it goes on: one
    given up on would have emptied its trace into a closed connection)."""

    def __init__(self, cluster: Fleet, *, clear: bool = False) -> None:
        self.cluster = cluster
        self.clear = clear
        self.by_key: dict[str, set[str]] = {}
        #: the answer records of jobs that failed or took SLOW_S or more (the first 200): a
        #: job the client gave up on has one too, with the id the workers' logs name it by
        self.slow: list[dict[str, Any]] = []

    async def poll(self) -> None:
        await asyncio.gather(*(self.poll_one(i) for i in range(len(self.cluster.workers))))

    async def poll_one(self, index: int) -> None:
        """Read worker ``index``'s trace (nothing if it is not running)."""
        if not self.cluster.workers[index].running:
            return
        timeout = 10.0 if self.clear else 2.0
        with contextlib.suppress(CompassError, OSError):
            async with self.cluster.client(index) as client:
                records = await client.records(clear=self.clear, timeout=timeout)
            for record in records:
                if record.key:
                    self.by_key.setdefault(record.key, set()).add(record.job)
                # an emulated worker's core keeps the workload's time
                real_s = record.latency_s * TIME_SCALE
                if (not record.ok or real_s >= SLOW_S) and len(self.slow) < 200:
                    self.slow.append({**record.to_json(), "latency_real_s": round(real_s, 2)})

    async def watch(self, stop: asyncio.Event) -> None:
        """Read each worker's trace every 100 ms (each on its own, so that one slow to answer
        holds up no other) until ``stop``, and once more after."""

        async def one(index: int) -> None:
            while not stop.is_set():
                await self.poll_one(index)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.1)

        async with asyncio.TaskGroup() as group:
            for index in range(len(self.cluster.workers)):
                group.create_task(one(index))
        await self.poll()

    def twice(self) -> int:
        return sum(1 for ids in self.by_key.values() if len(ids) > 1)


def _cluster(size: int, env: dict[str, str] | None, log_dir: Path | None) -> LocalCluster:
    return LocalCluster(size, args=WORKER_ARGS, env=env, log_dir=log_dir)


async def _seeded(cluster: LocalCluster, size: int) -> None:
    """Start ``size`` workers that all ``--join`` the first, the first included (DEPLOY.md)."""
    port = free_port()
    seed = f"127.0.0.1:{port}"
    await cluster.spawn("w0", join=seed, port=port)
    await asyncio.gather(*(cluster.spawn(f"w{i}", join=seed) for i in range(1, size)))
    await cluster.wait_joined()


async def same_name(env: dict[str, str] | None, log_dir: Path | None) -> Outcome:
    outcome = Outcome("same_name")
    cluster = _cluster(2, env, log_dir)
    async with cluster:
        async with cluster.client(1) as client:
            await _jobs(client, 12, Outcome("warm-up"))
        await cluster.restart(1)
        outcome.view_s = await views_whole(cluster, time.monotonic())
        async with cluster.client(1) as client:
            await _jobs(client, 12, outcome)
    return outcome


async def crash_loop(env: dict[str, str] | None, log_dir: Path | None) -> Outcome:
    outcome = Outcome("crash_loop")
    cluster = _cluster(2, env, log_dir)
    async with cluster:
        for round_ in range(5):
            async with cluster.client(1) as client:
                await _jobs(client, 4, Outcome("warm-up"))
            await cluster.restart(1, kill=True)
            if round_ == 4:
                outcome.view_s = await views_whole(cluster, time.monotonic())
            for index in (1, 0):
                async with cluster.client(index) as client:
                    await _jobs(client, 4, outcome)
    return outcome


async def seed_restart(env: dict[str, str] | None, log_dir: Path | None) -> Outcome:
    outcome = Outcome("seed_restart")
    cluster = _cluster(3, env, log_dir)
    try:
        await _seeded(cluster, 3)
        await cluster.restart(0)
        since = time.monotonic()
        outcome.view_s = await views_whole(cluster, since)
        for index in range(3):
            async with cluster.client(index) as client:
                await _jobs(client, 4, outcome)
    finally:
        await cluster.aclose()
    return outcome


async def drain(env: dict[str, str] | None, log_dir: Path | None) -> Outcome:
    outcome = Outcome("drain")
    cluster = _cluster(2, env, log_dir)
    async with cluster, Client(cluster.addresses, token=cluster.token) as client:
        jobs = [asyncio.ensure_future(submit_one(client, i)) for i in range(48)]
        await asyncio.sleep(0.2)  # submitted, and queued behind each other
        t0 = time.monotonic()
        worker = cluster.workers[0]
        worker.process.send_signal(signal.SIGINT)  # Ctrl-C drains as SIGTERM does
        await worker.process.wait()
        outcome.exit_s = round(time.monotonic() - t0, 2)
        for result in await asyncio.gather(*jobs):
            outcome.count(result)
    return outcome


async def rolling(env: dict[str, str] | None, log_dir: Path | None) -> Outcome:
    outcome = Outcome("rolling")
    cluster = _cluster(4, env, log_dir)
    try:
        await _seeded(cluster, 4)
        keys = AnswerKeys(cluster)
        stop_watch = asyncio.Event()
        watcher = asyncio.ensure_future(keys.watch(stop_watch))
        addresses = cluster.addresses
        jobs: list[asyncio.Future[BaseException | None]] = []
        streaming = asyncio.Event()

        async def routed(i: int) -> BaseException | None:
            # as behind a load balancer: each job to the next worker in turn, restarted ones
            # included, failing over to the others while that one is away
            first = i % len(addresses)
            order = addresses[first:] + addresses[:first]
            async with Client(order, token=cluster.token, retries=4) as client:
                return await submit_one(client, i)

        async def stream() -> None:
            i = 0
            while not streaming.is_set() and i < 4000:
                jobs.append(asyncio.ensure_future(routed(i)))
                i += 1
                await asyncio.sleep(0.025)

        feeders = [asyncio.ensure_future(stream())]
        await asyncio.sleep(1.0)
        for index in range(4):
            await cluster.restart(index)
        since = time.monotonic()
        await asyncio.sleep(1.0)
        streaming.set()
        await asyncio.gather(*feeders)
        for result in await asyncio.gather(*jobs):
            outcome.count(result)
        outcome.view_s = await views_whole(cluster, since)
        stop_watch.set()
        await watcher
        outcome.twice = keys.twice()
    finally:
        await cluster.aclose()
    return outcome


SCENARIOS: dict[str, Callable[[dict[str, str] | None, Path | None], Awaitable[Outcome]]] = {
    "same_name": same_name,
    "crash_loop": crash_loop,
    "seed_restart": seed_restart,
    "drain": drain,
    "rolling": rolling,
}


async def run_scenario(
    name: str, env: dict[str, str] | None = None, log_dir: Path | None = None
) -> Outcome:
    """Run one scenario on a fresh local cluster."""
    return await SCENARIOS[name](env, log_dir)


def worker_env(worker_pythonpath: str | None) -> dict[str, str] | None:
    """The workers' environment: this one (None), or with ``worker_pythonpath`` first."""
    if not worker_pythonpath:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = worker_pythonpath
    env["PYTHONSAFEPATH"] = "1"  # `python -m` would put the working directory first
    return env


def run(
    scenarios: list[str],
    *,
    worker_pythonpath: str | None = None,
    json_path: str | None = None,
    log_dir: str | None = None,
) -> list[Outcome]:
    """Run ``scenarios`` one after another; print a table, write JSON."""
    env = worker_env(worker_pythonpath)
    outcomes = []
    for name in scenarios:
        path = Path(log_dir) / name if log_dir else None
        outcome = asyncio.run(run_scenario(name, env, path))
        outcomes.append(outcome)
        print(_row(outcome), flush=True)
    config = {"worker_args": WORKER_ARGS, "worker_pythonpath": worker_pythonpath}
    results = {"config": config, "results": [asdict(o) for o in outcomes]}
    write_json(json_path, results, announce=False)
    return outcomes


def _row(o: Outcome) -> str:
    view = "never" if o.view_s is None else f"{o.view_s:.2f} s"
    if o.exit_s is not None:  # a drain: one worker is gone for good
        view = "-"
    extra = f", exit {o.exit_s:.2f} s" if o.exit_s is not None else ""
    errors = f"  {o.errors}" if o.errors else ""
    return (
        f"{o.scenario:<13} jobs {o.jobs:>4}  ok {o.ok:>4}  hung {o.hung:>3}  failed {o.failed:>3}"
        f"  twice {o.twice:>2}  view whole {view}{extra}{errors}"
    )
