"""``compass bench stream``: what streaming a job's partial outputs gives and costs, on a real
local cluster (one worker process, the bench app's ``generation`` workflow: a step-wise task
of ``steps`` steps of ``step_ms`` each, each yielding ``chunk`` bytes).

- **Time to first output**, streamed (``Client.stream``: the first partial output) against the
  same job unstreamed (``Client.submit``: its answer), at load 1 (one job at a time) and load 2
  (two at once on the worker's one lane), p50 and p99; ``ttfo_over_first_step``: the streamed
  p50 at load 1 over the first step's own time plus one hop (half a ping's round trip).
- **Throughput**: jobs per second with 8 in flight, streamed and not
  (``streamed_over_plain_throughput``).
- **A slow reader**: a long job streamed and not read for ``hold_s`` seconds; the worker's
  RSS before and after (``slow_reader_rss_growth_mb``). What it may hold for such a reader is
  bounded by the windows: its generating step waits once it is ``--stream-window`` partial
  outputs ahead of the reader (compass/worker/windows.py), and the wire holds the stream's own
  window; past ``--stream-stall-s`` (longer than the hold) the job would fail.

- **A three-stage pipeline** (generate -> translate -> synthesize, each ``steps`` steps of
  ``step_ms``) on three workers of one lane each: with streamed edges (each stage reads the one
  before as it comes: ``speak_streamed``) against the same code with plain edges
  (``speak_plain``), both read with ``Client.stream``, at load 1 and 2, p50 and p99 of the time
  to first output (the last stage's first item) and to the answer, in the same run; the
  ratios streamed over plain (``pipeline_ttfo_ratio``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from compass.client import Client
from compass.cluster import LocalCluster
from compass.config import WorkerConfig
from compass.wire.transport import new_event_loop

from .apps import PIPELINE_STEP_MS, PIPELINE_STEPS
from .report import machine, print_table, write_json

__all__ = ["run"]

APP = ["--app", "compass._bench.apps", "--lanes", "1", "--host-lanes", "0"]
#: the slow reader's window on the wire
WIRE_WINDOW = 16
#: workers of the pipeline's cluster: one per stage
PIPELINE_WORKERS = 3
#: in flight for the throughput sides
IN_FLIGHT = 8


def _ms(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values) * 1e3, q)), 3)


async def _first_output_s(
    client: Client, inputs: dict[str, Any], workflow: str = "generation"
) -> float:
    return (await _stream_times(client, inputs, workflow))[0]


async def _stream_times(
    client: Client, inputs: dict[str, Any], workflow: str
) -> tuple[float, float]:
    """Seconds to a streamed job's first partial output, and to its answer."""
    t0 = time.perf_counter()
    first = None
    async for _out in client.stream(workflow, inputs):
        if first is None:
            first = time.perf_counter() - t0
    assert first is not None
    return first, time.perf_counter() - t0


