"""``compass bench scale``: what the shared view costs each worker, as the cluster grows.

For each size it starts a real local cluster (:class:`~compass.cluster.LocalCluster`: one
``compass worker start`` process per worker on loopback) running the emulated paper workload
at ``time_scale`` with the default heartbeat settings, ``--view`` (``bounded``, the default,
or ``mesh``) and ``--host-lanes 0`` (as ``bench e2e``),
waits for the caches to settle (:func:`.e2e.settled`), then measures, in this order:

- **idle** (``seconds``, nothing submitted, the driver silent): ``idle_cpu_per_worker``, the
  CPU seconds per wall second of each worker process (``utime + stime`` from
  ``/proc/<pid>/stat``, every thread), averaged over the workers; ``messages_per_s_per_worker``
  and ``bytes_per_s_per_worker`` sent to peers; at the end ``connections_per_worker`` and
  ``rss_mb_per_worker`` (``VmRSS``, MB of 10^6 bytes).
- **spread** (``probes`` changes): ``spread_ms_p99``, below.
- **loaded** (``seconds``): a steady stream of paper jobs, ``jobs_per_s_per_worker`` per worker
  per real second (about a fifth of each worker's lane at the default time scale), dealt to
  the workers in turn as a load balancer would, ``seconds x rate x workers`` jobs in all:
  ``loaded_cpu_per_worker`` as above, over the stream's ``seconds``. The jobs still in flight
  are then waited for.
- **detect**: ``detect_ms``, below. The cluster is then stopped.

**Messages and bytes** come from the kernel, not from the workers (compass counts no messages
or bytes sent): ``ss -tine`` gives each TCP socket's ``tcp_info``, and the counters of a worker's
sockets to its peers are summed over the window (``bytes_sent`` and ``data_segs_out``, less
retransmissions). A *message* is a TCP segment carrying data: compass writes once per
connection per loop iteration, and on loopback (TCP_NODELAY, 64 KiB MTU) a write of a small
frame is one segment, so in the idle window, where every frame is a heartbeat, segments are
messages. A worker's peer sockets are its established connections whose other end is a socket
of another worker of the cluster (``/proc/net/tcp``, matched through the socket inodes in
``/proc/<pid>/fd``), so the driver's own connections count nowhere. Without ``ss`` both are
null.

**detect_ms**: the last worker is killed with SIGKILL; every survivor's ``status`` is polled
(one connection each, opened before the kill, a request every 2 ms) until the victim is
neither among its ``peers`` nor in its view (``cluster``); the time from the kill to the last
survivor's first such answer. A broken connection is no verdict for the failure detector (SWIM,
compass/membership/table.py): on one host the kernel closes the victim's sockets at once, so every
survivor probes it at once and suspects it within milliseconds, and this is mostly the
suspicion's length (``--suspicion-mult`` periods once confirmed; with two workers nobody can
confirm it, and it lasts up to ``--peer-timeout-ms``). Null if some survivor still has it after
15 s.

**spread_ms_p99**: how long a change of one worker's queue takes to be visible to the planners
that need it: in a full mesh every peer; in a bounded view the planners watching it (those
that planned over it within their lease, compass/gossip/spread.py). The workers' workload gets
two more workflows of one model-less task each: ``scale_probe``, ``PROBE_REAL_S`` real seconds
(a GPU-lane task under ``--host-lanes 0``, so it is in the queue wait that states report, and
it loads no model), and ``scale_touch``, 2 ms. On a quiet cluster (every queue empty, every
view showing every wait it hears of at 0; a bounded view's rows of workers it does not watch
are as last heard, and left out) the driver, in a bounded view, first has every worker plan
one touch job at once (so that each watches its candidates, as a cluster in use would), waits
for quiet again, then submits one probe job to the next worker in turn and polls every other
worker's ``status`` (one connection each, a request every 2 ms) until its view shows a wait
above 0 for some peer it watches. The worker ``X`` the probe ran on is read from the ingress's
``trace``, and its watchers from its ``status`` once the probe ended; for every other worker
``Y`` that needs ``X`` (above), one sample: the time ``Y`` received the state that first
showed ``X``'s wait (the answer's time less the age ``Y``'s view gives that state, so the
polling period does not count) less the time the probe was submitted. A sample therefore also
holds the submission and, when ``X`` is not the ingress, the push to ``X`` (about a
millisecond on an idle cluster): an upper bound. A worker that never showed it before the
probe ended counts the time until then (a lower bound), and a note is printed. p99 over every
probe and every peer that needed it (null: none did).

The JSON's ``config.notes`` hold, per size, what else the figures depend on: how busy the
whole machine was during the idle window (these workers and everything else), the messages a
worker would send if it heartbeated every peer every ``heartbeat_ms``, the probes' views that
never showed them and the loaded stream's failed jobs. A worker's CPU figure is what it got,
not what it asked for: once the machine is saturated (workers beyond the cores, or other work
beside them), a worker's heartbeat loop runs late, it sends fewer heartbeats than its period
asks (messages below ``heartbeat_messages_per_s``), its CPU per worker stops growing, and the
detection and spread times grow with the wait for a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compass.client import Client
from compass.cluster import LocalCluster
from compass.config import VIEWS, SchedConfig
from compass.errors import CompassError, ConfigError
from compass.sim.arrivals import Arrival, job_arrivals
from compass.wire.transport import new_event_loop
from compass.workflow.spec import Workload, load_workload

from .e2e import DEFAULT_WORKLOAD, replay, settled
from .fuzz import rss_bytes
from .report import machine, print_table, pyplot, save_figure, write_json

__all__ = [
    "PROBE",
    "ScaleConfig",
    "SizeResult",
    "cpu_seconds",
    "measure_size",
    "parse_sizes",
    "peer_sockets",
    "plot_scale",
    "print_scale",
    "probe_workload",
    "run",
    "sent_counters",
]

#: the workflow added to the workload for the spread probes, and its one task
PROBE = "scale_probe"
PROBE_TASK = "probe"
#: a bounded view's planners watch the candidates they plan over: before each probe every
#: worker plans one job of this workflow (one short model-less task), so each probe's change
#: has the watchers a cluster in use would give it
TOUCH = "scale_touch"
#: real seconds a touch task runs
TOUCH_REAL_S = 0.002
#: real seconds a probe task runs: a view that has not shown it by then counts this long
PROBE_REAL_S = 0.5
#: seconds between two status requests to one worker while a change or a loss is awaited
POLL_S = 0.002
#: how long every survivor may take to drop a killed worker before detect_ms is null
DETECT_LIMIT_S = 15.0
#: how long the cluster may take to be quiet (no queue, no wait in any view) before a probe
QUIET_LIMIT_S = 30.0
#: a job of the loaded stream not answered within this fails (and is reported)
JOB_TIMEOUT_S = 60.0
MB = 1e6


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    """What ``compass bench scale`` runs: cluster ``workers`` sizes, each measured idle and
    loaded for ``seconds``, with ``probes`` timed changes."""

    workers: tuple[int, ...] = (2, 4, 8, 16)
    seconds: float = 10.0
    probes: int = 20
    workload: str = DEFAULT_WORKLOAD
    time_scale: float = 0.25
    #: jobs of the loaded stream per worker per real second
    jobs_per_s_per_worker: float = 0.8
    seed: int = 0
    #: the workers' view (``compass worker start --view``): bounded or mesh
    view: str = "bounded"
    #: more ``compass worker start`` flags for every worker
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.workers or any(n < 2 for n in self.workers):
            raise ConfigError(
                f"--workers {','.join(map(str, self.workers))}: each size must be at least 2 "
                "(a worker is killed, and its peers must notice)"
            )
        if not 0 < self.seconds < math.inf:
            raise ConfigError(f"--seconds must be a finite number > 0, got {self.seconds}")
        if self.probes < 1:
            raise ConfigError(f"--probes must be at least 1, got {self.probes}")
        if self.view not in VIEWS:
            raise ConfigError(f"--view must be one of {', '.join(VIEWS)}, got {self.view!r}")
        if not 0 < self.time_scale <= 10:
            raise ConfigError(f"time_scale must be in (0, 10], got {self.time_scale}")
        if not 0 < self.jobs_per_s_per_worker < math.inf:
            raise ConfigError(
                f"jobs_per_s_per_worker must be a finite number > 0, got "
                f"{self.jobs_per_s_per_worker}"
            )

    def worker_args(self, spec: str) -> list[str]:
        return [
            "--workload", spec, "--time-scale", str(self.time_scale), "--host-lanes", "0",
            "--view", self.view, *self.extra_args,
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class SizeResult:
    """One cluster size's figures (the JSON's ``sizes`` entries, exactly these keys).

    CPU in cores (CPU seconds per wall second), per worker process; ``None`` where a figure
    could not be measured (no ``ss``; a killed worker some survivor never dropped)."""

    workers: int
    idle_cpu_per_worker: float
    loaded_cpu_per_worker: float
    messages_per_s_per_worker: float | None
    bytes_per_s_per_worker: float | None
    connections_per_worker: float
    rss_mb_per_worker: float
    detect_ms: float | None
    spread_ms_p99: float | None


@dataclass(frozen=True, slots=True)
class SizeNotes:
    """What else happened while one size was measured (the JSON's ``config.notes``)."""

    workers: int
    #: cores the whole machine kept busy during the idle window (these workers and the rest)
    machine_busy_cores_idle: float
    #: the idle window's messages per worker per second if every worker sent a heartbeat to
    #: each peer every ``heartbeat_ms``
    heartbeat_messages_per_s: float
    #: views that had not shown a probe by the time it ended (see the module docstring)
    probe_views_missed: int
    probe_views: int
    #: jobs of the loaded stream answered with an error, or not within JOB_TIMEOUT_S
    jobs_failed: int
    jobs: int
    seconds: float


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"2,4, 8"`` -> ``(2, 4, 8)``; a bad entry is a :class:`ConfigError`."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            sizes.append(int(part))
        except ValueError:
            raise ConfigError(
                f"--workers {text!r}: expected comma-separated sizes such as 2,4,8,16"
            ) from None
    if not sizes:
        raise ConfigError(f"--workers {text!r}: no size given")
    return tuple(sizes)


# -- what the kernel tells of a process -------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far, every thread (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        # the command name may hold spaces and parentheses: the fields start after the last ")"
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) so far,
    over every core (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is in user already)
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _CLOCK_TICKS


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    folder = f"/proc/{pid}/fd"
    for fd in os.listdir(folder):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(f"{folder}/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


_ESTABLISHED = "01"


def _established() -> dict[int, tuple[str, str]]:
    """Inode -> (local, remote endpoint, as /proc/net writes them) of every established TCP
    socket of this network namespace."""
    out: dict[int, tuple[str, str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            next(lines)  # the header
            for line in lines:
                cols = line.split()
                if cols[3] == _ESTABLISHED:
                    out[int(cols[9])] = (cols[1], cols[2])
    return out


def peer_sockets(pids: Sequence[int]) -> list[set[int]]:
    """For each process of ``pids``, the inodes of its established connections whose other end
    is a socket of another process of ``pids`` (a worker's connections to its peers)."""
    owned = [_socket_inodes(pid) for pid in pids]
    table = _established()
    owner_of_local = {
        table[inode][0]: i for i, inodes in enumerate(owned) for inode in inodes if inode in table
    }
    return [
        {
            inode
            for inode in inodes
            if inode in table and owner_of_local.get(table[inode][1], i) != i
        }
        for i, inodes in enumerate(owned)
    ]


_SS_FIELDS = {
    name: re.compile(rf"\b{name}:(\d+)")
    for name in ("ino", "bytes_sent", "bytes_retrans", "data_segs_out")
}
_SS_RETRANS = re.compile(r"\bretrans:\d+/(\d+)")


def sent_counters(inodes: set[int]) -> dict[int, tuple[int, int]] | None:
    """Inode -> (bytes, segments with data) sent so far, retransmissions left out, for each
    established TCP socket of ``inodes`` (from ``ss``); None without ``ss``."""
    ss = shutil.which("ss")
    if ss is None:
        return None
    text = subprocess.run(
        [ss, "-tineH", "state", "established"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    out: dict[int, tuple[int, int]] = {}
    # one socket: its line, then its tcp_info on indented lines
    for entry in re.split(r"\n(?=\S)", text):
        found = {k: p.search(entry) for k, p in _SS_FIELDS.items()}
        ino = found["ino"]
        if ino is None or int(ino[1]) not in inodes:
            continue
        count = {k: int(m[1]) if m else 0 for k, m in found.items()}
        retrans = _SS_RETRANS.search(entry)
        out[int(ino[1])] = (
            count["bytes_sent"] - count["bytes_retrans"],
            count["data_segs_out"] - (int(retrans[1]) if retrans else 0),
        )
    return out


@dataclass(frozen=True, slots=True)
class _Sample:
    """The workers' CPU seconds (and their peer sockets' counters) at one moment."""

    at: float
    cpu: tuple[float, ...]
    machine_s: float
    sent: tuple[dict[int, tuple[int, int]], ...] | None = None


def _sample(pids: Sequence[int], sockets: Sequence[set[int]] | None = None) -> _Sample:
    sent = None
    if sockets is not None:
        counters = sent_counters(set().union(*sockets))
        if counters is not None:
            sent = tuple({i: counters[i] for i in mine if i in counters} for mine in sockets)
    cpu = tuple(cpu_seconds(pid) for pid in pids)
    return _Sample(time.monotonic(), cpu, machine_busy_s(), sent)


def _cpu_per_worker(before: _Sample, after: _Sample) -> float:
    wall = after.at - before.at
    used = [b - a for a, b in zip(before.cpu, after.cpu, strict=True)]
    return sum(used) / wall / len(used)


def _sent_per_worker(before: _Sample, after: _Sample) -> tuple[float, float] | None:
    """(bytes, messages) per second per worker between two samples; sockets opened meanwhile
    count from 0."""
    if before.sent is None or after.sent is None:
        return None
    nbytes = segments = 0
    for old, new in zip(before.sent, after.sent, strict=True):
        for inode, (b, s) in new.items():
            b0, s0 = old.get(inode, (0, 0))
            nbytes += b - b0
            segments += s - s0
    scale = (after.at - before.at) * len(after.sent)
    return nbytes / scale, segments / scale


# -- one cluster size --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _clients(cluster: LocalCluster, indexes: Sequence[int]) -> AsyncIterator[list[Client]]:
    """One connected client to each worker of ``indexes``, closed on the way out."""
    clients = [cluster.client(i) for i in indexes]
    try:
        for client in clients:
            await client.connect()
        yield clients
    finally:
        for client in clients:
            await client.aclose()


def probe_workload(config: ScaleConfig, folder: Path) -> tuple[str, Workload]:
    """Write the workers' spec (``config.workload`` plus :data:`PROBE`) into ``folder``;
    its path, and the workload the loaded stream draws from (without the probe)."""
    workload = load_workload(config.workload)
    for name in (PROBE, TOUCH):
        if name in workload.workflows:
            raise ConfigError(f"{config.workload}: a workflow is named {name!r} already")
    spec = json.loads(Path(config.workload).read_text())
    for name, real_s in ((PROBE, PROBE_REAL_S), (TOUCH, TOUCH_REAL_S)):
        exec_ms = real_s * 1000.0 / config.time_scale
        spec["workflows"][name] = {
            "tasks": {
                PROBE_TASK: {"model": None, "exec_ms": exec_ms, "input_kb": 1, "output_kb": 1,
                             "after": []},
            }
        }  # fmt: skip
    path = folder / "workload.json"
    path.write_text(json.dumps(spec))
    return str(path), workload


def _payload(workload: Workload, workflow: str) -> dict[str, Any]:
    wf = workload.workflows[workflow]
    nbytes = max(wf.tasks[root].profile.input_bytes for root in wf.roots)
    return {"data": np.zeros(nbytes, dtype=np.uint8)}


async def _idle(cluster: LocalCluster, seconds: float) -> dict[str, Any]:
    pids = [w.process.pid for w in cluster.workers]
    sockets = peer_sockets(pids)
    before = _sample(pids, sockets)
    await asyncio.sleep(seconds)
    after = _sample(pids, peer_sockets(pids))
    sent = _sent_per_worker(before, after)
    return {
        "idle_cpu_per_worker": _cpu_per_worker(before, after),
        "bytes_per_s_per_worker": None if sent is None else sent[0],
        "messages_per_s_per_worker": None if sent is None else sent[1],
        "connections_per_worker": sum(map(len, peer_sockets(pids))) / len(pids),
        "rss_mb_per_worker": sum(rss_bytes(pid) for pid in pids) / len(pids) / MB,
        "machine_busy_cores": (after.machine_s - before.machine_s) / (after.at - before.at),
    }


def _watched(row: Mapping[str, Any]) -> bool:
    """Whether a view's row is of a worker the view hears on change (every row of a mesh; in
    a bounded view, the workers it watches: the others' rows are as last heard)."""
    return bool(row.get("watched", True))


async def _quiet(clients: Sequence[Client]) -> None:
    """Wait until no worker has work queued or running, and no view shows a wait (of a worker
    it watches)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_LIMIT_S
    while loop.time() < deadline:
        statuses = await asyncio.gather(*(c.status() for c in clients))
        if all(
            s.queue["wait_ms"] == 0
            and all(row["wait_ms"] == 0 for row in s.cluster if _watched(row))
            for s in statuses
        ):
            return
        await asyncio.sleep(0.02)
    raise CompassError(f"the cluster was not quiet within {QUIET_LIMIT_S:.0f} s of the last probe")


async def _probe(
    clients: Sequence[Client], names: Sequence[str], ingress: int, time_scale: float
) -> tuple[list[float], int]:
    """One probe from ``ingress`` (see the module docstring): the seconds until each other
    worker's view showed it, and how many views never did."""
    first: list[dict[str, float]] = [{} for _ in clients]
    t0 = time.monotonic()
    job = asyncio.ensure_future(
        clients[ingress].submit_job(PROBE, data=np.zeros(1024, np.uint8), timeout=JOB_TIMEOUT_S)
    )

    async def watch(y: int) -> None:
        while not job.done():
            status = await clients[y].status()
            now = time.monotonic()
            for row in status.cluster:
                if row["name"] != names[y] and row["wait_ms"] > 0 and _watched(row):
                    # received the state it holds that long ago (its clock is workload time)
                    first[y].setdefault(row["name"], now - row["age_ms"] * time_scale / 1000.0)
            if first[y]:
                return
            await asyncio.sleep(POLL_S)

    try:
        async with asyncio.TaskGroup() as group:
            for y in range(len(clients)):
                group.create_task(watch(y))
        result = await job
    finally:
        job.cancel()
    ended = time.monotonic()
    records = await clients[ingress].records()
    ran_on = next(r.plan[PROBE_TASK] for r in records if r.job == result.job_id)
    # the planners that need the change: every peer of a mesh; the watchers of a bounded view
    view = (await clients[names.index(ran_on)].status()).view
    needs = set(names) if view["kind"] == "mesh" else set(view["watchers"])
    samples, missed = [], 0
    for y, seen in enumerate(first):
        if names[y] == ran_on or names[y] not in needs:
            continue
        if ran_on not in seen:
            missed += 1
        samples.append(max(seen.get(ran_on, ended) - t0, 0.0))
    return samples, missed


async def _touch(clients: Sequence[Client]) -> None:
    """Every worker plans one :data:`TOUCH` job at once: it watches its candidates."""
    payload = np.zeros(1024, np.uint8)
    await asyncio.gather(*(c.submit(TOUCH, data=payload, timeout=JOB_TIMEOUT_S) for c in clients))


async def _spread(cluster: LocalCluster, config: ScaleConfig) -> tuple[float | None, int, int]:
    """p99 of the spread samples in ms (None: no planner needed any probe); how many views
    missed their probe, of how many."""
    names = [w.name for w in cluster.workers]
    async with _clients(cluster, range(len(names))) as clients:
        samples: list[float] = []
        missed = 0
        for i in range(config.probes):
            await _quiet(clients)
            if config.view == "bounded":
                await _touch(clients)
                await _quiet(clients)
            got, lost = await _probe(clients, names, i % len(names), config.time_scale)
            samples += got
            missed += lost
    if not samples:
        return None, missed, 0
    return float(np.percentile(samples, 99)) * 1000.0, missed, len(samples)


async def _loaded(
    cluster: LocalCluster, config: ScaleConfig, workload: Workload
) -> tuple[float, int, int]:
    """CPU per worker under the steady stream; how many of its jobs failed, of how many."""
    n = len(cluster.workers)
    jobs = max(1, round(config.jobs_per_s_per_worker * n * config.seconds))
    flows = list(workload.workflows)
    weights = workload.weight_list()
    # job_arrivals' clients together submit load * sum(weights) jobs per mean interval of
    # workload time; a real second is 1 / time_scale of workload time
    interval_s = workload.arrivals.mean_interval_ms_per_client / 1000.0
    load = config.jobs_per_s_per_worker * n * config.time_scale * interval_s / sum(weights)
    arrivals = job_arrivals(
        flows, jobs, process="uniform", mean_interval_s=interval_s, load=load,
        seed=config.seed, weights=weights,
    )  # fmt: skip
    payloads = {wf: _payload(workload, wf) for wf in flows}
    pids = [w.process.pid for w in cluster.workers]
    dealt = itertools.count()
    async with _clients(cluster, range(n)) as clients:

        async def submit(arrival: Arrival) -> None:
            client = clients[next(dealt) % n]  # replay starts them in arrival order
            inputs = payloads[arrival.workflow]
            await client.submit(arrival.workflow, inputs, timeout=JOB_TIMEOUT_S)

        before = _sample(pids)
        stream = asyncio.ensure_future(replay(arrivals, config.time_scale, submit, (CompassError,)))
        try:
            await asyncio.sleep(config.seconds)
            after = _sample(pids)
            latencies, _ = await stream
        finally:
            stream.cancel()
    failed = sum(1 for _, s in latencies if s is None)
    return _cpu_per_worker(before, after), failed, jobs


async def _dropped(client: Client, victim: str, t0: float) -> float | None:
    """Seconds from ``t0`` until ``client``'s worker no longer has ``victim`` as a peer nor in
    its view (None: not within :data:`DETECT_LIMIT_S`)."""
    while True:
        status = await client.status()
        now = time.monotonic()
        names = {p["name"] for p in status.peers} | {row["name"] for row in status.cluster}
        if victim not in names:
            return now - t0
        if now - t0 > DETECT_LIMIT_S:
            return None
        await asyncio.sleep(POLL_S)


async def _detect(cluster: LocalCluster) -> float | None:
    victim = cluster.workers[-1]
    async with _clients(cluster, range(len(cluster.workers) - 1)) as clients:
        t0 = time.monotonic()
        victim.kill()
        times = await asyncio.gather(*(_dropped(c, victim.name, t0) for c in clients))
    if any(t is None for t in times):
        return None
    return max(t for t in times if t is not None) * 1000.0


async def measure_size(config: ScaleConfig, workers: int) -> tuple[SizeResult, SizeNotes]:
    """Start a cluster of ``workers``, measure it (see the module docstring), stop it."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="compass-scale-") as folder:
        spec, workload = probe_workload(config, Path(folder))
        cluster = LocalCluster(
            workers, args=config.worker_args(spec), startup_timeout=60.0 + 5.0 * workers
        )
        async with cluster:
            async with _clients(cluster, range(workers)) as clients:
                await settled(clients)
            await asyncio.sleep(0.5)  # the last heartbeats of the settling answered
            idle = await _idle(cluster, config.seconds)
            spread_ms, missed, views = await _spread(cluster, config)
            loaded_cpu, failed, jobs = await _loaded(cluster, config, workload)
            detect_ms = await _detect(cluster)
    result = SizeResult(
        workers=workers,
        idle_cpu_per_worker=round(idle["idle_cpu_per_worker"], 4),
        loaded_cpu_per_worker=round(loaded_cpu, 4),
        messages_per_s_per_worker=_round(idle["messages_per_s_per_worker"], 1),
        bytes_per_s_per_worker=_round(idle["bytes_per_s_per_worker"], 0),
        connections_per_worker=round(idle["connections_per_worker"], 2),
        rss_mb_per_worker=round(idle["rss_mb_per_worker"], 1),
        detect_ms=_round(detect_ms, 1),
        spread_ms_p99=_round(spread_ms, 2),
    )
    notes = SizeNotes(
        workers=workers,
        machine_busy_cores_idle=round(idle["machine_busy_cores"], 3),
        heartbeat_messages_per_s=(workers - 1) * 1000.0 / SchedConfig().heartbeat_ms,
        probe_views_missed=missed,
        probe_views=views,
        jobs_failed=failed,
        jobs=jobs,
        seconds=round(time.monotonic() - started, 1),
    )
    return result, notes


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


# -- the command -------------------------------------------------------------------------------


def run(
    config: ScaleConfig, *, json_path: str | None = None, plot_path: str | None = None
) -> dict[str, Any]:
    """Measure every size of ``config`` in turn; print a table, write JSON and a plot."""
    out: dict[str, Any] = {
        "config": {
            **asdict(config),
            "worker_args": config.worker_args("<workload + scale_probe>"),
            "probe_real_s": PROBE_REAL_S,
            "messages": "TCP segments with data sent to peers (ss), retransmissions left out",
            "machine": machine(),
            "loadavg_at_start": list(os.getloadavg()),
            "notes": [],
        },
        "sizes": [],
    }
    runner = asyncio.Runner(loop_factory=new_event_loop)
    try:
        for workers in config.workers:
            result, notes = runner.run(measure_size(config, workers))
            out["sizes"].append(asdict(result))
            out["config"]["notes"].append(asdict(notes))
            print(_progress(result, notes), flush=True)
    finally:
        runner.close()
    print_scale(out["sizes"], config)
    write_json(json_path, out)
    if plot_path:
        plot_scale(plot_path, out)
        print(f"wrote {plot_path}")
    return out


def _progress(result: SizeResult, notes: SizeNotes) -> str:
    n = result.workers
    line = (
        f"  {n} workers measured in {notes.seconds:.0f} s; while idle the machine was busy "
        f"{notes.machine_busy_cores_idle:.2f} cores, these workers "
        f"{result.idle_cpu_per_worker * n:.2f}"
    )
    if result.messages_per_s_per_worker is not None:
        share = result.messages_per_s_per_worker / notes.heartbeat_messages_per_s
        line += f", sending {share:.0%} of a heartbeat per peer per period"
    if notes.probe_views_missed:
        line += (
            f"; {notes.probe_views_missed} of {notes.probe_views} views never showed their "
            "probe (counted until it ended)"
        )
    if notes.jobs_failed:
        line += f"; {notes.jobs_failed} of {notes.jobs} jobs failed"
    return line


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_scale(sizes: Sequence[Mapping[str, Any]], config: ScaleConfig) -> None:
    """The table: per worker, CPU in % of a core (``idle all``: the whole cluster, in cores)."""
    rows = [
        [
            str(s["workers"]),
            _cell(s["idle_cpu_per_worker"], ".1%"),
            _cell(s["idle_cpu_per_worker"] * s["workers"], ".2f"),
            _cell(s["loaded_cpu_per_worker"], ".1%"),
            _cell(s["messages_per_s_per_worker"], ".0f"),
            _cell(None if s["bytes_per_s_per_worker"] is None
                  else s["bytes_per_s_per_worker"] / 1000.0, ".1f"),
            _cell(s["connections_per_worker"], ".1f"),
            _cell(s["rss_mb_per_worker"], ".0f"),
            _cell(s["detect_ms"], ".0f"),
            _cell(s["spread_ms_p99"],
                  ".1f" if s["spread_ms_p99"] is None or s["spread_ms_p99"] < 100 else ".0f"),
        ]
        for s in sizes
    ]  # fmt: skip
    print_table(
        f"compass bench scale ({config.view} view): per worker, {config.seconds:g} s idle and "
        f"under a light job stream, {config.probes} probes",
        ["N", "idle", "idle all", "loaded", "msg/s", "KB/s", "conns", "RSS MB", "detect ms",
         "spread p99 ms"],
        rows,
    )  # fmt: skip


def plot_scale(path: str, out: Mapping[str, Any]) -> None:
    """Each figure of :class:`SizeResult` against the cluster size."""
    plt = pyplot(path)

    sizes = out["sizes"]
    x = [s["workers"] for s in sizes]

    def values(key: str, scale: float = 1.0) -> list[float]:
        return [math.nan if s[key] is None else s[key] * scale for s in sizes]

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    panels: list[tuple[str, list[tuple[str, list[float]]]]] = [
        ("CPU per worker (% of a core)", [
            ("idle", values("idle_cpu_per_worker", 100.0)),
            ("light job stream", values("loaded_cpu_per_worker", 100.0)),
        ]),
        ("messages sent per s per worker (idle)", [
            ("measured", values("messages_per_s_per_worker")),
            ("a heartbeat to each peer every period",
             [n["heartbeat_messages_per_s"] for n in out["config"]["notes"]]),
        ]),
        ("KB sent per s per worker (idle)", [("KB", values("bytes_per_s_per_worker", 1e-3))]),
        ("TCP connections per worker", [("connections", values("connections_per_worker"))]),
        ("RSS per worker (MB)", [("RSS", values("rss_mb_per_worker"))]),
        ("ms (log scale)", [
            ("killed worker dropped by all (detect)", values("detect_ms")),
            ("queue change seen by peers, p99 (spread)", values("spread_ms_p99")),
        ]),
    ]  # fmt: skip
    for ax, (title, lines) in zip(axes.flat, panels, strict=True):
        for label, ys in lines:
            ax.plot(x, ys, marker="o", label=label)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel("workers")
        ax.set_xticks(x)
        if title.startswith("ms"):
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize="small")
    cfg = out["config"]
    fig.suptitle(
        f"compass bench scale: local clusters on {cfg['machine']['cpus']} cores, "
        f"{cfg['seconds']:g} s windows"
    )
    save_figure(fig, path)
