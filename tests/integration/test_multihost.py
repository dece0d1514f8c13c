"""Three workers on three hosts, the way the recipes in deploy/ run them.

Each host is a network namespace with its own address on one bridge (10.201.0.1-3/24; the
bridge lives in a namespace of its own, so nothing here touches the machine's network). Every
worker gets the same ``--join 10.201.0.1:7341``, as every pod of the StatefulSet does: the
first finds its own address there and starts the cluster, the others retry until it answers
(they all start at once). Worker 0 binds its address (systemd), worker 1 binds 0.0.0.0 and
advertises its address (Kubernetes), worker 2 binds 0.0.0.0 and advertises nothing, so it tells
its peers its primary address (a container). A client in worker 0's namespace then checks that
every worker knows every other by its namespace address, that jobs complete with tasks on
every worker, and that each worker's ``/ready`` answers on the metrics port.

The hosts are :mod:`tests.integration.netns`'s: it needs root and ``ip netns``, and elsewhere
it is skipped with the reason. Run as a module
(``python -m tests.integration.test_multihost ADDRESS...``) it is that client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass import Client
from compass.cluster import WorkerProcess
from compass.reports import WorkerStatus

from . import netns
from .conftest import PAPER
from .netns import Hosts, compass_command

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.201.0"
PORT = 7341
METRICS_PORT = 9341
WORKERS = 3
JOBS = 12
PAPER_FLOWS = ["translation", "question_answer", "img_to_sound", "object_detection"]
#: emulated, and fast; round robin deals tasks to every worker in the view, so "tasks ran on
#: every worker" is certain rather than likely
EMULATED = ["--workload", PAPER, "--time-scale", "0.02", "--policy", "round_robin"]


def _address(i: int) -> str:
    return f"{SUBNET}.{i + 1}"


# -- the workers ---------------------------------------------------------------------------------


def _worker_argv(i: int) -> list[str]:
    """Worker ``i``'s flags: the same seed for all, and one way of being addressed each."""
    address = _address(i)
    how = [
        ["--host", address, "--metrics-host", address],  # systemd: bind the host's address
        ["--host", "0.0.0.0", "--advertise-address", f"{address}:{PORT}",
         "--metrics-host", "0.0.0.0"],  # Kubernetes: bind all, advertise the pod's name
        ["--host", "0.0.0.0", "--metrics-host", "0.0.0.0"],  # a container: the primary address
    ][i % 3]  # fmt: skip
    return [
        *compass_command(), "worker", "start", *EMULATED, "--name", f"w{i}", "--port", str(PORT),
        "--join", f"{_address(0)}:{PORT}", "--join-timeout", "60",
        "--metrics-port", str(METRICS_PORT), *how,
    ]  # fmt: skip


@contextlib.asynccontextmanager
async def _workers_in(
    hosts: Hosts, env: dict[str, str], log_dir: Path
) -> AsyncIterator[list[WorkerProcess]]:
    workers: list[WorkerProcess] = []
    try:
        for i in range(len(hosts.spaces)):  # all at once: the others wait for worker 0
            log_path = log_dir / f"w{i}.log"
            with log_path.open("ab") as log:
                process = await hosts.spawn(
                    i, _worker_argv(i), env=env,
                    stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            workers.append(WorkerProcess(f"w{i}", process, log_path))
        await asyncio.gather(*(w.read_address(60.0) for w in workers))
        yield workers
    finally:
        await asyncio.gather(*(w.stop() for w in workers))


# -- the client, run in a namespace --------------------------------------------------------------


def _ready(address: str) -> int:
    """The HTTP status of ``/ready`` on the metrics port of the worker at ``address``."""
    host = address.rsplit(":", 1)[0]
    try:
        with urllib.request.urlopen(f"http://{host}:{METRICS_PORT}/ready", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _whole(statuses: Sequence[WorkerStatus]) -> bool:
    names = {s.name for s in statuses}
    return len(names) == len(statuses) and all(
        {p["name"] for p in s.peers} == names - {s.name}
        and {row["name"] for row in s.cluster} == names
        for s in statuses
    )


async def observe(addresses: Sequence[str], token: str, jobs: int) -> dict[str, Any]:
    """What the test checks, seen from here: every worker's status once each knows every
    other (or after 30 s), the plans of ``jobs`` jobs run through the first worker, every
    worker's tasks run, and its ``/ready``."""
    clients = [Client(address, token=token) for address in addresses]
    try:
        deadline = time.monotonic() + 30.0
        while True:
            statuses = list(await asyncio.gather(*(c.status(timeout=5.0) for c in clients)))
            if _whole(statuses) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        first = clients[0]
        payload = np.zeros(1000, dtype=np.uint8)
        await asyncio.gather(
            *(first.submit(PAPER_FLOWS[i % 4], data=payload, timeout=60.0) for i in range(jobs))
        )
        records = await first.records()
        after = await asyncio.gather(*(c.status(timeout=5.0) for c in clients))
    finally:
        for client in clients:
            await client.aclose()
    ready = await asyncio.gather(*(asyncio.to_thread(_ready, a) for a in addresses))
    return {
        "statuses": [
            {"name": s.name, "address": s.address, "peers": list(s.peers)} for s in statuses
        ],
        "plans": [dict(r.plan) for r in records if r.ok],
        "failed": [r.to_json() for r in records if not r.ok],
        "tasks_run": {s.name: s.stats["tasks_run"] for s in after},
        "ready": dict(zip(addresses, ready, strict=True)),
    }


def main(argv: Sequence[str]) -> None:
    """``python -m tests.integration.test_multihost ADDRESS...``: prints :func:`observe`'s JSON
    (the token from COMPASS_TOKEN)."""
    token = os.environ["COMPASS_TOKEN"]
    result = asyncio.run(observe(list(argv), token, JOBS))
    print(json.dumps(result))


# -- the test ------------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_workers_on_three_hosts_join_by_address_and_share_jobs(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**worker_env, "COMPASS_TOKEN": secrets.token_hex(16)}
    addresses = [f"{_address(i)}:{PORT}" for i in range(WORKERS)]
    with netns.hosts(WORKERS, subnet=SUBNET) as hosts:
        async with _workers_in(hosts, env, tmp_path) as workers:
            assert workers[0].address == addresses[0]  # the others bound 0.0.0.0
            client = await hosts.spawn(
                0, [sys.executable, "-m", "tests.integration.test_multihost", *addresses],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL, cwd=str(ROOT),
            )  # fmt: skip
            try:
                out, err = await asyncio.wait_for(client.communicate(), 120.0)
            finally:
                if client.returncode is None:
                    client.kill()
                    await client.wait()
            assert client.returncode == 0, err.decode(errors="replace")[-3000:]
            seen = json.loads(out.decode().strip().splitlines()[-1])

    names = [f"w{i}" for i in range(WORKERS)]
    for status in seen["statuses"]:
        # every peer by the address it advertises: its namespace's, not loopback or a wildcard
        assert {p["name"]: p["address"] for p in status["peers"]} == {
            name: a for name, a in zip(names, addresses, strict=True) if name != status["name"]
        }, status
    assert not seen["failed"]
    assert len(seen["plans"]) == JOBS
    placed = {worker for plan in seen["plans"] for worker in plan.values()}
    assert placed == set(names)
    ran = [name for name, count in seen["tasks_run"].items() if count > 0]
    assert sorted(ran) == names, seen["tasks_run"]
    assert seen["ready"] == dict.fromkeys(addresses, 200)


if __name__ == "__main__":
    main(sys.argv[1:])
