"""``compass sim --compare-real``: the same small configuration simulated and run for real."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from compass.sim.capacity import BUILTIN_SLOS, attainment
from compass.sim.engine import simulate
from compass.sim.settings import SimSettings
from compass.wire.transport import new_event_loop

from . import e2e
from .report import machine, print_table, write_json

__all__ = ["run"]


def run(config: e2e.E2EConfig, json_path: str | None = None) -> dict[str, Any]:
    """Run ``config`` on a real cluster and in the simulator, policy by policy; print the
    relative differences of p50 and p99 and write them (with both summaries, and each side's
    share of jobs within the slowdowns of median2, p95x3 and p99x5, ``within``) as JSON."""
    spec = e2e.workload_for(config)
    arrivals = e2e.arrivals_for(config, spec)
    # the real workers gossip every change within heartbeat_min_ms of real time, which is
    # heartbeat_min_ms / time_scale of workload time: the staleness the simulator must model
    heartbeat_s = config.heartbeat_min_ms / 1000.0 / config.time_scale
    rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    runner = asyncio.Runner(loop_factory=new_event_loop)
    try:
        for policy in config.policies:
            real = runner.run(e2e.run_policy(config, spec, policy, arrivals))
            run = simulate(
                spec,
                SimSettings(
                    workers=config.workers,
                    policy=policy,
                    heartbeat_s=heartbeat_s,
                    host_lanes=config.host_lanes,
                    warm_start=True,
                    preempt=config.preempt,
                ),
                arrivals,
            )
            simulated = run.summary()
            diff = {
                key: _rel(simulated[key], real[key])
                for key in ("p50_ms", "p99_ms", "median_slowdown")
            }
            within = {
                "real": _within(real["slowdowns"]),
                "sim": _within([job.slowdown for job in run.jobs]),
            }
            results[policy] = {
                "real": real,
                "sim": simulated,
                "relative_difference": diff,
                "within": within,
            }
            rows.append(
                [
                    policy,
                    real["p50_ms"],
                    simulated["p50_ms"],
                    diff["p50_ms"],
                    real["p99_ms"],
                    simulated["p99_ms"],
                    diff["p99_ms"],
                    within["real"]["p95x3"],
                    within["sim"]["p95x3"],
                ]
            )
    finally:
        runner.close()
    print_table(
        f"simulator fidelity: {config.workers} workers, {config.jobs} jobs, {config.arrival}, "
        f"load {config.load}",
        [
            "policy",
            "real p50 ms",
            "sim p50 ms",
            "p50 diff",
            "real p99 ms",
            "sim p99 ms",
            "p99 diff",
            "real within 3x",
            "sim within 3x",
        ],
        rows,
    )
    out = {"config": {**asdict(config), "machine": machine()}, "results": results}
    write_json(json_path, out)
    return out


def _within(slowdowns: Sequence[float | None]) -> dict[str, float]:
    """The share of jobs within each of the capacity search's SLOs' slowdowns (``"p95x3"``:
    within 3x their best time, whatever the quantile), an unfinished job outside."""
    return {slo.name: attainment(slowdowns, slo) for slo in BUILTIN_SLOS}


def _rel(simulated: float | None, real: float | None) -> float | None:
    """(sim - real) / real."""
    if simulated is None or not real:
        return None
    return (simulated - real) / real
