"""``compass bench job``: a one-task no-op job, client to worker and back.

With ``--trace``: what tracing costs, both sides in one run. One worker process per side, the
jobs dealt to the sides in turn (so the machine's drift meets every side alike):

- ``plain``: a worker tracing nothing (``--trace-sample 0``);
- ``control``: another such worker, the noise floor: how far two identical sides differ;
- ``sampled``: a worker at the default sampling rate (1% of jobs);
- ``traced``: a worker tracing every job (``--trace-sample 1``: spans kept, the trace
  assembled and kept at the ingress);
- ``returned``: every job traced and its trace answered with it
  (``Client.submit_job(options=JobOptions(trace=True))``, to a worker sampling nothing).

Every side has a worker process of its own and gets one job in turn: a process that served
more of the jobs would stay warmer in the CPU's caches and scheduler, and look faster.

Each side's p50 over the plain side's is ``<side>_over_plain`` in the JSON
(``traced_over_plain``: the cost of tracing every job; ``control_over_plain``: the noise).

``view``: the workers' view (``compass worker start --view``; ``mesh``, the only view before
issue 24, plans without sampling candidates or aging the peers' waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from compass.client import Client, JobOptions
from compass.cluster import LocalCluster
from compass.config import VIEWS
from compass.errors import ConfigError
from compass.wire.transport import new_event_loop

from .report import machine, print_table, write_json

__all__ = ["run"]

APP = ["--app", "compass._bench.apps"]

#: the sides of a --trace run: worker flags, and whether the client asks for the trace
TRACE_SIDES: dict[str, tuple[list[str], bool]] = {
    "plain": (["--trace-sample", "0"], False),
    "control": (["--trace-sample", "0"], False),
    "sampled": ([], False),
    "traced": (["--trace-sample", "1"], False),
    "returned": (["--trace-sample", "0"], True),
}


async def _measure(jobs: int, args: list[str] | None = None) -> dict[str, Any]:
    async with (
        LocalCluster(1, args=args or APP) as cluster,
        cluster.client() as client,
    ):
        for i in range(min(200, jobs)):  # warm up: imports, caches, branch predictors
            await client.submit("noop", x=i)
            await client.submit("noop_on_loop", x=i)
            await client.ping()
        job_us = np.empty(jobs)
        on_loop_us = np.empty(jobs)
        ping_us = np.empty(jobs)
        for i in range(jobs):  # in turn, so the machine's drift meets each alike
            t0 = time.perf_counter()
            await client.submit("noop", x=i)
            job_us[i] = (time.perf_counter() - t0) * 1e6
            t0 = time.perf_counter()
            await client.submit("noop_on_loop", x=i)
            on_loop_us[i] = (time.perf_counter() - t0) * 1e6
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
        # the same no-op declared on_loop: no hand-off to a task thread and back
        "on_loop_p50_us": float(np.percentile(on_loop_us, 50)),
        "on_loop_p99_us": float(np.percentile(on_loop_us, 99)),
    }


def _submitter(client: Client, returned: bool) -> Callable[[int], Awaitable[Any]]:
    if not returned:
        return lambda i: client.submit("noop", x=i)

    async def traced(i: int) -> Any:
        result = await client.submit_job("noop", x=i, options=JobOptions(trace=True))
        assert result.trace is not None and len(result.trace.tasks) == 1
        return result.value

    return traced


async def _measure_tracing(jobs: int, args: list[str]) -> dict[str, Any]:
    """Every side of :data:`TRACE_SIDES`, the jobs dealt in turn."""
    async with contextlib.AsyncExitStack() as stack:
        clusters = {side: LocalCluster(1, args=[*args, *flags]) for side, (flags, _) in
                    TRACE_SIDES.items()}  # fmt: skip
        for cluster in clusters.values():
            stack.push_async_callback(cluster.aclose)
        await asyncio.gather(*(cluster.start() for cluster in clusters.values()))
        submit: dict[str, Callable[[int], Awaitable[Any]]] = {}
        for side, (_, returned) in TRACE_SIDES.items():
            client = await stack.enter_async_context(clusters[side].client())
            submit[side] = _submitter(client, returned)
        sides = list(TRACE_SIDES)
        for i in range(min(200, jobs)):  # warm up
            for side in sides:
                await submit[side](i)
        times = {side: np.empty(jobs) for side in sides}
        for i in range(jobs):
            for k in range(len(sides)):
                side = sides[(i + k) % len(sides)]  # each side first in turn
                t0 = time.perf_counter()
                await submit[side](i)
                times[side][i] = (time.perf_counter() - t0) * 1e6
        async with clusters["traced"].client() as client:
            status = await client.status()
    out: dict[str, Any] = {"jobs": jobs, "traced_kept": status.traces["kept"]}
    for side in sides:
        out[side] = {
            "p50_us": float(np.percentile(times[side], 50)),
            "p99_us": float(np.percentile(times[side], 99)),
            "mean_us": float(times[side].mean()),
        }
    plain = out["plain"]["p50_us"]
    for side in sides[1:]:
        out[f"{side}_over_plain"] = out[side]["p50_us"] / plain
    return out


def run(
    jobs: int = 2000, json_path: str | None = None, trace: bool = False, view: str = "bounded"
) -> dict[str, Any]:
    if view not in VIEWS:
        raise ConfigError(f"--view must be one of {', '.join(VIEWS)}, got {view!r}")
    args = [*APP, "--view", view]
    loop = new_event_loop()
    try:
        measure = _measure_tracing if trace else _measure
        result = loop.run_until_complete(measure(jobs, args))
    finally:
        loop.close()
    result["view"] = view
    if trace:
        ratios = {side: result.get(f"{side}_over_plain", 1.0) for side in TRACE_SIDES}
        print_table(
            f"one-task no-op job, {jobs} sequential jobs per side, dealt in turn; one worker "
            f"process per side, {view} view",
            ["side", "p50 us", "p99 us", "p50 / plain"],
            [
                [side, result[side]["p50_us"], result[side]["p99_us"], ratios[side]]
                for side in TRACE_SIDES
            ],
        )
    else:
        result["job_over_ping"] = result["p50_us"] / result["ping_p50_us"]
        result["on_loop_over_ping"] = result["on_loop_p50_us"] / result["ping_p50_us"]
        print_table(
            f"one-task no-op job, {jobs} sequential jobs, one worker process, {view} view",
            ["what", "p50 us", "p99 us"],
            [
                ["job (submit -> result)", result["p50_us"], result["p99_us"]],
                ["ping (floor)", result["ping_p50_us"], result["ping_p99_us"]],
                ["job / ping", result["job_over_ping"], None],
                ["job, task on_loop", result["on_loop_p50_us"], result["on_loop_p99_us"]],
                ["job on_loop / ping", result["on_loop_over_ping"], None],
            ],
        )
    result["machine"] = machine()
    write_json(json_path, result)
    return result
