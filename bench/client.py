"""``compass bench client``: a small call's latency behind a large submission, against alone.

One worker process runs ``examples.vision_app``, whose ``echo`` workflow returns its input; the
clients run in this process on uvloop. Two clients of the same worker are compared, round by
round in turn so that both see the same background noise:

- **one connection** (``bulk_threshold=None``): every call shares one TCP stream, so a small
  call made just after a 128 MiB submission waits for its frame to cross, both ways;
- **bulk connection** (the default): submissions above 1 MiB travel on a second connection to
  the same worker.

Per side: *alone*, sequential small echo submissions with nothing else in flight; *behind*, the
small submission made right after a large one starts (one per round); *during*, every small
submission made back to back while the large one is in flight; and the large one's round trip.
The figure of merit, *ratio*, is behind p50 / alone p50 (target: at most 10).

Run: ``compass bench client [--rounds 10] [--mib 128] [--json results/client.json]``.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from compass.client import Client
from compass.cluster import LocalCluster
from compass.errors import CompassError, ConfigError
from compass.wire.transport import new_event_loop

from .report import machine, print_table, write_json

__all__ = ["run"]

MiB = 1 << 20
TARGET_RATIO = 10.0
ALONE_CALLS = 200
ROOT = Path(__file__).resolve().parents[1]
SIDES = {"one connection": None, "bulk connection": 1 * MiB}


async def _alone(client: Client, calls: int) -> list[float]:
    seconds = []
    for i in range(calls):
        t0 = time.perf_counter()
        if await client.submit("echo", x=i) != i:
            raise CompassError(f"echo returned something other than {i}")
        seconds.append(time.perf_counter() - t0)
    return seconds


async def _round(client: Client, big: np.ndarray) -> tuple[float, list[float], float]:
    """One large submission with small ones behind it: (behind, during, large round trip)."""
    t_big = time.perf_counter()
    large = asyncio.create_task(client.submit("echo", x=big, timeout=None))
    await asyncio.sleep(0)  # the large request is written (or queued) before the small one
    t0 = time.perf_counter()
    await client.submit("echo", x=0)
    behind = time.perf_counter() - t0
    during: list[float] = []
    while not large.done():
        t0 = time.perf_counter()
        await client.submit("echo", x=len(during))
        during.append(time.perf_counter() - t0)
    echoed = await large
    big_s = time.perf_counter() - t_big
    if not (echoed.shape == big.shape and echoed[-1] == big[-1] and echoed[0] == big[0]):
        raise CompassError("the large echo came back different")
    return behind, during, big_s


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


async def _measure(rounds: int, mib: int) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("COMPASS_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    big = np.arange(mib * MiB, dtype=np.uint8)
    async with LocalCluster(1, args=["--app", "examples.vision_app"], env=env) as cluster:
        clients = {
            side: Client(cluster.addresses[0], token=cluster.token, bulk_threshold=threshold)
            for side, threshold in SIDES.items()
        }
        raw: dict[str, dict[str, list[float]]] = {
            side: {"alone": [], "behind": [], "during": [], "large": []} for side in SIDES
        }
        try:
            for client in clients.values():  # warm up: connections, imports, buffers
                await client.connect()
                await _alone(client, 50)
                await client.submit("echo", x=big, timeout=None)
            for side, client in clients.items():
                raw[side]["alone"] = await _alone(client, ALONE_CALLS)
            for _ in range(rounds):
                for side, client in clients.items():
                    behind, during, large = await _round(client, big)
                    raw[side]["behind"].append(behind)
                    raw[side]["during"].extend(during)
                    raw[side]["large"].append(large)
        finally:
            for client in clients.values():
                await client.aclose()
    result: dict[str, Any] = {"payload_mib": mib, "rounds": rounds, "sides": {}}
    for side, r in raw.items():
        alone = _ms(r["alone"], 50)
        result["sides"][side] = {
            "alone_p50_ms": alone,
            "alone_p99_ms": _ms(r["alone"], 99),
            "behind_p50_ms": _ms(r["behind"], 50),
            "behind_max_ms": _ms(r["behind"], 100),
            "during_calls": len(r["during"]),
            "during_p50_ms": _ms(r["during"], 50) if r["during"] else None,
            "during_p99_ms": _ms(r["during"], 99) if r["during"] else None,
            "large_p50_ms": _ms(r["large"], 50),
            "ratio": _ms(r["behind"], 50) / alone,
        }
    return result


def run(rounds: int = 10, mib: int = 128, json_path: str | None = None) -> dict[str, Any]:
    if rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {rounds}")
    if not 2 <= mib <= 900:
        raise ConfigError(f"--mib must be in [2, 900] (above the 1 MiB bulk threshold), got {mib}")
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(_measure(rounds, mib))
    finally:
        loop.close()
    sides = result["sides"]
    print_table(
        f"small echo behind a {mib} MiB one: ms (p50 unless said), {rounds} rounds, one worker",
        ["client", "alone", "behind", "max", "during", "p99", f"{mib} MiB", "ratio"],
        [
            [side, s["alone_p50_ms"], s["behind_p50_ms"], s["behind_max_ms"], s["during_p50_ms"],
             s["during_p99_ms"], s["large_p50_ms"], s["ratio"]]
            for side, s in sides.items()
        ],
    )  # fmt: skip
    bulk = sides["bulk connection"]
    result["ratio"] = bulk["ratio"]
    result["target_ratio"] = TARGET_RATIO
    result["meets_target"] = bulk["ratio"] <= TARGET_RATIO
    result["improvement"] = sides["one connection"]["behind_p50_ms"] / bulk["behind_p50_ms"]
    verdict = "meets" if result["meets_target"] else "misses"
    print(
        f"milliseconds; bulk connection: behind / alone = {bulk['ratio']:.1f}x ({verdict} the "
        f"<= {TARGET_RATIO:.0f}x target); one connection -> bulk connection: "
        f"{result['improvement']:.0f}x less waiting behind the large submission"
    )
    result["machine"] = machine()
    write_json(json_path, result)
    return result
