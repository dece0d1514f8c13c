"""``compass bench job``: a one-task no-op job, client to worker and back."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from compass.cluster import LocalCluster
from compass.wire.transport import new_event_loop

from .report import machine, print_table, write_json

__all__ = ["run"]


async def _measure(jobs: int) -> dict[str, Any]:
    async with (
        LocalCluster(1, args=["--app", "compass._bench.apps"]) as cluster,
        cluster.client() as client,
    ):
        for i in range(min(200, jobs)):  # warm up: imports, caches, branch predictors
            await client.submit("noop", x=i)
            await client.ping()
        job_us = np.empty(jobs)
        ping_us = np.empty(jobs)
        for i in range(jobs):
            t0 = time.perf_counter()
            await client.submit("noop", x=i)
            job_us[i] = (time.perf_counter() - t0) * 1e6
            t0 = time.perf_counter()
            await client.ping()
            ping_us[i] = (time.perf_counter() - t0) * 1e6
    return {
        "jobs": jobs,
        "p50_us": float(np.percentile(job_us, 50)),
        "p99_us": float(np.percentile(job_us, 99)),
        "mean_us": float(job_us.mean()),
        "ping_p50_us": float(np.percentile(ping_us, 50)),
        "ping_p99_us": float(np.percentile(ping_us, 99)),
    }


def run(jobs: int = 2000, json_path: str | None = None) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(_measure(jobs))
    finally:
        loop.close()
    result["job_over_ping"] = result["p50_us"] / result["ping_p50_us"]
    print_table(
        f"one-task no-op job, {jobs} sequential jobs, one worker process",
        ["what", "p50 us", "p99 us"],
        [
            ["job (submit -> result)", result["p50_us"], result["p99_us"]],
            ["ping (floor)", result["ping_p50_us"], result["ping_p99_us"]],
            ["job / ping", result["job_over_ping"], None],
        ],
    )
    result["machine"] = machine()
    write_json(json_path, result)
    return result
