"""Membership that heals, on real worker processes: a paused worker (suspected, as its probes
go unanswered) and a cut network link are dropped and taken back; ``--join`` waits for its seed
or gives up with one line; a duplicate name is refused.

The network test builds its own hosts: network namespaces joined by a bridge (10.77.0.0/24
for the cluster), each also linked to the test's namespace (10.78.N.0/30) so that the test can
watch a worker while its cluster link is cut. It needs root and ``ip netns``; elsewhere it is
skipped with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass import Client
from compass.cluster import LocalCluster, WorkerProcess
from compass.reports import JobRecord, WorkerStatus

from .conftest import PAPER

PAPER_FLOWS = ["translation", "question_answer", "img_to_sound", "object_detection"]
#: a short peer timeout keeps the tests short; heartbeats every 20 ms stay well inside it
FAST_FAILURE = ["--heartbeat-ms", "20", "--peer-timeout-ms", "500"]
#: how long the paused worker stays stopped, and the cut link down: long enough for the retry
#: backoff to grow past its first steps
PAUSE_S = 3.0
CUT_S = 5.0
#: round robin deals tasks to every worker in the view, so "jobs run on it" is certain
EMULATED = ["--workload", PAPER, "--time-scale", "0.02", "--policy", "round_robin"]


async def _until(
    probe: Callable[[], Any], ready: Callable[[Any], bool], what: str, limit_s: float = 30.0
) -> Any:
    """Poll the coroutine ``probe()`` until ``ready(result)``; fail after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while True:
        result = await probe()
        if ready(result):
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit_s:.0f} s waiting until {what}: {result!r}")
        await asyncio.sleep(0.02)


def _peers(status: WorkerStatus) -> list[str]:
    return [p["name"] for p in status.peers]


def _cluster(status: WorkerStatus) -> list[str]:
    return [row["name"] for row in status.cluster]


async def _statuses(clients: Sequence[Client]) -> list[WorkerStatus]:
    return list(await asyncio.gather(*(c.status(timeout=5.0) for c in clients)))


def _whole(names: Sequence[str]) -> Callable[[list[WorkerStatus]], bool]:
    """Every worker has every other as a peer and every worker in its view."""

    def ready(statuses: list[WorkerStatus]) -> bool:
        return all(
            _peers(s) == sorted(set(names) - {s.name}) and _cluster(s) == sorted(names)
            for s in statuses
        )

    return ready


async def _run_jobs(client: Client, jobs: int) -> list[JobRecord]:
    """Submit ``jobs`` jobs to ``client``'s worker; returns their trace records."""
    await client.records(clear=True)
    payload = np.zeros(1000, dtype=np.uint8)
    await asyncio.gather(
        *(client.submit(PAPER_FLOWS[i % 4], data=payload, timeout=60.0) for i in range(jobs))
    )
    records = await client.records()
    assert len(records) == jobs and all(r.ok for r in records)
    return records


def _used(records: list[JobRecord]) -> set[str]:
    return {worker for record in records for worker in record.plan.values()}


