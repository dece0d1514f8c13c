"""Workers killed through a run of the paper workload, ingresses included: a retrying client
loses no job, gets one answer per job, and every answer is right."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import numpy as np
import pytest

from compass import Client
from compass.cluster import LocalCluster

from .conftest import PAPER

FLOWS = ["translation", "question_answer", "img_to_sound", "object_detection"]


def _sink_bytes() -> dict[str, int]:
    """The declared output size of each paper workflow's one sink: an emulated answer is a
    zero payload of exactly that size."""
    spec = json.loads(Path(PAPER).read_text())
    sizes = {}
    for name, wf in spec["workflows"].items():
        tasks = wf["tasks"]
        fed = {p for t in tasks.values() for p in t.get("after", [])}
        (sink,) = [t for t in tasks if t not in fed]
        sizes[name] = round(tasks[sink]["output_kb"] * 1000)
    return sizes


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_killing_workers_through_a_run_loses_no_job(worker_env: dict[str, str]) -> None:
    args = ["--workload", PAPER, "--time-scale", "0.2", "--peer-timeout-ms", "1000"]
    sizes = _sink_bytes()
    rng = random.Random(7)
    payload = np.zeros(1000, dtype=np.uint8)
    async with LocalCluster(5, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        addresses = cluster.addresses
        # three clients, each starting at a different worker, each able to fail over to all
        clients = [
            Client(addresses[i:] + addresses[:i], token=cluster.token) for i in range(0, 5, 2)
        ]
        killed: list[str] = []

        async def kill_every(seconds: float, times: int) -> None:
            """Kill an ingress (a worker some client submits to now) or, every other time, a
            random worker, while jobs are in flight."""
            for k in range(times):
                await asyncio.sleep(seconds)
                alive = [w for w in cluster.workers if w.running]
                ingresses = [w for w in alive if w.address in {c.address for c in clients}]
                victim = rng.choice(ingresses if k % 2 == 0 and ingresses else alive)
                killed.append(victim.name)
                victim.kill()

        async def job(i: int) -> tuple[str, object]:
            await asyncio.sleep(i * 0.12)  # paced over the whole run
            flow = FLOWS[i % 4]
            return flow, await clients[i % 3].submit(flow, data=payload, timeout=120)

        try:
            killer = asyncio.create_task(kill_every(1.8, 3))
            results = await asyncio.gather(*(job(i) for i in range(60)), return_exceptions=True)
            await killer
        finally:
            for client in clients:
                await client.aclose()
    assert len(killed) == 3
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []  # none lost
    answers = [r for r in results if not isinstance(r, BaseException)]
    assert len(answers) == 60  # one answer each
    for flow, value in answers:  # and each right: its sink's output, whole
        assert isinstance(value, np.ndarray) and value.nbytes == sizes[flow], flow
