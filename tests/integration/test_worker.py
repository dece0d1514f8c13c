"""A real worker process on loopback: handshake, status, bad peers, big arrays, shutdown."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from typing import Any

import numpy as np
import pytest

from compass import Client
from compass.cluster import LocalCluster
from compass.config import Timeouts
from compass.errors import (
    AuthenticationError,
    ConfigError,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    WorkerUnavailable,
)

from .conftest import PAPER, VISION_APP, compass_argv, one_worker_workload, status_when


@pytest.mark.asyncio
async def test_ping_and_status(vision_worker: LocalCluster) -> None:
    cluster = vision_worker
    async with cluster.client() as client:
        rtt = await client.ping()
        assert rtt > 0
        status = await client.status()
        assert status.name == "w0"
        assert status.address == cluster.addresses[0]
        assert status.version == __import__("compass").__version__
        assert status.uptime_s >= 0
        assert status.peers == ()
        assert "describe" in status.workflows


@pytest.mark.asyncio
async def test_wrong_and_missing_token_rejected(vision_worker: LocalCluster) -> None:
    cluster = vision_worker
    address = cluster.addresses[0]
    with pytest.raises(AuthenticationError):
        async with Client(address, token="wrong-token") as client:
            await client.ping()
    with pytest.raises(AuthenticationError):
        async with Client(address, token=None) as client:
            await client.ping()
    async with cluster.client() as client:  # the worker still serves the right token
        await client.ping()


@pytest.mark.asyncio
async def test_garbage_from_one_socket_does_not_disturb_others(
    vision_worker: LocalCluster,
) -> None:
    cluster = vision_worker
    async with cluster.client() as good:
        host, port = cluster.addresses[0].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"\xff" * 4096 + b"GET / HTTP/1.1\r\n\r\n" * 10)
        await writer.drain()
        # the worker drops the offender: its socket reaches EOF
        assert await asyncio.wait_for(reader.read(), 10) is not None
        writer.close()
        await good.ping()
        assert (await good.submit("echo", x=[1, 2, 3])) == [1, 2, 3]


@pytest.mark.asyncio
async def test_big_array_round_trip_is_bit_exact(vision_worker: LocalCluster) -> None:
    data = np.random.default_rng(7).integers(0, 2**63, size=(8 << 20,), dtype=np.uint64)  # 64 MiB
    async with vision_worker.client() as client:
        back = await client.submit("echo", x=data, timeout=60)
        assert isinstance(back, np.ndarray)
        assert back.dtype == data.dtype and back.shape == data.shape
        assert np.array_equal(back, data)


@pytest.mark.asyncio
async def test_unreachable_address_fails_clearly() -> None:
    with pytest.raises(ConnectFailed, match=r"127\.0\.0\.1:1"):
        async with Client("127.0.0.1:1") as client:
            await client.ping()


@pytest.mark.asyncio
async def test_sigterm_exits_zero(worker_env: dict[str, str]) -> None:
    cluster = LocalCluster(1, args=VISION_APP, env=worker_env)
    await cluster.start()
    try:
        async with cluster.client() as client:
            await client.ping()
    finally:
        codes = await cluster.aclose()
    assert codes == [0]


@pytest.mark.asyncio
async def test_sigterm_fails_jobs_still_running_after_the_drain_clearly_then_exits_zero(
    worker_env: dict[str, str], tmp_path
) -> None:
    spec = one_worker_workload(tmp_path, slow=("m", 30000))
    args = ["--workload", spec, "--drain-timeout", "0.5"]  # the job takes 30 s
    cluster = LocalCluster(1, args=args, env=worker_env)
    await cluster.start()
    try:
        async with cluster.client() as client:
            job = asyncio.create_task(client.submit("slow", data=np.zeros(8, dtype=np.uint8)))
            await status_when(client, lambda s: s.queue["running"] == 1)
            cluster.workers[0].process.send_signal(signal.SIGTERM)
            # answered before the connection closes: the job is lost, and the error says so
            # (the client found no other worker to submit it to)
            with pytest.raises(WorkerUnavailable, match="shutting down"):
                await job
    finally:
        codes = await cluster.aclose()
    assert codes == [0]


def test_status_cli(worker_env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        compass_argv("worker", "start", "--port", "0", "--name", "solo", *VISION_APP),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**worker_env, "COMPASS_TOKEN": "status-token-4e8b1d6a9c3f7e2b"},
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        assert first.startswith("compass worker listening on 127.0.0.1:")
        address = first.rsplit(" ", 1)[1]

        def status(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                compass_argv("status", *args),
                capture_output=True,
                text=True,
                env=worker_env,
                timeout=30,
            )

        ok = status(address, "--json", "--token", "status-token-4e8b1d6a9c3f7e2b")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["name"] == "solo"
        human = status(address, "--token", "status-token-4e8b1d6a9c3f7e2b")
        assert human.returncode == 0, human.stderr
        assert "host lanes: 0 ready, 0 running of 1" in human.stdout
        assert "  solo: wait 0.0 ms" in human.stdout  # the view holds the worker itself
        assert "desired workers: 1 (steady)" in human.stdout  # idle, and alone
        bad = status(address, "--token", "nope")
        assert bad.returncode != 0
        assert len(bad.stderr.strip().splitlines()) == 1
        assert "token" in bad.stderr.lower() or "auth" in bad.stderr.lower()
        down = status("127.0.0.1:1")
        assert down.returncode != 0 and "127.0.0.1:1" in down.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        if proc.stdout is not None:
            proc.stdout.close()


def test_compass_up_starts_and_stops_a_joined_cluster(worker_env: dict[str, str], tmp_path) -> None:
    proc = subprocess.Popen(
        compass_argv("up", "--workers", "3", "--token", "up-token-5c9e2a7d4b8f1e6a3d"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=worker_env,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        addresses = [line.split()[1] for line in lines]
        assert [line.split()[0] for line in lines] == ["w0", "w1", "w2"]

        async def peers() -> int:
            async with Client(addresses[2], token="up-token-5c9e2a7d4b8f1e6a3d") as client:
                return len((await client.status()).peers)

        assert asyncio.run(peers()) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cache-mb", "4000"], "opt"),  # a 5.7 GB model, a 4 GB cache
        (["--policy", "fastest"], "fastest"),
        (["--time-scale", "0"], "time_scale"),
    ],
)
def test_bad_worker_configuration_fails_clearly(
    worker_env: dict[str, str], args: list[str], message: str
) -> None:
    from .conftest import PAPER

    done = subprocess.run(
        compass_argv("worker", "start", "--workload", PAPER, *args),
        capture_output=True,
        text=True,
        env=worker_env,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.asyncio
async def test_a_client_cannot_inject_peer_messages(vision_worker: LocalCluster) -> None:
    async with vision_worker.client() as client:
        before = (await client.status()).stats
        forged = {
            "job": "x-1", "att": 0, "wf": "fails", "task": "explode", "from": "",
            "value": {"x": 1}, "plan": {"explode": "w0"}, "ingress": "w0", "sent": 0.0, "t0": 0.0,
        }  # fmt: skip
        raw = client._connected()  # the client's private connection: it speaks the protocol
        raw.notify("task", forged)
        raw.notify("done", {"job": "x-1", "below": None})
        await client.ping()  # notifies on one channel arrive in order: both were handled
        stats = (await client.status()).stats
        assert stats["tasks_run"] == before["tasks_run"]
        assert stats["messages_dropped"] == before["messages_dropped"] + 2
        assert await client.submit("echo", x=5) == 5


@pytest.mark.asyncio
async def test_a_worker_whose_heartbeat_loop_dies_stops_instead_of_lingering() -> None:
    from compass.config import WorkerConfig
    from compass.worker.process import build_worker

    worker = build_worker(WorkerConfig(workload=PAPER, name="w0"))
    async with worker:
        assert worker.failure is None

        def broken(now: float, recent: bool = False) -> object:
            raise RuntimeError("injected: state unavailable")

        worker.gossip.port.own_state = broken  # type: ignore[method-assign,assignment]
        worker.gossip.changed()  # the next heartbeat builds the state, and fails
        await asyncio.wait_for(worker.wait(), timeout=10)
        assert isinstance(worker.failure, RuntimeError)
        assert "injected" in str(worker.failure)


@pytest.mark.asyncio
async def test_a_client_given_several_workers_fails_over_when_its_worker_dies(
    worker_env: dict[str, str],
) -> None:
    async with LocalCluster(2, args=["--workload", PAPER], env=worker_env) as cluster:
        client = Client(cluster.addresses, token=cluster.token)
        payload = np.zeros(10, dtype=np.uint8)
        try:
            assert (await client.status()).name == "w0"  # connects on the first call
            cluster.workers[0].kill()
            await cluster.workers[0].process.wait()
            answered = None
            for _ in range(50):
                try:
                    answered = await client.status()
                    break
                except ConnectionLost:  # a call already on its way to the dead worker
                    await asyncio.sleep(0.05)
            assert answered is not None and answered.name == "w1"
            assert client.address == cluster.addresses[1]
            assert await client.submit("question_answer", data=payload, timeout=30) is not None
        finally:
            await client.aclose()
        with pytest.raises(ConnectionClosed, match="was closed"):
            await client.ping()  # closed by the caller: no silent reconnect


@pytest.mark.asyncio
async def test_a_client_with_no_reachable_worker_says_which_it_tried() -> None:
    client = Client(["127.0.0.1:1", "127.0.0.1:2"], timeouts=Timeouts(connect=2.0))
    with pytest.raises(ConnectFailed) as failed:
        await client.ping()
    assert "2 tried" in str(failed.value)
    assert "127.0.0.1:1" in str(failed.value) and "127.0.0.1:2" in str(failed.value)
    with pytest.raises(ConfigError, match="one or more worker addresses"):
        Client([])


@pytest.mark.asyncio
async def test_an_idle_worker_heartbeats_at_its_interval_not_its_minimum_gap() -> None:
    from compass.config import SchedConfig, WorkerConfig
    from compass.worker.process import build_worker

    config = WorkerConfig(workload=PAPER, name="w0", sched=SchedConfig(heartbeat_ms=200.0))
    worker = build_worker(config)
    async with worker:
        built = 0
        own_state = worker.gossip.own_state

        def counted(now: float) -> Any:
            nonlocal built
            built += 1
            return own_state(now)

        worker.gossip.own_state = counted  # type: ignore[method-assign]
        await asyncio.sleep(1.0)
    # about five heartbeats in a second at 200 ms; a heartbeat that woke the next one at the
    # 1 ms minimum gap would build hundreds
    assert built < 25, built