# -- a paused worker ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_paused_worker_is_dropped_then_rejoins_every_view(
    worker_env: dict[str, str],
) -> None:
    async with LocalCluster(3, args=EMULATED + FAST_FAILURE, env=worker_env) as cluster:
        clients = [cluster.client(i) for i in range(3)]
        for client in clients:
            await client.connect()
        victim = cluster.workers[2]
        try:
            assert _used(await _run_jobs(clients[0], 6)) == {"w0", "w1", "w2"}
            paused_at = time.monotonic()
            victim.process.send_signal(signal.SIGSTOP)  # alive, but silent
            suspected: set[str] = set()

            def dropped(statuses: list[WorkerStatus]) -> bool:
                for s in statuses:  # its probes unanswered, it is suspected before it is dropped
                    if any(p["name"] == "w2" and p["suspect"] for p in s.peers):
                        suspected.add(s.name)
                return [_peers(s) for s in statuses] == [["w1"], ["w0"]]

            try:
                await _until(lambda: _statuses(clients[:2]), dropped, "w0 and w1 drop w2")
                dropped_s = time.monotonic() - paused_at
                assert suspected, "nobody was seen suspecting w2 before dropping it"
                for status in await _statuses(clients[:2]):
                    assert "w2" not in _cluster(status)  # out of the view: no plan uses it
                # jobs go around it meanwhile
                assert _used(await _run_jobs(clients[0], 6)) == {"w0", "w1"}
                await asyncio.sleep(max(0.0, PAUSE_S - (time.monotonic() - paused_at)))
            finally:
                victim.process.send_signal(signal.SIGCONT)
            resumed_at = time.monotonic()
            statuses = await _until(
                lambda: _statuses(clients),
                _whole(["w0", "w1", "w2"]),
                "w2 is back in every view",
            )
            rejoined_s = time.monotonic() - resumed_at
            # it came back one incarnation later than the one it was declared dead at
            for status in statuses[:2]:
                row = next(p for p in status.peers if p["name"] == "w2")
                assert row["incarnation"] >= 1
            assert "w2" in _used(await _run_jobs(clients[0], 6))  # plans include it again
            assert "w2" in _used(await _run_jobs(clients[1], 6))
        finally:
            for client in clients:
                await client.aclose()
    print(f"\nSIGSTOP {PAUSE_S:g} s, peer timeout 500 ms: suspected by {sorted(suspected)}, "
          f"dropped after {dropped_s:.2f} s, back in every view {rejoined_s:.2f} s after "
          "SIGCONT")  # fmt: skip


# -- --join before its seed is up, --join to nothing, a duplicate name ---------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _worker(
    env: dict[str, str], *args: str, stderr: Any = subprocess.PIPE
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "compass",
        "worker",
        "start",
        "--workload",
        PAPER,
        *args,
        stdout=subprocess.PIPE,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        env={**env, "COMPASS_TOKEN": "rejoin-token-8d2f6b1e9a4c7e3b"},
    )


async def _ended(process: asyncio.subprocess.Process, limit_s: float = 30.0) -> tuple[int, str]:
    """The exit code and stderr of a worker expected to exit by itself."""
    try:
        _, err = await asyncio.wait_for(process.communicate(), limit_s)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode()


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.communicate(), 20.0)
        except TimeoutError:
            process.kill()
            await process.wait()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_join_keeps_trying_until_its_seed_starts(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = _free_port()
    log = (tmp_path / "a.log").open("wb")
    joiner = await _worker(
        worker_env,
        "--port", "0", "--name", "a", "--join", f"127.0.0.1:{port}", "--log-level", "info",
        stderr=log,
    )  # fmt: skip
    a = WorkerProcess("a", joiner, tmp_path / "a.log")
    seed: asyncio.subprocess.Process | None = None

    async def logged() -> str:
        return (tmp_path / "a.log").read_text()

    try:
        # it tried, failed, and tried again: two tries logged, still running, not listening yet
        await _until(
            logged, lambda text: text.count("could not join 127.0.0.1:") >= 2, "two tries logged"
        )
        assert joiner.returncode is None
        seed = await _worker(worker_env, "--port", str(port), "--name", "b")
        address = await a.read_address(60.0)
        async with Client(f"127.0.0.1:{port}", token="rejoin-token-8d2f6b1e9a4c7e3b") as client:
            status = await _until(
                client.status, lambda s: _peers(s) == ["a"], "b has a as a peer", 20.0
            )
            assert status.peers[0]["address"] == address
        assert "could not join 127.0.0.1:" in (tmp_path / "a.log").read_text()  # logged tries
    finally:
        assert await a.stop() == 0
        if seed is not None:
            await _stop(seed)
        log.close()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_join_to_nothing_gives_up_after_join_timeout_with_one_line(
    worker_env: dict[str, str],
) -> None:
    port = _free_port()
    worker = await _worker(
        worker_env, "--port", "0", "--join", f"127.0.0.1:{port}", "--join-timeout", "1.5"
    )
    code, err = await _ended(worker)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"could not join the cluster at 127.0.0.1:{port} within 1.5 s" in lines[0]


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_duplicate_name_is_refused_and_exits_non_zero(
    worker_env: dict[str, str],
) -> None:
    cluster = LocalCluster(2, args=["--workload", PAPER], env=worker_env)
    async with cluster, cluster.client(0) as first:
        before = await first.status()
        duplicate = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "compass", "worker", "start", "--workload", PAPER,
                "--port", "0", "--name", "w1", "--join", cluster.workers[0].address,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                env={**worker_env, "COMPASS_TOKEN": cluster.token},
            )  # fmt: skip
        code, err = await _ended(duplicate)
        assert code != 0
        lines = err.strip().splitlines()
        assert len(lines) == 1, lines
        assert "'w1' is taken" in lines[0] and cluster.workers[1].address in lines[0]
        after = await first.status()
        assert after.peers[0]["name"] == "w1"  # the cluster is not split
        assert after.peers[0]["address"] == before.peers[0]["address"]
        assert after.stats["peers_lost"] == before.stats["peers_lost"]


