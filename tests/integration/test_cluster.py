"""Several worker processes: decentralized planning, every policy, a worker killed mid-run."""

from __future__ import annotations

import asyncio
import signal

import numpy as np
import pytest
import torch

from compass.cluster import LocalCluster
from compass.reports import JobRecord
from compass.sched import POLICY_NAMES
from examples import vision_app

from .conftest import PAPER

PAPER_FLOWS = ["translation", "question_answer", "img_to_sound", "object_detection"]


async def _trace(cluster: LocalCluster, index: int) -> list[JobRecord]:
    async with cluster.client(index) as client:
        return await client.records()


@pytest.mark.asyncio
async def test_jobs_from_every_ingress_spread_over_the_cluster(worker_env: dict[str, str]) -> None:
    args = ["--workload", PAPER, "--time-scale", "0.05"]
    payload = np.zeros(3000 * 1000, dtype=np.uint8)
    async with LocalCluster(3, args=args, env=worker_env) as cluster:
        clients = [cluster.client(i) for i in range(3)]
        for client in clients:
            await client.connect()
        try:
            jobs = [
                clients[i % 3].submit(PAPER_FLOWS[i % 4], data=payload, timeout=60)
                for i in range(24)
            ]
            results = await asyncio.gather(*jobs)
        finally:
            for client in clients:
                await client.aclose()
        assert len(results) == 24
        traces = [await _trace(cluster, i) for i in range(3)]
    assert [len(t) for t in traces] == [8, 8, 8]
    used = {worker for trace in traces for record in trace for worker in record.plan.values()}
    assert used == {"w0", "w1", "w2"}
    assert all(record.ok for trace in traces for record in trace)


def _policy_pairs() -> list[tuple[str, str]]:
    """Every policy, two to a cluster of two workers, one per worker (each worker plans the
    jobs it is the ingress of with its own policy, over both workers: a cluster tries two
    policies for the cost of one); ``central`` on both workers of a cluster of its own, so
    that w1 asks w0 for its plans."""
    others = [name for name in POLICY_NAMES if name != "central"]
    if len(others) % 2:
        others.append(others[0])
    return [*zip(others[::2], others[1::2], strict=True), ("central", "central")]


@pytest.mark.asyncio
@pytest.mark.parametrize("policies", _policy_pairs(), ids="+".join)
async def test_every_policy_gives_correct_results(
    policies: tuple[str, str], worker_env: dict[str, str]
) -> None:
    """Each worker of two runs one of ``policies``: the jobs submitted to it are planned with
    that policy over both workers; ``central`` on both, so that w1's jobs are planned at w0."""
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    expected = vision_app.reference(images)
    args = ["--app", "examples.vision_app"]
    async with LocalCluster(1, args=[*args, "--policy", policies[0]], env=worker_env) as cluster:
        await cluster.spawn("w1", join=cluster.addresses[0], extra=["--policy", policies[1]])
        await cluster.wait_joined()
        for index, policy in enumerate(policies):
            async with cluster.client(index) as client:
                assert (await client.status()).policy == policy
                results = await asyncio.gather(
                    *(client.submit("describe", image=images) for _ in range(4))
                )
            for got in results:
                for key, value in expected.items():
                    assert torch.equal(got[key], value), (policy, key)


@pytest.mark.asyncio
async def test_killed_worker_every_job_answered_exactly_once(worker_env: dict[str, str]) -> None:
    # slow enough that the victim holds queued and running tasks when it dies
    args = ["--workload", PAPER, "--time-scale", "0.2", "--peer-timeout-ms", "1000"]
    payload = np.zeros(1000, dtype=np.uint8)
    async with LocalCluster(4, args=args, env=worker_env) as cluster:
        ingresses = [cluster.client(i) for i in range(3)]
        for client in ingresses:
            await client.connect()
        try:
            jobs = [
                asyncio.ensure_future(
                    ingresses[i % 3].submit(PAPER_FLOWS[i % 4], data=payload, timeout=120)
                )
                for i in range(30)
            ]
            await asyncio.sleep(0.5)
            assert not all(job.done() for job in jobs)
            cluster.workers[3].kill()
            results = await asyncio.gather(*jobs, return_exceptions=True)
        finally:
            for client in ingresses:
                await client.aclose()
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == []
        traces = [await _trace(cluster, i) for i in range(3)]
    records = [record for trace in traces for record in trace]
    assert len(records) == 30
    assert len({record.job for record in records}) == 30  # answered once each
    assert all(record.ok for record in records)
    assert any(record.attempts > 1 for record in records)  # some were re-planned
    assert all("w3" not in record.plan.values() for record in records if record.attempts > 1)