async def _answer_s(client: Client, inputs: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    await client.submit("generation", inputs)
    return time.perf_counter() - t0


async def _at_load(client: Client, load: int, jobs: int, inputs: dict[str, Any]) -> dict[str, Any]:
    """``jobs`` jobs each side, ``load`` at once: their times to first output (streamed) and
    to the answer (not)."""
    sides: dict[str, list[float]] = {"streamed": [], "plain": []}
    for _ in range(jobs // load):
        got = await asyncio.gather(*(_first_output_s(client, inputs) for _ in range(load)))
        sides["streamed"].extend(got)
        got = await asyncio.gather(*(_answer_s(client, inputs) for _ in range(load)))
        sides["plain"].extend(got)
    return {
        side: {"p50_ms": _ms(values, 50), "p99_ms": _ms(values, 99)}
        for side, values in sides.items()
    }


async def _throughput(client: Client, jobs: int, inputs: dict[str, Any]) -> dict[str, float]:
    async def streamed() -> None:
        async for _ in client.stream("generation", inputs):
            pass

    async def plain() -> None:
        await client.submit("generation", inputs)

    rates = {}
    for side, one in (("streamed", streamed), ("plain", plain)):
        limit = asyncio.Semaphore(IN_FLIGHT)

        async def bounded(one: Any = one, limit: asyncio.Semaphore = limit) -> None:
            async with limit:
                await one()

        t0 = time.perf_counter()
        await asyncio.gather(*(bounded() for _ in range(jobs)))
        rates[side] = round(jobs / (time.perf_counter() - t0), 2)
    return rates


async def _slow_reader(client: Client, hold_s: float, chunk: int) -> dict[str, Any]:
    """A long job streamed and not read for ``hold_s``: the worker's RSS before and after."""
    before = float((await client.status()).process["rss_mb"])
    inputs = {"steps": 100_000, "step_ms": 0.5, "chunk": chunk}
    items = client.stream("generation", inputs, window=WIRE_WINDOW)
    first = await items.__anext__()  # the job runs; then nobody reads
    assert not first.final
    await asyncio.sleep(hold_s)
    held = float((await client.status()).process["rss_mb"])
    await items.aclose()  # type: ignore[attr-defined]  # the reader leaves: the job ends
    after = float((await client.status()).process["rss_mb"])
    # the windows: the sink's, the wire's, the output the ingress's reader holds, the step's
    bound = (WorkerConfig().stream_window + WIRE_WINDOW + 2) * chunk
    return {
        "rss_before_mb": before,
        "rss_held_mb": held,
        "rss_after_mb": after,
        "slow_reader_rss_growth_mb": round(held - before, 2),
        "bound_mb": round(bound / 1e6, 2),
    }


async def _measure(jobs: int, step_ms: float, steps: int, hold_s: float) -> dict[str, Any]:
    inputs = {"steps": steps, "step_ms": step_ms, "chunk": 64}
    async with LocalCluster(1, args=APP) as cluster, cluster.client() as client:
        for _ in range(10):  # warm up: imports, threads, the stream's path
            await _first_output_s(client, inputs)
            await client.ping()
        pings = [await client.ping() for _ in range(200)]
        hop_s = float(np.median(pings)) / 2
        loads = {load: await _at_load(client, load, jobs, inputs) for load in (1, 2)}
        rates = await _throughput(client, jobs, inputs)
        slow = await _slow_reader(client, hold_s, chunk=64 * 1024)
    first_step_ms = step_ms
    return {
        "machine": machine(),
        "jobs": jobs,
        "steps": steps,
        "step_ms": step_ms,
        "hop_ms": round(hop_s * 1e3, 3),
        "load": {str(k): v for k, v in loads.items()},
        "ttfo_over_first_step": round(
            loads[1]["streamed"]["p50_ms"] / (first_step_ms + hop_s * 1e3), 3
        ),
        "throughput_jobs_per_s": rates,
        "streamed_over_plain_throughput": round(rates["streamed"] / rates["plain"], 3),
        "slow_reader": slow,
        "slow_reader_rss_growth_mb": slow["slow_reader_rss_growth_mb"],
    }


async def _pipeline(jobs: int, step_ms: float, steps: int) -> dict[str, Any]:
    """The three-stage pipeline, streamed edges against plain, at load 1 and 2."""
    inputs = {"steps": steps, "step_ms": step_ms, "chunk": 64}
    flows = {"streamed": "speak_streamed", "plain": "speak_plain"}
    async with (
        LocalCluster(PIPELINE_WORKERS, args=APP) as cluster,
        cluster.client() as client,
    ):
        for _ in range(3):  # warm up: imports, threads, every worker's path
            for workflow in flows.values():
                await _stream_times(client, inputs, workflow)
        out: dict[str, Any] = {}
        for load in (1, 2):
            times: dict[str, list[tuple[float, float]]] = {side: [] for side in flows}
            for _ in range(jobs // load):
                for side, workflow in flows.items():
                    got = await asyncio.gather(
                        *(_stream_times(client, inputs, workflow) for _ in range(load))
                    )
                    times[side].extend(got)
            sides = {
                side: {
                    "ttfo_p50_ms": _ms([t[0] for t in got], 50),
                    "ttfo_p99_ms": _ms([t[0] for t in got], 99),
                    "answer_p50_ms": _ms([t[1] for t in got], 50),
                    "answer_p99_ms": _ms([t[1] for t in got], 99),
                }
                for side, got in times.items()
            }
            streamed, plain = sides["streamed"], sides["plain"]
            sides["ratio"] = {
                key: round(streamed[key] / plain[key], 3) for key in streamed if plain[key]
            }
            out[str(load)] = sides
    return out


def run(
    jobs: int = 100,
    step_ms: float = 10.0,
    steps: int = 20,
    hold_s: float = 10.0,
    json_path: str | None = None,
) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(_measure(jobs, step_ms, steps, hold_s))
        pipeline_jobs = max(2, jobs // 5)
        result["pipeline"] = {
            "jobs": pipeline_jobs,
            "workers": PIPELINE_WORKERS,
            "steps": PIPELINE_STEPS,
            "step_ms": PIPELINE_STEP_MS,
            "load": loop.run_until_complete(
                _pipeline(pipeline_jobs, PIPELINE_STEP_MS, PIPELINE_STEPS)
            ),
        }
        result["pipeline_ttfo_ratio"] = result["pipeline"]["load"]["1"]["ratio"]["ttfo_p50_ms"]
    finally:
        loop.close()
    rows = []
    for load, sides in result["load"].items():
        for side, figures in sides.items():
            what = "first output (stream)" if side == "streamed" else "answer (submit)"
            rows.append([load, what, figures["p50_ms"], figures["p99_ms"]])
    print_table(
        f"a generating task of {steps} steps of {step_ms:g} ms, one worker, one lane; "
        f"{jobs} jobs a side at each load; one hop {result['hop_ms']} ms",
        ["load", "time to", "p50 ms", "p99 ms"],
        rows,
    )
    rows = []
    for load, sides in result["pipeline"]["load"].items():
        for side in ("streamed", "plain", "ratio"):
            figures = sides[side]
            rows.append([load, side if side != "ratio" else "streamed / plain",
                         figures["ttfo_p50_ms"], figures["ttfo_p99_ms"],
                         figures["answer_p50_ms"], figures["answer_p99_ms"]])  # fmt: skip
    print_table(
        f"generate -> translate -> synthesize, {PIPELINE_STEPS} steps of "
        f"{PIPELINE_STEP_MS:g} ms each, {PIPELINE_WORKERS} workers of one lane; "
        f"{result['pipeline']['jobs']} jobs a side at each load",
        ["load", "edges", "first p50 ms", "first p99 ms", "answer p50 ms", "answer p99 ms"],
        rows,
    )
    slow = result["slow_reader"]
    print_table(
        "streaming's cost and its bound",
        ["what", "value"],
        [
            ["ttfo_over_first_step (p50, load 1)", result["ttfo_over_first_step"]],
            ["jobs/s streamed", result["throughput_jobs_per_s"]["streamed"]],
            ["jobs/s plain", result["throughput_jobs_per_s"]["plain"]],
            ["streamed_over_plain_throughput", result["streamed_over_plain_throughput"]],
            [f"slow reader: RSS growth over {hold_s:g} s (MB)", slow["slow_reader_rss_growth_mb"]],
            ["  bound: the windows' partial outputs (MB)", slow["bound_mb"]],
        ],
    )
    if json_path:
        write_json(json_path, result)
    return result
