"""``compass bench replicas``: hot models replicated ahead of need, on their own (elasticity off).

Per workload (the paper's and generated ones) and seed: waves of one workflow's popularity at
a steady total rate (:func:`~compass.elastic.waves.wave_arrivals`: four waves, each a
workflow's weight ramping to ``factor`` times over three minutes, held four, ramping down
three, five steady minutes between; ``minute_s`` simulated seconds a minute), on a fixed
cluster of the size the capacity model gives for the workload's own rate (``mean`` in
``compass bench elastic``), the same planner (compass), with and without
:mod:`compass.elastic.replicate` (checked every 2 s). Attainment is the share of jobs within
``max_slowdown`` of their best time; ``loads`` the model loads the workers made.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compass.elastic.curve import workload_rate
from compass.elastic.replicate import ReplicaConfig
from compass.elastic.rule import workers_for
from compass.elastic.sim import ElasticOptions, lane_s_per_job, simulate_elastic
from compass.elastic.waves import Waves, wave_arrivals
from compass.workflow.generate import generate_workload
from compass.workflow.spec import Workload, load_workload

from .elastic import calibrate_util
from .report import machine, print_table, write_json

__all__ = ["ReplicasConfig", "run"]


@dataclass(frozen=True, slots=True)
class ReplicasConfig:
    paper: str = str(Path(__file__).parent / "workloads" / "paper.json")
    generated: tuple[int, ...] = (1, 2)
    seeds: tuple[int, ...] = (0, 1, 2)
    factor: float = 6.0
    minute_s: float = 10.0
    max_slowdown: float = 3.0
    warm_fraction: float = ReplicaConfig().warm_fraction
    headroom_fraction: float = ReplicaConfig().headroom_fraction


def _side(workload: Workload, config: ReplicasConfig, seed: int, size: int, on: bool) -> Any:
    replicate = ReplicaConfig(config.warm_fraction, config.headroom_fraction) if on else None
    waves = Waves(factor=config.factor)
    arrivals = wave_arrivals(workload, waves, minute_s=config.minute_s, seed=seed)
    opts = ElasticOptions(controller="fixed", initial=size, maximum=size,
                          max_slowdown=config.max_slowdown, replicate=replicate)  # fmt: skip
    result = simulate_elastic(workload, arrivals, opts, seed=seed)
    return {
        "attainment": result.attainment(config.max_slowdown),
        "jobs": len(result.jobs),
        "replicas": result.replicas,
        "loads": result.extra["loads"],
    }


def run(config: ReplicasConfig, json_path: str | None = None) -> dict[str, Any]:
    """Every workload and seed, both sides; print a table and write JSON (module doc)."""
    loaded = [load_workload(config.paper)] if config.paper else []
    workloads: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for workload in loaded + [generate_workload(seed) for seed in config.generated]:
        util = calibrate_util(workload, config.max_slowdown)
        size = workers_for(workload_rate(workload), lane_s_per_job(workload), 1, util)
        seeds: list[dict[str, Any]] = []
        for seed in config.seeds:
            off, on = (_side(workload, config, seed, size, side) for side in (False, True))
            seeds.append({"seed": seed, "off": off, "on": on})
            rows.append([workload.name, seed, size, off["attainment"], on["attainment"],
                         on["attainment"] - off["attainment"], on["replicas"],
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
         "replicas", "loads on/off"],
        rows,
    )  # fmt: skip
    out = {"config": {**asdict(config), "machine": machine()}, "workloads": workloads}
    write_json(json_path, out)
    return out
