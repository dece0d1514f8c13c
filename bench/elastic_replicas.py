"""``compass bench replicas``: hot models replicated ahead of need, on their own (elasticity off).

Per workload (the paper's and generated ones) and seed: waves of one workflow's popularity at
a steady total rate (:func:`~compass.elastic.waves.wave_arrivals`: four waves, each a
workflow's weight ramping to ``factor`` times over three minutes, held four, ramping down
three, five steady minutes between; ``minute_s`` simulated seconds a minute), on a fixed
cluster of the size the capacity model gives for the workload's own rate (``mean`` in
``compass bench elastic``), the same planner (compass), with and without
:mod:`compass.elastic.replicate` (checked every 2 s). Attainment is the share of jobs within
``max_slowdown`` of their best time; ``p95_slowdown`` the 95th percentile of the jobs'
slowdowns (a failed job's is infinite); ``loads`` the model loads the workers made.

``small``: generated workloads of many small models beside them (:data:`SMALL_MODELS`: 16-24
models of 0.1-1 GB), named ``small-<seed>``. :func:`sweep` runs the rule at every
``cold_s`` and ``cooldown_s`` given, one varied at a time around the defaults, against the
same off side.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from compass.elastic.curve import workload_rate
from compass.elastic.replicate import ReplicaConfig
from compass.elastic.rule import workers_for
from compass.elastic.sim import ElasticOptions, lane_s_per_job, simulate_elastic
from compass.elastic.waves import Waves, wave_arrivals
from compass.workflow.generate import generate_workload
from compass.workflow.spec import Workload, load_workload

from .elastic import calibrate_util
from .report import machine, print_table, write_json

__all__ = ["SMALL_MODELS", "ReplicasConfig", "run", "sweep"]

#: the generator's ranges for a workload of many small models (``ReplicasConfig.small``)
SMALL_MODELS: dict[str, Any] = {"models": (16, 24), "model_gb": (0.1, 1.0), "workflows": (6, 8)}


@dataclass(frozen=True, slots=True)
class ReplicasConfig:
    paper: str = str(Path(__file__).parent / "workloads" / "paper.json")
    generated: tuple[int, ...] = (1, 2)
    small: tuple[int, ...] = ()
    seeds: tuple[int, ...] = (0, 1, 2)
    factor: float = 6.0
    minute_s: float = 10.0
    max_slowdown: float = 3.0
    warm_fraction: float = ReplicaConfig().warm_fraction
    headroom_fraction: float = ReplicaConfig().headroom_fraction
    cooldown_s: float = ReplicaConfig().cooldown_s
    cold_s: float = ReplicaConfig().cold_s


def _workloads(config: ReplicasConfig) -> list[Workload]:
    loaded = [load_workload(config.paper)] if config.paper else []
    small = [
        replace(generate_workload(seed, **SMALL_MODELS), name=f"small-{seed}")
        for seed in config.small
    ]
    return loaded + [generate_workload(seed) for seed in config.generated] + small


def _size(workload: Workload, config: ReplicasConfig) -> int:
    util = calibrate_util(workload, config.max_slowdown)
    return workers_for(workload_rate(workload), lane_s_per_job(workload), 1, util)


def _side(workload: Workload, config: ReplicasConfig, seed: int, size: int, on: bool) -> Any:
    rule = ReplicaConfig(config.warm_fraction, config.headroom_fraction, config.cooldown_s,
                         config.cold_s)  # fmt: skip
    replicate = rule if on else None
    waves = Waves(factor=config.factor)
    arrivals = wave_arrivals(workload, waves, minute_s=config.minute_s, seed=seed)
    opts = ElasticOptions(controller="fixed", initial=size, maximum=size,
                          max_slowdown=config.max_slowdown, replicate=replicate)  # fmt: skip
    result = simulate_elastic(workload, arrivals, opts, seed=seed)
    slowdowns = [math.inf if j.slowdown is None else j.slowdown for j in result.jobs]
    return {
        "attainment": result.attainment(config.max_slowdown),
        "p95_slowdown": float(np.percentile(slowdowns, 95)) if slowdowns else 0.0,
        "jobs": len(result.jobs),
        "replicas": result.replicas,
        "loads": result.extra["loads"],
    }


def run(config: ReplicasConfig, json_path: str | None = None) -> dict[str, Any]:
    """Every workload and seed, both sides; print a table and write JSON (module doc)."""
    workloads: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for workload in _workloads(config):
        size = _size(workload, config)
        seeds: list[dict[str, Any]] = []
        for seed in config.seeds:
            off, on = (_side(workload, config, seed, size, side) for side in (False, True))
            seeds.append({"seed": seed, "off": off, "on": on})
            rows.append([workload.name, seed, size, off["attainment"], on["attainment"],
                         on["attainment"] - off["attainment"],
                         on["p95_slowdown"] / off["p95_slowdown"], on["replicas"],
                         on["loads"] / max(1, off["loads"])])  # fmt: skip
        mean_off = statistics.fmean(s["off"]["attainment"] for s in seeds)
        mean_on = statistics.fmean(s["on"]["attainment"] for s in seeds)
        workloads[workload.name] = {
            "workers": size,
            "seeds": seeds,
            "attainment_off": mean_off,
            "attainment_on": mean_on,
            "attainment_on_minus_off": mean_on - mean_off,
            "seeds_better": sum(s["on"]["attainment"] > s["off"]["attainment"] for s in seeds),
            "seeds_worse": sum(s["on"]["attainment"] < s["off"]["attainment"] for s in seeds),
        }
    print_table(
        f"hot-model replication, elasticity off: waves of x{config.factor:g} one workflow's "
        f"weight, {config.minute_s:g} s minutes; attainment = share within "
        f"{config.max_slowdown:g}x best",
        ["workload", "seed", "workers", "attainment off", "attainment on", "on - off",
         "p95 slowdown on/off", "replicas", "loads on/off"],
        rows,
    )  # fmt: skip
    out = {"config": {**asdict(config), "machine": machine()}, "workloads": workloads}
    write_json(json_path, out)
    return out


def sweep(
    config: ReplicasConfig,
    cold_s: tuple[float, ...],
    cooldown_s: tuple[float, ...],
    json_path: str | None = None,
) -> dict[str, Any]:
    """The rule at each ``cold_s`` (``config.cooldown_s`` kept) and each ``cooldown_s``
    (``config.cold_s`` kept) against one off side per workload and seed: per workload and
    setting, on over off of the p95 slowdown (geometric mean over the seeds, and the worst
    seed) and on - off of attainment (mean and worst); a table and JSON."""
    settings = sorted(
        {(c, config.cooldown_s) for c in cold_s} | {(config.cold_s, d) for d in cooldown_s}
    )
    out: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for workload in _workloads(config):
        size = _size(workload, config)
        offs = {seed: _side(workload, config, seed, size, False) for seed in config.seeds}
        per: dict[str, Any] = {}
        for cold, cooldown in settings:
            tried = replace(config, cold_s=cold, cooldown_s=cooldown)
            ons = {seed: _side(workload, tried, seed, size, True) for seed in config.seeds}
            p95 = [ons[s]["p95_slowdown"] / offs[s]["p95_slowdown"] for s in config.seeds]
            gain = [ons[s]["attainment"] - offs[s]["attainment"] for s in config.seeds]
            loads = [ons[s]["loads"] / max(1, offs[s]["loads"]) for s in config.seeds]
            summary = {
                "p95_on_over_off": statistics.geometric_mean(p95),
                "p95_on_over_off_worst": max(p95),
                "attainment_on_minus_off": statistics.fmean(gain),
                "attainment_on_minus_off_worst": min(gain),
                "loads_on_over_off": statistics.fmean(loads),
                "replicas": sum(ons[s]["replicas"] for s in config.seeds),
            }
            per[f"cold_s={cold:g},cooldown_s={cooldown:g}"] = {
                "cold_s": cold, "cooldown_s": cooldown, **summary,
                "seeds": [{"seed": s, "off": offs[s], "on": ons[s]} for s in config.seeds],
            }  # fmt: skip
            rows.append([workload.name, size, cold, cooldown, *summary.values()])
        out[workload.name] = {"workers": size, "settings": per}
    print_table(
        f"hot-model replication, cold_s and cooldown_s swept (seeds "
        f"{', '.join(map(str, config.seeds))}; p95 slowdown on/off: geo-mean and worst seed; "
        f"attainment on - off: mean and worst seed)",
        ["workload", "workers", "cold_s", "cooldown_s", "p95 on/off", "p95 worst",
         "attain on-off", "attain worst", "loads on/off", "copies"],
        rows,
    )  # fmt: skip
    result = {"config": {**asdict(config), "machine": machine()}, "workloads": out}
    write_json(json_path, result)
    return result
