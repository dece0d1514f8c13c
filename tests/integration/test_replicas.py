"""``compass worker start --replicate`` on three real worker processes: a wave
of one model's jobs into the two workers holding it makes the third load that model before any
of its tasks is placed there; with --no-replicate, the third never loads it. In a bounded view
the third watches the holders' load while the cluster uses a model it lacks, and its leases
run out once the cluster idles."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass import Client
from compass.cluster import LocalCluster

#: a 1 MB input, 10 s to move at the spec's network speed: each job runs where it came in (a
#: load of m, 4 s, is cheaper than moving it), so the holders are the workers it is sent to
DATA = np.zeros(1_000_000, dtype=np.uint8)
TIME_SCALE = 0.2
JOB_TIMEOUT_S = 60.0


def wave_workload(tmp_path: Path) -> str:
    """One workflow of one 200 ms task on model ``m``, whose load takes 4 s: a holder's queue
    of a few tasks passes the rule's threshold (half the slack within 3x the job's best time,
    0.2 s), and no planner moves a job's input (10 s) to spread them. A second, ``cool``, on
    a small model ``k`` that fits beside ``m``."""
    spec = {
        "name": "wave",
        "cluster": {"workers": 3, "gpu_memory_mb": 1000, "h2d_gbps": 0.2, "d2h_gbps": 0.2,
                    "net_gbps": 0.0001, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 800}, "k": {"size_mb": 100}},
        "workflows": {
            "hot": {"tasks": {"t": {"model": "m", "exec_ms": 200, "input_kb": 1000,
                                    "output_kb": 1, "after": []}}},
            "cool": {"tasks": {"t": {"model": "k", "exec_ms": 200, "input_kb": 1000,
                                     "output_kb": 1, "after": []}}},
        },
    }  # fmt: skip
    path = tmp_path / "wave.json"
    path.write_text(json.dumps(spec))
    return str(path)


async def held(client: Client) -> set[str]:
    cache = (await client.status()).cache
    return set(cache["resident"]) | set(cache["loading"])


async def wave(clients: list[Client], seconds: float, per_worker: int) -> int:
    """Keep ``per_worker`` jobs in flight at each of ``clients``' workers for ``seconds``;
    the jobs answered."""
    ends = time.monotonic() + seconds
    answered = 0

    async def loop(client: Client) -> None:
        nonlocal answered
        while time.monotonic() < ends:
            await client.submit("hot", data=DATA, timeout=JOB_TIMEOUT_S)
            answered += 1

    await asyncio.gather(*(loop(c) for c in clients for _ in range(per_worker)))
    return answered


async def run_wave(
    spec: str, logs: Path, env: dict[str, str], replicate: bool
) -> dict[str, object]:
    """The wave on a fresh cluster; what the third worker holds and says after it."""
    args = ["--workload", spec, "--time-scale", str(TIME_SCALE), "--no-warm"]
    args.append("--replicate" if replicate else "--no-replicate")
    async with (
        LocalCluster(3, args=args, env=env, log_dir=logs) as cluster,
        holders_of_m(cluster) as clients,
    ):
        assert [("m" in await held(c)) for c in clients] == [True, True, False]
        answered = await wave(clients[:2], seconds=6.0, per_worker=4)
        third = await clients[2].status()
        return {
            "answered": answered,
            "held": set(third.cache["resident"]) | set(third.cache["loading"]),
            "replicas": third.to_json().get("replicas", {}),
            "tasks_run": third.stats["tasks_run"],
        }


@contextlib.asynccontextmanager
async def holders_of_m(cluster: LocalCluster) -> AsyncIterator[list[Client]]:
    """A client of each worker, once w0 and w1 hold ``m``: a job at each runs where it came
    in, loading m there."""
    clients = [cluster.client(i) for i in range(3)]
    try:
        for c in clients:
            await c.connect()
        for c in clients[:2]:
            await c.submit("hot", data=DATA, timeout=JOB_TIMEOUT_S)
        yield clients
    finally:
        for c in clients:
            await c.aclose()


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_wave_on_two_holders_warms_the_model_on_the_third_only_with_replicate(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    spec = wave_workload(tmp_path)
    on = await run_wave(spec, tmp_path / "on", worker_env, replicate=True)
    off = await run_wave(spec, tmp_path / "off", worker_env, replicate=False)
    print(f"replicate on: {on}\nreplicate off: {off}")
    # on: the third warmed m by the rule: the load counts only if m was neither resident nor
    # loading there, so it came before any task of m was placed there
    replicas = dict(on["replicas"])  # type: ignore[call-overload]
    replicas.pop("watching")  # the holders w2 watches, if its lease still holds
    assert replicas == {"warmed": 1, "models": {"m": 1}, "held": ["m"], "failures": 0}
    assert "m" in on["held"]  # type: ignore[operator]
    # off: the same wave leaves the third without m, and nothing placed there
    assert off["replicas"] == {}
    assert off["held"] == set() and off["tasks_run"] == 0


async def watches(cluster: LocalCluster) -> dict[str, dict[str, list[str]]]:
    """Per worker: the peers its replication watches, and those watching its load."""
    out = {}
    for i in range(len(cluster.workers)):
        async with cluster.client(i) as client:
            status = await client.status()
        out[status.name] = {
            "replicas": list(status.to_json()["replicas"]["watching"]),
            "watchers": list(status.view.get("watchers", [])),
        }
    return out


async def until(cluster: LocalCluster, settled: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The watches once ``settled`` says so (polled for 30 s at most)."""
    ends = time.monotonic() + 30.0
    seen = await watches(cluster)
    while not settled(seen) and time.monotonic() < ends:
        await asyncio.sleep(0.2)
        seen = await watches(cluster)
    return seen