# -- a cut network link ------------------------------------------------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


class Hosts:
    """``count`` network namespaces on one bridge (in a namespace of its own), each with a
    cluster address 10.77.0.N and a link to this namespace at 10.78.N.2."""

    def __init__(self, count: int) -> None:
        tag = secrets.token_hex(3)
        self.count = count
        self.hub = f"cps-hub-{tag}"
        self.spaces = [f"cps-w{i}-{tag}" for i in range(count)]
        self._tag = tag
        self._links: list[str] = []  # in this namespace: deleted with their peers, or at close

    def cluster_ip(self, i: int) -> str:
        return f"10.77.0.{i + 1}"

    def watch_ip(self, i: int) -> str:
        return f"10.78.{i}.2"

    def hub_end(self, i: int) -> str:
        return f"cph{i}{self._tag}"

    def build(self) -> None:
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, space in enumerate(self.spaces):
            cluster_end, watch, watch_end = f"cpc{i}{self._tag}", f"cpm{i}{self._tag}", "watch0"
            _ip("netns", "add", space)
            _ip("-n", space, "link", "set", "lo", "up")
            _ip("link", "add", cluster_end, "type", "veth", "peer", "name", self.hub_end(i))
            _ip("link", "set", cluster_end, "netns", space)
            _ip("link", "set", self.hub_end(i), "netns", self.hub)
            _ip("-n", self.hub, "link", "set", self.hub_end(i), "master", "br0")
            _ip("-n", self.hub, "link", "set", self.hub_end(i), "up")
            _ip("-n", space, "addr", "add", f"{self.cluster_ip(i)}/24", "dev", cluster_end)
            _ip("-n", space, "link", "set", cluster_end, "up")
            _ip("link", "add", watch, "type", "veth", "peer", "name", watch_end)
            self._links.append(watch)
            _ip("link", "set", watch_end, "netns", space)
            _ip("addr", "add", f"10.78.{i}.1/30", "dev", watch)
            _ip("link", "set", watch, "up")
            _ip("-n", space, "addr", "add", f"{self.watch_ip(i)}/30", "dev", watch_end)
            _ip("-n", space, "link", "set", watch_end, "up")

    def cut(self, i: int) -> None:
        """Take worker ``i``'s cluster link down at the bridge, as a pulled cable does."""
        _ip("-n", self.hub, "link", "set", self.hub_end(i), "down")

    def heal(self, i: int) -> None:
        _ip("-n", self.hub, "link", "set", self.hub_end(i), "up")

    def close(self) -> None:
        for space in [*self.spaces, self.hub]:  # deleting a namespace deletes its links' peers
            subprocess.run(["ip", "netns", "del", space], capture_output=True, timeout=20)
        for link in self._links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=20)


@contextlib.contextmanager
def _hosts(count: int) -> Iterator[Hosts]:
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot build network namespaces")
    hosts = Hosts(count)
    try:
        try:
            hosts.build()
        except subprocess.CalledProcessError as exc:
            pytest.skip(
                f"cannot build network namespaces here ({' '.join(exc.cmd)}: "
                f"{(exc.stderr or '').strip()}); needs root and ip netns"
            )
        yield hosts
    finally:
        hosts.close()


