"""A long run keeps the workers flat: what an ingress keeps of answered jobs is bounded, and a
failed job leaves nothing behind. Real worker processes, MB-sized data, RSS measured."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compass.cluster import LocalCluster
from compass.errors import JobFailed

from .conftest import app_environment

MiB = 1 << 20

MEMORY_APP = """
import compass

app = compass.App("memory")

echo = app.workflow("echo", inputs=["x"])

@echo.task(expected_ms=1)
def first(model, x):
    return x

@echo.task(after=["first"], expected_ms=1)
def second(model, first):
    return first

fails = app.workflow("fails", inputs=["x"])

@fails.task(expected_ms=1)
def boom(model, x):
    raise ValueError(f"refused {x.nbytes} bytes")
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def memory_env(tmp_path: Path) -> dict[str, str]:
    return app_environment(tmp_path, "memory_app", MEMORY_APP)


@pytest.mark.asyncio
@pytest.mark.parametrize("workers", [1, 2])
async def test_mb_sized_jobs_ok_or_failed_leave_the_ingress_flat(
    memory_env: dict[str, str], workers: int
) -> None:
    """Before: the ingress kept the answer of every job key it answered (4,096 of them) and,
    through the traceback of a failed job's kept error, the job's inputs: 1 MB per 1 MB job,
    ok or failed. Now kept answers have a byte budget (64 MiB by default) and a kept error is
    rebuilt for each answer. 2 workers, round robin: the tasks run on both and the answers
    come back over the wire to the ingress."""
    args = ["--app", "memory_app", "--policy", "round_robin"]
    async with LocalCluster(workers, args=args, env=memory_env) as cluster:
        await cluster.wait_joined()
        pid = cluster.workers[0].process.pid
        async with cluster.client(0) as client:
            x = np.ones(2 * MiB, dtype=np.uint8)
            gate = asyncio.Semaphore(8)

            async def one(workflow: str) -> None:
                async with gate:
                    if workflow == "echo":
                        assert (await client.submit("echo", x=x, timeout=60)).nbytes == x.nbytes
                    else:
                        with pytest.raises(JobFailed):
                            await client.submit("fails", x=x, timeout=60)

            await asyncio.gather(*(one(wf) for wf in ["echo", "fails"] * 10))  # warm up
            before = rss_mb(pid)
            await asyncio.gather(*(one(wf) for wf in ["echo", "fails"] * 200))
            grown = rss_mb(pid) - before
            status = await client.status()
    print(f"{workers} workers: ingress RSS {before:.0f} MB, +{grown:.0f} MB after 800 MB of jobs")
    # 400 jobs of 2 MiB: 800 MB kept before; the answers' budget is 64 MiB
    assert grown < 200, f"the ingress grew {grown:.0f} MB over 400 jobs of 2 MiB"
    assert status.jobs_in_flight == 0


CYCLES_PROBE = """
import asyncio, contextlib, gc, sys

import numpy as np

from compass import Client
from compass.config import WorkerConfig
from compass.errors import JobFailed
from compass.worker.process import build_worker

async def main(workflow):
    token = "t" * 32
    worker = build_worker(WorkerConfig(app="memory_app", token=token))
    await worker.start()
    try:
        async with Client(worker.address, token=token) as client:
            x = np.ones(1 << 20, dtype=np.uint8)

            async def one():
                with contextlib.suppress(JobFailed):
                    await client.submit(workflow, x=x, timeout=30)

            await one()  # warm up: first-use caches are not garbage
            gc.collect()
            gc.disable()
            try:
                for _ in range(20):
                    await one()
                found = gc.collect()
            finally:
                gc.enable()
    finally:
        await worker.aclose()
    print(found)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("workflow", ["echo", "fails"])
def test_a_job_makes_no_cyclic_garbage_on_either_side(tmp_path: Path, workflow: str) -> None:
    """A failed job's error held the frames it was raised through in its traceback, and a
    future in one of those frames held the error: a cycle per job, with the job's inputs in
    it, that only the cyclic collector frees (seldom, over a heap the size of torch's). The
    worker and the client run in one process of their own (the collector sees a whole
    process: an earlier test's leftovers in the test process would count) over a loopback
    socket; with the collector off, jobs must leave nothing for it."""
    (tmp_path / "memory_app.py").write_text(MEMORY_APP)
    probe = tmp_path / "cycles_probe.py"
    probe.write_text(CYCLES_PROBE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, str(probe), workflow], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = int(done.stdout.split()[-1])
    assert found == 0, f"{found} objects in reference cycles after 20 {workflow} jobs"
