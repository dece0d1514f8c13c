"""The bounded view with real worker processes: an idle cluster heartbeats nobody, a planner
watches its candidates and they send it their load, and every cache reaches every view."""

from __future__ import annotations

import asyncio
import statistics
import time

import numpy as np
import pytest

from compass.cluster import LocalCluster
from compass.reports import WorkerStatus

from .conftest import PAPER

FLOWS = ["translation", "question_answer", "img_to_sound", "object_detection"]


async def _statuses(cluster: LocalCluster) -> list[WorkerStatus]:
    async def one(i: int) -> WorkerStatus:
        async with cluster.client(i) as client:
            status: WorkerStatus = await client.status()
            return status

    return list(await asyncio.gather(*(one(i) for i in range(len(cluster.workers)))))


async def _all_in_view(cluster: LocalCluster, tries: int = 300) -> list[WorkerStatus]:
    """The statuses once every worker's view holds every worker."""
    n = len(cluster.workers)
    for _ in range(tries):
        statuses = await _statuses(cluster)
        if all(len(s.cluster) == n for s in statuses):
            return statuses
        await asyncio.sleep(0.05)
    raise AssertionError(f"views never held all {n}: {[len(s.cluster) for s in statuses]}")


@pytest.mark.asyncio
@pytest.mark.parametrize("view", ["bounded", "mesh"])
async def test_an_idle_bounded_cluster_heartbeats_nobody(view: str, worker_env: dict[str, str]):
    """Idle, a bounded view sends no state to anyone (its rows age), the mesh sends its state
    to every peer every 10 ms (its rows stay young); either way every view holds every
    worker, joined at once. With hot-model replication on (``--replicate``): with nothing in
    use, a worker with headroom watches no holder (test_replicas.py)."""
    args = ["--workload", PAPER, "--time-scale", "0.05", "--view", view, "--replicate"]
    async with LocalCluster(4, args=args, env=worker_env) as cluster:
        statuses = await _all_in_view(cluster)
        whole = time.monotonic()
        assert {s.view["kind"] for s in statuses} == {view}

        def aged(statuses: list[WorkerStatus]) -> bool:
            # a peer's sync may have refreshed one row since; the rest heard nothing for 1 s
            return all(sorted(_ages(s))[1] > 1000.0 for s in statuses)

        # idle for 1.5 s at least: the mesh's rows would be older than 1 s by then, had it
        # stopped sending; the bounded view's are, once a second has passed (waited for)
        await asyncio.sleep(1.5)
        statuses = await _statuses(cluster)
        while view == "bounded" and not aged(statuses) and time.monotonic() - whole < 20.0:
            await asyncio.sleep(0.1)
            statuses = await _statuses(cluster)
    for status in statuses:
        ages = _ages(status)
        assert len(ages) == 3
        assert status.to_json()["replicas"]["watching"] == []
        if view == "bounded":
            assert sorted(ages)[1] > 1000.0, (status.name, ages)
            assert status.view["watchers"] == [] and status.view["watching"] == []
        else:
            assert statistics.median(ages) < 1000.0, (status.name, ages)


def _ages(status: WorkerStatus) -> list[float]:
    """How old each of its peers' rows in ``status``'s view is, in ms."""
    return [r["age_ms"] for r in status.cluster if r["name"] != status.name]


@pytest.mark.asyncio
async def test_a_planner_watches_its_candidates_and_every_cache_reaches_every_view(
    worker_env: dict[str, str],
) -> None:
    """Jobs submitted at w0 only: w0 watches the candidates it planned over, each of those
    knows w0 watches it, the jobs are answered, and once the caches have settled every
    worker's view of every worker's cache is that worker's own (rumors, not heartbeats)."""
    args = ["--workload", PAPER, "--time-scale", "0.05", "--candidates", "1", "--holders", "1"]
    payload = np.zeros(3000 * 1000, dtype=np.uint8)
    async with LocalCluster(5, args=args, env=worker_env) as cluster:
        await _all_in_view(cluster)
        async with cluster.client(0) as client:
            jobs = [client.submit(FLOWS[i % 4], data=payload, timeout=60) for i in range(16)]
            assert len(await asyncio.gather(*jobs)) == 16
            status = await client.status()
        watching = status.view["watching"]
        assert watching and "w0" not in watching
        statuses = {s.name: s for s in await _statuses(cluster)}
        for peer in watching:
            assert "w0" in statuses[peer].view["watchers"], peer
        for _ in range(100):  # rumors: a few periods of 100 ms each
            statuses = {s.name: s for s in await _statuses(cluster)}
            caches = {n: sorted(s.cache["resident"]) for n, s in statuses.items()}
            views = {n: {r["name"]: r["models"] for r in s.cluster} for n, s in statuses.items()}
            if all(views[n] == caches for n in views):
                break
            await asyncio.sleep(0.1)
        assert all(views[n] == caches for n in views), (caches, views)
        assert any(caches.values()), "no model was ever loaded"
