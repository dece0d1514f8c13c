"""The failure detector on real worker processes, with the default settings: a SIGKILLed worker
is dropped by every peer within a second, and the jobs go on around it."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from compass import Client
from compass.cluster import LocalCluster
from compass.reports import WorkerStatus

from .conftest import PAPER

WORKERS = 5
#: the detector's budget: a probe period or two to find it, a confirmed suspicion
#: (3 x 200 ms), the news spread; on one host the broken connections start the probes at once
DROPPED_WITHIN_S = 1.0


async def _dropped(client: Client, victim: str, t0: float) -> float:
    """Seconds from ``t0`` until ``client``'s worker has ``victim`` neither as a peer nor in
    its view."""
    while True:
        status: WorkerStatus = await client.status(timeout=5.0)
        names = {p["name"] for p in status.peers} | {r["name"] for r in status.cluster}
        if victim not in names:
            return time.monotonic() - t0
        if time.monotonic() - t0 > 30.0:
            pytest.fail(f"{status.name} still has {victim} after 30 s")
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_killed_worker_is_dropped_by_every_peer_within_a_second(
    worker_env: dict[str, str],
) -> None:
    args = ["--workload", PAPER, "--time-scale", "0.05"]
    async with LocalCluster(WORKERS, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        clients = [cluster.client(i) for i in range(WORKERS - 1)]
        for client in clients:
            await client.connect()
        try:
            await asyncio.sleep(1.0)  # every worker probing every other a few times
            victim = cluster.workers[-1]
            t0 = time.monotonic()
            victim.kill()
            times = await asyncio.gather(*(_dropped(c, victim.name, t0) for c in clients))
            print(f"\nSIGKILLed worker of {WORKERS} dropped by every peer after "
                  f"{max(times) * 1000:.0f} ms (each: "
                  f"{', '.join(f'{t * 1000:.0f}' for t in times)} ms)")  # fmt: skip
            assert max(times) < DROPPED_WITHIN_S, times
            # nobody else was dropped, and jobs run on the survivors
            for client in clients:
                status = await client.status()
                assert len(status.peers) == WORKERS - 2
                assert not any(p["suspect"] for p in status.peers)
            payload = np.zeros(1000, dtype=np.uint8)
            flows = ["translation", "question_answer", "img_to_sound", "object_detection"]
            results = await asyncio.gather(
                *(clients[i % 4].submit(flows[i % 4], data=payload, timeout=60) for i in range(8))
            )
            assert len(results) == 8
        finally:
            for client in clients:
                await client.aclose()
