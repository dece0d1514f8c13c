"""Issue 24: a join costs O(1) dials, on real worker processes over loopback. Eight workers join
one seed: each made one join handshake (with its seed) whatever the cluster's size, where each
used to dial every member its seed named; they still all see each other, jobs run across all of
them, and a SIGKILLed worker is still dropped by every peer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from compass.cluster import LocalCluster
from compass.reports import WorkerStatus

from .conftest import PAPER, kill_last

WORKERS = 8
ARGS = ["--workload", PAPER, "--time-scale", "0.05", "--peer-timeout-ms", "3000"]


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_workers_joining_one_seed_make_one_join_handshake_each(
    worker_env: dict[str, str],
) -> None:
    async with LocalCluster(WORKERS, args=ARGS, env=worker_env) as cluster:
        await cluster.wait_joined()
        clients = [cluster.client(i) for i in range(WORKERS)]
        for client in clients:
            await client.connect()
        try:
            statuses: list[WorkerStatus] = await asyncio.gather(*(c.status() for c in clients))
            joins = [s.peer_handshakes["join"] for s in statuses]
            redials = [s.peer_handshakes["redial"] for s in statuses]
            print(f"\n{WORKERS} workers joined one seed: join handshakes made {joins}, redials "
                  f"(on demand: probes, rumors, syncs) {redials}, channels open "
                  f"{[s.peer_channels for s in statuses]}")  # fmt: skip
            assert joins[0] == 0  # the seed joined nobody
            # each joiner dialed its seed (once more, at most, had its first try failed); it
            # used to dial every member named too: 1, 2, ..., 7 handshakes
            assert all(1 <= j <= 2 for j in joins[1:]), joins
            assert all(len(s.peers) == WORKERS - 1 for s in statuses)

            # jobs run across all of them
            payload = np.zeros(1000, dtype=np.uint8)
            flows = ["translation", "question_answer", "img_to_sound", "object_detection"]
            results = await asyncio.gather(
                *(clients[i % WORKERS].submit(flows[i % 4], data=payload, timeout=60)
                  for i in range(4 * WORKERS))
            )  # fmt: skip
            assert len(results) == 4 * WORKERS

            # a SIGKILLed worker is dropped by every peer, channel to it or not
            statuses = await kill_last(cluster, clients)
            assert all(len(s.peers) == WORKERS - 2 for s in statuses)
        finally:
            for client in clients:
                await client.aclose()