def idle(seen: dict[str, Any]) -> bool:
    return all(not w["replicas"] and not w["watchers"] for w in seen.values())


@pytest.mark.asyncio
@pytest.mark.timeout(180)
@pytest.mark.parametrize("view", ["bounded", "mesh"])
async def test_replication_watches_the_holders_under_load_and_an_idle_cluster_none(
    view: str, worker_env: dict[str, str], tmp_path: Path
) -> None:
    """The wave of the test above (replication on): in a bounded view w2 watches
    m's holders while they run it (and warms m); idle, every lease runs out. Then one job of
    ``cool`` at w0 loads k there: w2, which lacks k, watches w0 again while k is in use, and
    none once it idles (it used to watch the holder of a model it lacked for as long as it
    had headroom). The mesh watches nobody, and warms m from the heartbeats."""
    spec = wave_workload(tmp_path)
    args = ["--workload", spec, "--time-scale", str(TIME_SCALE), "--no-warm", "--view", view,
            "--replicate"]  # fmt: skip
    async with (
        LocalCluster(3, args=args, env=worker_env, log_dir=tmp_path / "logs") as cluster,
        holders_of_m(cluster) as clients,
    ):
        seen: list[dict[str, Any]] = []

        async def watch_the_wave() -> None:
            while True:
                seen.append(await watches(cluster))
                await asyncio.sleep(0.2)

        poll = asyncio.ensure_future(watch_the_wave())
        try:
            await wave(clients[:2], seconds=6.0, per_worker=4)
        finally:
            poll.cancel()
        assert "m" in await held(clients[2])
        wave_watches = {p for s in seen for p in s["w2"]["replicas"]}
        calm = await until(cluster, idle)
        await clients[0].submit("cool", data=DATA, timeout=JOB_TIMEOUT_S)
        again = await until(cluster, lambda s: bool(s["w2"]["replicas"]) or view == "mesh")
        after = await until(cluster, idle)
    print(f"{view}: wave {wave_watches}, calm {calm}, again {again}, after {after}")
    if view == "bounded":
        assert wave_watches == {"w0", "w1"}
        assert any("w2" in s["w0"]["watchers"] and "w2" in s["w1"]["watchers"] for s in seen)
        assert again["w2"]["replicas"] == ["w0"] and "w2" in again["w0"]["watchers"]
    else:
        assert wave_watches == set() and not any(w["watchers"] for s in seen for w in s.values())
        assert idle(again)
    assert idle(calm) and idle(after), (calm, after)
