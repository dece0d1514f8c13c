"""``compass bench chain``: a long chain of tiny tasks alternating between two worker processes,
on compass and on a Dask ``LocalCluster`` in the same run.

Per-task time on such a chain is pure control-plane cost: the planner, the push of each output
to the next worker, the queue, the lane. Dask's scheduler sits in the middle of every hop.
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

from compass.cluster import LocalCluster
from compass.errors import ConfigError
from compass.wire.transport import new_event_loop

from .apps import CHAIN_LENGTHS
from .report import machine, print_table, write_json

__all__ = ["run"]


async def _compass_chain(tasks: int, workers: int, repeats: int) -> list[float]:
    args = ["--app", "compass._bench.apps", "--policy", "round_robin"]
    async with LocalCluster(workers, args=args) as cluster, cluster.client() as client:
        await client.submit(f"chain_{tasks}", x=0, timeout=120)  # warm up
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = await client.submit(f"chain_{tasks}", x=0, timeout=120)
            seconds.append(time.perf_counter() - t0)
            if result != tasks:
                raise AssertionError(f"chain returned {result}, expected {tasks}")
        records = await client.records()
    hops = sum(
        1
        for record in records[-1:]
        for i in range(1, tasks)
        if record.plan[f"t{i}"] != record.plan[f"t{i - 1}"]
    )
    if hops != tasks - 1:
        raise AssertionError(f"the chain crossed workers {hops} times, expected {tasks - 1}")
    return seconds


def _inc(x: int) -> int:
    return x + 1


def _dask_chain(tasks: int, workers: int, repeats: int) -> list[float]:
    import dask
    from distributed import Client
    from distributed import LocalCluster as DaskCluster

    with (
        dask.config.set({"distributed.worker.daemon": False, "logging.distributed": "error"}),
        DaskCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        ) as cluster,
        Client(cluster) as client,
    ):
        addresses = sorted(client.scheduler_info()["workers"])

        def chain() -> int:
            future = client.submit(_inc, 0, workers=[addresses[0]], pure=False)
            for i in range(1, tasks):
                future = client.submit(
                    _inc, future, workers=[addresses[i % len(addresses)]], pure=False
                )
            return int(future.result())

        chain()  # warm up
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            result = chain()
            seconds.append(time.perf_counter() - t0)
            if result != tasks:
                raise AssertionError(f"dask chain returned {result}, expected {tasks}")
    return seconds


def run(
    tasks: int = 1000,
    workers: int = 2,
    repeats: int = 3,
    json_path: str | None = None,
    with_dask: bool = True,
) -> dict[str, Any]:
    if tasks not in CHAIN_LENGTHS:
        raise ConfigError(f"--tasks must be one of {CHAIN_LENGTHS} (chains declared in bench.apps)")
    if with_dask and importlib.util.find_spec("distributed") is None:
        raise ConfigError(
            "the Dask comparison needs distributed: pip install 'compass[bench]' (or --no-dask)"
        )
    loop = new_event_loop()
    try:
        compass_s = loop.run_until_complete(_compass_chain(tasks, workers, repeats))
    finally:
        loop.close()
    result: dict[str, Any] = {
        "tasks": tasks,
        "workers": workers,
        "repeats": repeats,
        "compass_us_per_task": min(compass_s) / tasks * 1e6,
        "compass_runs_s": compass_s,
    }
    rows: list[list[Any]] = [["compass", result["compass_us_per_task"], min(compass_s)]]
    if with_dask:
        dask_s = _dask_chain(tasks, workers, repeats)
        result["dask_us_per_task"] = min(dask_s) / tasks * 1e6
        result["dask_runs_s"] = dask_s
        result["dask_over_compass"] = result["dask_us_per_task"] / result["compass_us_per_task"]
        rows.append(["dask distributed", result["dask_us_per_task"], min(dask_s)])
        rows.append(["dask / compass", result["dask_over_compass"], None])
    print_table(
        f"{tasks}-task chain alternating between {workers} worker processes (best of {repeats})",
        ["system", "us per task", "chain s"],
        rows,
    )
    result["machine"] = machine()
    write_json(json_path, result)
    return result