@pytest.mark.asyncio
async def test_silent_peer_is_removed_and_a_restarted_worker_rejoins(
    worker_env: dict[str, str],
) -> None:
    args = ["--workload", PAPER, "--heartbeat-ms", "20", "--peer-timeout-ms", "400"]
    async with LocalCluster(3, args=args, env=worker_env) as cluster:
        victim = cluster.workers[2]
        victim.process.send_signal(signal.SIGSTOP)  # alive but silent
        try:
            async with cluster.client(0) as client:
                for _ in range(100):
                    names = [p["name"] for p in (await client.status()).peers]
                    if names == ["w1"]:
                        break
                    await asyncio.sleep(0.05)
                assert names == ["w1"]
        finally:
            victim.kill()
            victim.process.send_signal(signal.SIGCONT)
            await victim.stop()
        cluster.workers.remove(victim)
        await cluster.spawn("w2", join=cluster.addresses[1])
        await cluster.wait_joined(timeout=20)
        async with cluster.client(0) as client:
            assert [p["name"] for p in (await client.status()).peers] == ["w1", "w2"]
            payload = np.zeros(10, dtype=np.uint8)
            results = await asyncio.gather(
                *(client.submit(flow, data=payload, timeout=60) for flow in PAPER_FLOWS)
            )
            assert len(results) == 4


@pytest.mark.asyncio
async def test_changes_are_gossiped_without_waiting_for_the_periodic_heartbeat(
    worker_env: dict[str, str],
) -> None:
    # The periodic heartbeat is a minute apart, so only change-driven heartbeats can bring
    # each worker's view of its peers up to date while the test runs.
    args = [
        "--workload", PAPER,
        "--heartbeat-ms", "60000", "--heartbeat-min-ms", "1", "--peer-timeout-ms", "120000",
    ]  # fmt: skip
    async with (
        LocalCluster(2, args=args, env=worker_env) as cluster,
        cluster.client(0) as c0,
        cluster.client(1) as c1,
    ):
        payload = np.zeros(10, dtype=np.uint8)
        await asyncio.gather(
            *(c.submit(flow, data=payload, timeout=60) for c in (c0, c1) for flow in PAPER_FLOWS)
        )
        for _ in range(200):
            s0, s1 = await asyncio.gather(c0.status(), c1.status())
            views = {"w0": s1.cluster, "w1": s0.cluster}
            agree = all(
                next(r for r in views[s.name] if r["name"] == s.name)["models"]
                == s.cache["resident"]
                for s in (s0, s1)
            )
            if agree and all(s.cache["resident"] for s in (s0, s1)):
                break
            await asyncio.sleep(0.05)
        assert agree, (
            s0.cache["resident"],
            views["w0"],
            s1.cache["resident"],
            views["w1"],
        )


@pytest.mark.asyncio
async def test_workers_learn_each_others_measured_h2d_bandwidth(
    worker_env: dict[str, str],
) -> None:
    # real models (the vision app): every worker times its own host-to-device copies, and its
    # peers adopt the figure instead of the first guess (10 GB/s) they start with
    async with (
        LocalCluster(2, args=["--app", "examples.vision_app"], env=worker_env) as cluster,
        cluster.client(0) as c0,
        cluster.client(1) as c1,
    ):
        images = torch.randn(2, 3, 32, 32)
        await asyncio.gather(
            c0.submit("describe", image=images), c1.submit("describe", image=images)
        )
        learned = False
        for _ in range(200):
            s0, s1 = await asyncio.gather(c0.status(), c1.status())
            rows = {s.name: {r["name"]: r["h2d_gbps"] for r in s.cluster} for s in (s0, s1)}
            own = {w: rows[w][w] for w in ("w0", "w1")}
            seen = {"w0": rows["w1"]["w0"], "w1": rows["w0"]["w1"]}
            learned = all(own[w] != 10.0 and abs(seen[w] - own[w]) <= 0.021 * own[w] for w in own)
            if learned:
                break
            await asyncio.sleep(0.05)
        assert learned, (own, seen)
