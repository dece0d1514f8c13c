"""``compass up --autoscale``'s adapter on real worker processes: it grows a cluster to MIN,
drains the surplus over MAX with jobs in flight (every one answered), and keeps serving when a
worker fails to start."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compass.cluster import LocalCluster
from compass.elastic.local import LocalAutoscaler
from compass.errors import ConfigError

from .conftest import PAPER, compass_argv, worker_environment

DATA = np.zeros(1000, dtype=np.uint8)
ARGS = ["--workload", PAPER, "--time-scale", "0.05", "--cache-mb", "8000"]


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_grows_to_min_drains_past_max_and_survives_a_failed_start(
    worker_env: dict[str, str],
) -> None:
    lines: list[str] = []
    async with LocalCluster(1, args=ARGS, env=worker_env) as cluster:
        # an idle cluster of 1 wants 1; MIN 2 starts one more, joined to the first
        grow = LocalAutoscaler(cluster, 2, 3, say=lines.append)
        assert await grow.step() == 2
        await cluster.wait_joined()
        async with cluster.client() as client:
            status = await client.status()
            assert len(status.peers) == 1
            assert status.desired_workers["desired"] >= 1

            # MAX 1 drains the newest worker while jobs run: every job is answered
            names = ["translation", "question_answer", "img_to_sound", "object_detection"]
            jobs = [
                asyncio.ensure_future(client.submit(n, data=DATA, timeout=60)) for n in names * 2
            ]
            await asyncio.sleep(0.2)
            shrink = LocalAutoscaler(cluster, 1, 1, say=lines.append)
            assert await shrink.step() == 1
            assert shrink.drained == 1 and any("drained w1 (exit 0)" in line for line in lines)
            results = await asyncio.gather(*jobs)
            assert len(results) == len(jobs)

        # a worker that fails to start: reported in one line, the cluster keeps serving
        broken = LocalAutoscaler(cluster, 2, 2, extra=["--lanes", "0"], say=lines.append)
        assert await broken.step() == 1
        assert broken.failed == 1
        (failure,) = [line for line in lines if "failed to start" in line]
        assert "\n" not in failure and "w2" in failure
        async with cluster.client() as client:
            assert await client.submit("translation", data=DATA, timeout=60) is not None


def test_bounds_are_refused_in_one_line(tmp_path: Path) -> None:
    cluster = LocalCluster(1, log_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"MIN \(3\) is above MAX \(2\)"):
        LocalAutoscaler(cluster, 3, 2)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_worker_sizes_its_desired_count_by_the_shipped_table(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    """``--capacity-table``: one lane busy on a cluster held to a utilization of 0.5 times a
    margin of 0.5 wants four workers; one utilization (0.6) would want two at most."""
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"by_size": [[1, 0.5], [4, 0.5]], "margin": 0.5}))
    args = ["--workload", PAPER, "--time-scale", "1", "--cache-mb", "8000",
            "--capacity-table", str(table)]  # fmt: skip
    cluster = LocalCluster(1, args=args, env=worker_env, log_dir=tmp_path)
    async with cluster, cluster.client() as client:
        assert (await client.status()).desired_workers["desired"] == 1  # idle
        job = asyncio.ensure_future(client.submit("translation", data=DATA, timeout=60))
        desired = 1
        for _ in range(200):  # the windows fill with busy samples while the job runs
            desired = (await client.status()).desired_workers["desired"]
            if desired >= 4 or job.done():
                break
            await asyncio.sleep(0.05)
        assert desired == 4
        await job


def test_a_bad_table_stops_the_worker_in_one_line(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text('{"by_size": [[4, 0.5], [2, 0.5]]}')
    done = subprocess.run(
        compass_argv("worker", "start", "--port", "0", "--capacity-table", str(table)),
        capture_output=True, text=True, timeout=60, env=worker_environment(),
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("compass: --capacity-table:") and "increasing sizes" in line
