"""Channels to peers on demand, on real worker processes over loopback: an idle cluster of 6
holds fewer channels per worker than it has peers, no worker exceeds --max-peer-channels, jobs
still run across all of them, and a SIGKILLed worker is still dropped by every peer."""

from __future__ import annotations

import asyncio
import statistics

import numpy as np
import pytest

from compass.cluster import LocalCluster
from compass.reports import WorkerStatus

from .conftest import PAPER, kill_last

WORKERS = 6
CAP = 3
#: idle after half a second; a probe a second; heartbeats every 5 s unless something changes
ARGS = ["--workload", PAPER, "--time-scale", "0.05", "--peer-idle-s", "0.5",
        "--max-peer-channels", str(CAP), "--probe-period-ms", "1000", "--probe-timeout-ms",
        "300", "--heartbeat-ms", "5000", "--peer-timeout-ms", "10000"]  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_an_idle_cluster_holds_few_channels_and_still_runs_and_detects(
    worker_env: dict[str, str],
) -> None:
    async with LocalCluster(WORKERS, args=ARGS, env=worker_env) as cluster:
        await cluster.wait_joined()
        clients = [cluster.client(i) for i in range(WORKERS)]
        for client in clients:
            await client.connect()
        try:
            await asyncio.sleep(1.5)  # the join's channels go idle
            samples: list[list[int]] = []
            for _ in range(30):
                statuses: list[WorkerStatus] = await asyncio.gather(*(c.status() for c in clients))
                assert all(len(s.peers) == WORKERS - 1 for s in statuses)  # all live
                samples.append([s.peer_channels for s in statuses])
                await asyncio.sleep(0.1)
            per_worker = [statistics.median(col) for col in zip(*samples, strict=True)]
            print(f"\nidle, {WORKERS} workers, {WORKERS - 1} peers each: channels per worker "
                  f"(median of 30 samples over 3 s) {per_worker}, most seen "
                  f"{max(map(max, samples))}")  # fmt: skip
            assert max(map(max, samples)) <= CAP
            assert all(m < WORKERS - 1 for m in per_worker)
            for status in statuses:
                assert not any(p["suspect"] for p in status.peers) and not status.lost

            # jobs still run across all of them
            payload = np.zeros(1000, dtype=np.uint8)
            flows = ["translation", "question_answer", "img_to_sound", "object_detection"]
            results = await asyncio.gather(
                *(clients[i % WORKERS].submit(flows[i % 4], data=payload, timeout=60)
                  for i in range(24))
            )  # fmt: skip
            assert len(results) == 24
            statuses = await asyncio.gather(*(c.status() for c in clients))
            assert all(s.peer_channels <= CAP for s in statuses)

            # a SIGKILLed worker is dropped by every peer, channel to it or not
            statuses = await kill_last(cluster, clients)
            assert all(len(s.peers) == WORKERS - 2 for s in statuses)
        finally:
            for client in clients:
                await client.aclose()
