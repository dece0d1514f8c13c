"""``compass worker start --replicate`` on three real worker processes: a wave of one model's
jobs into the two workers holding it makes the third load that model before any of its tasks
is placed there; without the flag, the third never loads it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

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
    0.2 s), and no planner moves a job's input (10 s) to spread them."""
    spec = {
        "name": "wave",
        "cluster": {"workers": 3, "gpu_memory_mb": 1000, "h2d_gbps": 0.2, "d2h_gbps": 0.2,
                    "net_gbps": 0.0001, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 800}},
        "workflows": {
            "hot": {"tasks": {"t": {"model": "m", "exec_ms": 200, "input_kb": 1000,
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
    if replicate:
        args.append("--replicate")
    async with LocalCluster(3, args=args, env=env, log_dir=logs) as cluster:
        clients = [cluster.client(i) for i in range(3)]
        try:
            for c in clients:
                await c.connect()
            # the holders: a job at each of w0 and w1 runs where it came in, loading m there
            for c in clients[:2]:
                await c.submit("hot", data=DATA, timeout=JOB_TIMEOUT_S)
            assert [("m" in await held(c)) for c in clients] == [True, True, False]
            answered = await wave(clients[:2], seconds=6.0, per_worker=4)
            third = await clients[2].status()
            return {
                "answered": answered,
                "held": set(third.cache["resident"]) | set(third.cache["loading"]),
                "replicas": third.to_json().get("replicas", {}),
                "tasks_run": third.stats["tasks_run"],
            }
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
    assert on["replicas"] == {"warmed": 1, "models": {"m": 1}, "held": ["m"], "failures": 0}
    assert "m" in on["held"]  # type: ignore[operator]
    # off: the same wave leaves the third without m, and nothing placed there
    assert off["replicas"] == {}
    assert off["held"] == set() and off["tasks_run"] == 0
