from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from compass import Client
from compass.cluster import LocalCluster
from compass.config import TLSConfig
from compass.reports import WorkerStatus
from compass.wire.transport import new_event_loop

ROOT = Path(__file__).resolve().parents[2]
PAPER = str(ROOT / "bench" / "workloads" / "paper.json")
VISION_APP = ["--app", "examples.vision_app"]


def worker_environment() -> dict[str, str]:
    """Environment for worker subprocesses: the repo on the path, no inherited token."""
    env = dict(os.environ)
    env.pop("COMPASS_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def app_environment(folder: Path, module: str, source: str) -> dict[str, str]:
    """:func:`worker_environment` with an app module ``module`` of ``source`` written to
    ``folder`` and importable by the workers (``--app module``)."""
    (folder / f"{module}.py").write_text(source)
    env = worker_environment()
    env["PYTHONPATH"] = f"{folder}{os.pathsep}{env['PYTHONPATH']}"
    return env


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Environment for worker subprocesses: the repo on the path, no inherited token."""
    return worker_environment()


@contextlib.contextmanager
def cluster_on_its_own_loop(
    workers: int,
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    token: str | None = None,
    tls: TLSConfig | None = None,
) -> Iterator[LocalCluster]:
    """A local cluster started and stopped on an event loop of its own (idle in between), so
    that tests, each on a loop of its own, can share it: they talk to it over loopback.
    ``env`` defaults to :func:`worker_environment`; ``token`` and ``tls`` as in
    :class:`LocalCluster`."""
    loop = new_event_loop()
    cluster = LocalCluster(
        workers, args=args, env=worker_environment() if env is None else env, token=token, tls=tls
    )
    try:
        loop.run_until_complete(cluster.start())
        yield cluster
    finally:
        loop.run_until_complete(cluster.aclose())
        loop.close()


@pytest.fixture(scope="module")
def vision_worker() -> Iterator[LocalCluster]:
    """One worker of ``examples.vision_app`` shared by a module's tests (its start, torch
    imported and models built, is most of a short test's time): a test that uses it must
    leave it serving, and count from what its status said before, not from zero."""
    with cluster_on_its_own_loop(1, VISION_APP) as cluster:
        yield cluster


def compass_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "compass", *args]


def one_worker_workload(tmp_path: Path, **workflows: tuple[str | None, float]) -> str:
    """A spec file for one-task workflows: ``name=(model or None, exec_ms)``; model ``m`` is
    10 MB in a 1000 MB cache. Returns its path."""
    spec = {
        "name": "tiny",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 10}},
        "workflows": {
            name: {"tasks": {"t": {"model": model, "exec_ms": ms, "output_kb": 1, "after": []}}}
            for name, (model, ms) in workflows.items()
        },
    }  # fmt: skip
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    return str(path)


async def status_when(
    client: Client, ready: Callable[[WorkerStatus], bool], tries: int = 200
) -> WorkerStatus:
    """The worker's status once ``ready(status)`` holds (or the last one after ``tries``)."""
    status = await client.status()
    for _ in range(tries):
        if ready(status):
            break
        await asyncio.sleep(0.01)
        status = await client.status()
    return status


async def kill_last(
    cluster: LocalCluster, clients: list[Client], limit_s: float = 30.0
) -> list[WorkerStatus]:
    """SIGKILL the cluster's last worker; the survivors' statuses (``clients`` but the last)
    once none of them has it as a peer any more."""
    victim = cluster.workers[-1]
    t0 = time.monotonic()
    victim.kill()
    while True:
        statuses = list(await asyncio.gather(*(c.status() for c in clients[:-1])))
        if all(victim.name not in {p["name"] for p in s.peers} for s in statuses):
            print(f"killed worker dropped by all after {(time.monotonic() - t0) * 1e3:.0f} ms")
            return statuses
        assert time.monotonic() - t0 < limit_s, "the killed worker is still a peer"
        await asyncio.sleep(0.05)
