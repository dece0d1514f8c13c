"""Objectives on real worker processes: a deadline no plan can meet is refused at once, a job
that falls too late on the way is dropped with nothing left behind on the worker, a higher
priority runs first, and a generous deadline changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from compass.cluster import LocalCluster
from compass.errors import DeadlineExceeded, DeadlineUnreachable
from compass.reports import WorkerStatus

from .conftest import compass_argv, status_when

DATA = {"x": 1}


def spec(tmp_path: Path) -> str:
    """``chain``: two 50 ms steps of model m; ``slow``: one 1.5 s step of the same model."""
    task = {"model": "m", "output_kb": 1, "after": []}
    workload = {
        "name": "deadlines",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 10}},
        "workflows": {
            "chain": {"tasks": {"a": {**task, "exec_ms": 50},
                                "b": {**task, "exec_ms": 50, "after": ["a"]}}},
            "slow": {"tasks": {"s": {**task, "exec_ms": 1500}}},
        },
    }  # fmt: skip
    path = tmp_path / "deadlines.json"
    path.write_text(json.dumps(workload))
    return str(path)


def idle(status: WorkerStatus) -> bool:
    queue = status.queue
    return bool(
        status.jobs_in_flight == 0
        and queue["ready"] == 0
        and queue["waiting_inputs"] == 0
        and queue["running"] == 0
    )


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_refused_dropped_prioritized_and_generous_jobs(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["--workload", spec(tmp_path), "--lanes", "1", "--no-warm"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        # generous: answered as before
        assert await client.submit("chain", deadline_ms=60_000, data=DATA) is not None

        # no plan meets 30 ms for 100 ms of work: refused at once, nothing runs
        with pytest.raises(DeadlineUnreachable, match=r"best plan finishes in 1\d\d\.\d ms"):
            await client.submit("chain", deadline_ms=30, data=DATA)

        # admitted (the worker is idle), then overtaken: a priority-9 job takes the lane
        # before the chain's second step, which then starts too late for its deadline
        chain = asyncio.create_task(client.submit("chain", deadline_ms=1000, data=DATA))
        await asyncio.sleep(0.01)
        slow = asyncio.create_task(client.submit("slow", priority=9, data=DATA))
        with pytest.raises(DeadlineExceeded, match="too late") as dropped:
            await chain
        assert dropped.value.job_id is not None
        assert await slow is not None  # the high-priority job ran
        status = await status_when(client, idle, tries=500)
        assert idle(status), status  # nothing of the dropped job left behind
        stats = status.stats
        assert (stats["jobs_unreachable"], stats["jobs_dropped"], stats["tasks_shed"]) == (1, 1, 1)
        slo = status.slo["chain"]["0"]  # by workflow and priority, for dashboards
        assert (slo["met"], slo["unreachable"], slo["dropped"]) == (1, 1, 1)

        # asked to finish regardless: the same race runs the chain to the end
        chain = asyncio.create_task(
            client.submit("chain", deadline_ms=1000, on_miss="finish", data=DATA)
        )
        await asyncio.sleep(0.01)
        slow = asyncio.create_task(client.submit("slow", priority=9, data=DATA))
        assert await chain is not None and await slow is not None


def test_the_cli_refuses_an_unreachable_deadline_in_one_line(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    token = "deadline-token-5d8c2e7a1f4b9e6c"
    worker = subprocess.Popen(
        compass_argv("worker", "start", "--port", "0", "--workload", spec(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**worker_env, "COMPASS_TOKEN": token},
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        address = worker.stdout.readline().split()[-1]
        done = subprocess.run(
            compass_argv("submit", address, "chain", "-i", "data=1", "--deadline-ms", "5"),
            capture_output=True, text=True, timeout=60,
            env={**worker_env, "COMPASS_TOKEN": token},
        )  # fmt: skip
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot meet its deadline of 5.0 ms" in lines[0], lines
    finally:
        worker.terminate()
        worker.wait(30)
        if worker.stdout is not None:
            worker.stdout.close()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_under_overload_the_lower_priority_is_shed_and_every_job_answered_once(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """24 level-0 chains, then 6 level-1 ones, all due in 1.5 s, on one lane that runs about
    ten chains a second: the level-1 jobs overtake and all make it; level-0 jobs that can no
    longer make it are refused or dropped from the queue, none is lost."""
    args = ["--workload", spec(tmp_path), "--lanes", "1", "--no-warm"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        assert await client.submit("chain", data=DATA) is not None  # the model is resident
        low = [client.submit("chain", deadline_ms=1500, data=DATA) for _ in range(24)]
        low_jobs = [asyncio.ensure_future(c) for c in low]
        await asyncio.sleep(0.05)
        high = [client.submit("chain", deadline_ms=1500, priority=1, data=DATA) for _ in range(6)]
        high_results = await asyncio.gather(*high, return_exceptions=True)
        low_results = await asyncio.gather(*low_jobs, return_exceptions=True)
        assert all(r is not None and not isinstance(r, BaseException) for r in high_results), (
            high_results
        )
        refused = [r for r in low_results if isinstance(r, DeadlineUnreachable)]
        dropped = [r for r in low_results if isinstance(r, DeadlineExceeded)]
        done = [r for r in low_results if not isinstance(r, BaseException)]
        assert len(refused) + len(dropped) + len(done) == 24, low_results
        assert dropped, low_results  # admitted, then overtaken: shed from the queue
        assert done  # the lane kept serving the level-0 jobs that still could make it
        status = await status_when(client, idle, tries=500)
        assert idle(status), status
        slo = status.slo["chain"]
        assert slo["1"]["met"] == 6 and slo["0"]["dropped"] == len(dropped)
        assert status.stats["tasks_shed"] >= len(dropped)
