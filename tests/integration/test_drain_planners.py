"""A draining worker in a bounded view tells the planners that place on it, and dials no one
else: its open channels and watchers hear it at once, a planner that asks to watch it later
hears it in answer."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from compass.client import JobOptions
from compass.cluster import LocalCluster
from compass.reports import WorkerStatus

from .conftest import one_worker_workload, status_when


def _sees(name: str) -> Callable[[WorkerStatus], bool]:
    def sees(status: WorkerStatus) -> bool:
        return name in {row["name"] for row in status.cluster}

    return sees


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_draining_worker_tells_its_planners_and_dials_no_one_else(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    spec = one_worker_workload(tmp_path, slow=("m", 12000), quick=("m", 5))
    args = [
        "--workload", spec, "--candidates", "4", "--drain-timeout", "30",
        # idle channels close at once; probes too rare to open any while the test runs
        "--peer-idle-s", "0.3", "--probe-period-ms", "20000", "--probe-timeout-ms", "5000",
    ]  # fmt: skip
    async with LocalCluster(5, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        clients = [cluster.client(i) for i in range(5)]
        for client in clients:
            await client.connect()
        try:
            c0, c1, others = clients[0], clients[1], clients[2:]
            # w0 plans over every worker (4 candidates of 4 peers), so it watches w1
            await asyncio.gather(*(c0.submit("quick", x=i, timeout=30) for i in range(8)))
            assert "w1" in (await c0.status()).view["watching"]
            # a job of w1's own keeps its drain going; meanwhile its idle channels close
            slow = asyncio.ensure_future(c1.submit("slow", x=0, timeout=60))
            await status_when(c1, lambda s: s.jobs_in_flight == 1)
            await asyncio.sleep(1.0)
            cluster.workers[1].process.send_signal(signal.SIGTERM)  # it drains
            status = await status_when(c0, lambda s: not _sees("w1")(s), tries=300)
            assert not _sees("w1")(status), "w0, which watches w1, was not told it drains"
            # the others neither watch it nor hold a channel to it (but by chance, for a
            # rumor or a sync): w1 dials none of them to tell them
            await asyncio.sleep(1.0)
            untold = [c for c in others if _sees("w1")(await c.status())]
            assert untold, "w1 dialed every peer to say it drains"
            # one of them plans over w1 and asks to watch it: the answer is that it drains
            planner = untold[0]
            await asyncio.gather(*(planner.submit("quick", x=i, timeout=30) for i in range(4)))
            status = await status_when(planner, lambda s: not _sees("w1")(s), tries=300)
            assert not _sees("w1")(status), "a planner asked to watch w1 and was not told"
            assert await slow is not None  # and w1 finished its own job before it left
        finally:
            for client in clients:
                await client.aclose()
        assert await cluster.workers[1].stop() == 0


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_stopping_worker_sends_the_result_it_owes_over_a_channel_closed_idle(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    """w1 runs a task of w0's job while its channel to w0 closes idle; stopped meanwhile, it
    finishes the task and dials w0 to send the result before it leaves (a leaving worker
    dials nobody: the result was dropped, and the job planned again once w1 was found
    gone)."""
    spec = one_worker_workload(tmp_path, slow=("m", 2000))
    args = [
        "--workload", spec, "--drain-timeout", "30", "--peer-idle-s", "0.3",
        # probes too rare to open a channel, or to find w1 gone, while the test runs
        "--probe-period-ms", "20000", "--probe-timeout-ms", "5000",
    ]  # fmt: skip
    async with LocalCluster(2, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        async with cluster.client(0) as c0:
            traced = JobOptions(trace=True)
            # two at once: w0 runs one and plans the other on idle w1
            jobs = [
                asyncio.ensure_future(c0.submit_job("slow", x=i, options=traced, timeout=60))
                for i in range(2)
            ]
            await status_when(c0, lambda s: len(s.view["watching"]) == 1)
            await asyncio.sleep(0.8)  # the channels between them close idle meanwhile
            assert await cluster.workers[1].stop() == 0  # it drains, then leaves
            traces = [(await job).trace for job in jobs]
        ran = sorted((t.worker, t.attempt) for trace in traces if trace for t in trace.tasks)
        assert ran == [("w0", 0), ("w1", 0)], ran  # each ran once, as first planned