@contextlib.asynccontextmanager
async def _workers_in(
    hosts: Hosts, env: dict[str, str], log_dir: Path
) -> AsyncIterator[list[WorkerProcess]]:
    workers: list[WorkerProcess] = []
    try:
        for i, space in enumerate(hosts.spaces):
            log_path = log_dir / f"w{i}.log"
            argv = [
                "ip", "netns", "exec", space, sys.executable, "-m", "compass", "worker", "start",
                *EMULATED, *FAST_FAILURE, "--name", f"w{i}", "--host", "0.0.0.0", "--port",
                "7341", "--advertise-address", f"{hosts.cluster_ip(i)}:7341",
                "--log-level", "info",
            ]  # fmt: skip
            if i:
                argv += ["--join", f"{hosts.cluster_ip(0)}:7341"]
            with log_path.open("ab") as log:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    env={**env, "COMPASS_TOKEN": "netns-token-3b7e1c9f5a2d8e6b"},
                )
            worker = WorkerProcess(f"w{i}", process, log_path)
            workers.append(worker)
            await worker.read_address(60.0)
        yield workers
    finally:
        await asyncio.gather(*(w.stop() for w in workers))


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_cut_link_drops_peers_routes_jobs_around_and_heals(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with _hosts(3) as hosts:
        async with _workers_in(hosts, worker_env, tmp_path):
            clients = [
                Client(f"{hosts.watch_ip(i)}:7341", token="netns-token-3b7e1c9f5a2d8e6b")
                for i in range(3)
            ]
            for client in clients:
                await client.connect()
            try:
                names = ["w0", "w1", "w2"]
                statuses = await _until(lambda: _statuses(clients), _whole(names), "all joined")
                for status in statuses:  # bound to 0.0.0.0, each advertises its own address
                    for peer in status.peers:
                        assert peer["address"] == f"10.77.0.{int(peer['name'][1]) + 1}:7341"
                assert _used(await _run_jobs(clients[0], 6)) == set(names)

                cut_at = time.monotonic()
                hosts.cut(2)
                try:
                    await _until(
                        lambda: _statuses(clients),
                        lambda ss: [_peers(s) for s in ss] == [["w1"], ["w0"], []],
                        "w2 and the others drop each other",
                    )
                    dropped_s = time.monotonic() - cut_at
                    # jobs at w0 and w1 run around w2; w2 alone runs its own
                    assert _used(await _run_jobs(clients[0], 6)) == {"w0", "w1"}
                    assert _used(await _run_jobs(clients[2], 2)) == {"w2"}
                    await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
                finally:
                    hosts.heal(2)
                healed_at = time.monotonic()
                await _until(lambda: _statuses(clients), _whole(names), "w2 rejoins", 60.0)
                rejoined_s = time.monotonic() - healed_at
                assert _used(await _run_jobs(clients[0], 6)) == set(names)
                assert _used(await _run_jobs(clients[2], 6)) == set(names)
            finally:
                for client in clients:
                    await client.aclose()
    print(f"\nlink cut {CUT_S:g} s, peer timeout 500 ms: dropped after {dropped_s:.2f} s, "
          f"rejoined {rejoined_s:.2f} s after the link came back")  # fmt: skip


@pytest.mark.asyncio
async def test_a_worker_that_leaves_is_retried_often_and_a_killed_one_on_the_backoff(
    worker_env: dict[str, str],
) -> None:
    args = ["--workload", PAPER, "--heartbeat-ms", "20", "--peer-timeout-ms", "500"]
    async with LocalCluster(3, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        assert await cluster.workers[2].stop() == 0  # SIGTERM: it says it leaves
        cluster.workers[1].kill()  # no word: it is retried on the usual backoff

        def settled(status: WorkerStatus) -> bool:
            lost = {m["name"]: m for m in status.lost}
            return not status.peers and set(lost) == {"w1", "w2"} and lost["w1"]["failures"] > 5

        async with cluster.client(0) as client:
            status = await _until(client.status, settled, "w0 has retried both for a while")
        lost = {m["name"]: m for m in status.lost}
        # the one that left is most often restarting: retried every second at most, while
        # the backoff of the one that died grows past it
        assert lost["w2"]["left"] is True and lost["w1"]["left"] is False
        assert lost["w2"]["retry_in_s"] <= 1.0
