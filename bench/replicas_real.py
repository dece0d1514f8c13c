"""``compass bench replicas --real``: hot models replicated ahead of need on real worker
processes, with against without ``--replicate``, on the same arrivals.

A small emulated workload of ``models`` one-task workflows, ``hot`` on model ``m``, ``cool``
on model ``n`` (and ``cool2`` on ``n2``, ... beyond two), a load taking many times a task;
by default two models, each filling most of a worker's cache (a worker holds one of them);
:meth:`ReplicasRealConfig.many_small` is eight small ones on four workers, three to a
cache. ``workers`` worker processes on this host (one lane each, no idle warming, so that
where the models are is the same on both sides: a first job of the i-th workflow through
worker ``i % workers`` loads its model there; with two models on three workers, the third
starts empty). Traffic: every workflow at ``base_rate`` jobs/s (Poisson, seeded), then a
burst of ``hot`` at ``burst_rate`` for ``burst_s``, then quiet again; each job submitted at
its time to the workers in turn, in real time. The same arrivals run on a
cluster without ``--replicate`` and on one with it (fresh processes each).

Per side: attainment (share of jobs within ``max_slowdown`` of their best time) and the p95
slowdown, over every job and over the burst's ``hot`` jobs; the copies the rule warmed
(``compass status``'s ``replicas``). ``ratios``: on over off.

:func:`run_sweep` runs it for every seed and setup (``--seeds``; ``--cache-mb``, and
``--many-small``): per setup, the on/off ratios of every seed and their geometric mean.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from compass.client import Client
from compass.cluster import LocalCluster
from compass.workflow.best import best_time_s
from compass.workflow.profile import Profiles
from compass.workflow.spec import load_workload

from .report import machine, print_table, write_json

__all__ = ["ReplicasRealConfig", "run_real", "run_sweep"]


@dataclass(frozen=True, slots=True)
class ReplicasRealConfig:
    workers: int = 3
    exec_ms: int = 300
    model_mb: int = 800
    #: a worker's cache: 1000 MB holds one of the two models, 2000 MB both
    gpu_memory_mb: int = 1000
    #: GB/s host to device: an 800 MB model loads in 4 s
    h2d_gbps: float = 0.2
    #: jobs/s of each workflow outside the burst
    base_rate: float = 1.0
    #: jobs/s of ``hot`` in the burst
    burst_rate: float = 5.0
    before_s: float = 10.0
    burst_s: float = 20.0
    after_s: float = 10.0
    seed: int = 0
    max_slowdown: float = 3.0
    #: one-task workflows, each on a model of its own (:func:`workflow_models`)
    models: int = 2

    @classmethod
    def many_small(cls) -> ReplicasRealConfig:
        """Eight 200 MB models (a load of 1 s, five tasks) on four workers whose caches hold
        three: every worker starts with two, and a copy evicts a model some workflow uses."""
        return cls(workers=4, models=8, exec_ms=200, model_mb=200, gpu_memory_mb=700,
                   base_rate=0.5, burst_rate=6.0)  # fmt: skip


def workflow_models(models: int) -> list[tuple[str, str]]:
    """``(workflow, model)``: ``hot`` on ``m``, ``cool`` on ``n``, then ``cool2`` on ``n2``..."""
    names = [("hot", "m"), ("cool", "n")]
    return (names + [(f"cool{i}", f"n{i}") for i in range(2, models)])[:models]


def _spec(config: ReplicasRealConfig, folder: Path) -> Path:
    task = {"exec_ms": config.exec_ms, "input_kb": 1, "output_kb": 1, "after": []}
    pairs = workflow_models(config.models)
    spec = {
        "name": "replicas-real",
        "cluster": {"workers": config.workers, "gpu_memory_mb": config.gpu_memory_mb,
                    "h2d_gbps": config.h2d_gbps, "d2h_gbps": config.h2d_gbps, "net_gbps": 10,
                    "net_fixed_us": 2},
        "models": {m: {"size_mb": config.model_mb} for _, m in pairs},
        "workflows": {w: {"tasks": {"t": {"model": m, **task}}} for w, m in pairs},
    }  # fmt: skip
    path = folder / "replicas-real.json"
    path.write_text(json.dumps(spec))
    return path


def arrivals(config: ReplicasRealConfig) -> list[tuple[float, str]]:
    """``(seconds from the start, workflow)``, sorted: Poisson at each workflow's rate."""
    rng = np.random.default_rng(config.seed)
    horizon = config.before_s + config.burst_s + config.after_s
    burst = (config.before_s, config.before_s + config.burst_s)
    out: list[tuple[float, str]] = []
    for workflow, _ in workflow_models(config.models):
        t = 0.0
        while True:
            in_burst = workflow == "hot" and burst[0] <= t < burst[1]
            t += float(rng.exponential(1.0 / (config.burst_rate if in_burst else config.base_rate)))
            if t >= horizon:
                break
            out.append((t, workflow))
    return sorted(out)


async def _side(
    config: ReplicasRealConfig, spec: Path, jobs: list[tuple[float, str]], replicate: bool
) -> dict[str, Any]:
    args = ["--workload", str(spec), "--lanes", "1", "--host-lanes", "0", "--no-warm"]
    args.append("--replicate" if replicate else "--no-replicate")
    async with LocalCluster(config.workers, args=args) as cluster:
        clients = [cluster.client(i) for i in range(config.workers)]
        for c in clients:
            await c.connect()
        try:
            for i, (workflow, _) in enumerate(workflow_models(config.models)):
                # its model loaded there
                await clients[i % len(clients)].submit(workflow, x=1, timeout=120)
            before = [sorted((await c.status()).cache["resident"]) for c in clients]
            loop = asyncio.get_running_loop()
            start = loop.time()
            latencies: list[float | None] = [None] * len(jobs)

            async def one(i: int, t: float, workflow: str, client: Client) -> None:
                await asyncio.sleep(max(0.0, start + t - loop.time()))
                began = loop.time()
                try:
                    await client.submit(workflow, x=1, timeout=120)
                except Exception:  # a job lost or refused is a miss
                    return
                latencies[i] = loop.time() - began

            await asyncio.gather(
                *(one(i, t, w, clients[i % len(clients)]) for i, (t, w) in enumerate(jobs))
            )
            statuses = [await c.status() for c in clients]
        finally:
            for c in clients:
                await c.aclose()
    return {
        "latencies": latencies,
        "resident_before": before,
        "replicas": {s.name: s.to_json().get("replicas", {}) for s in statuses},
    }


def _summary(
    config: ReplicasRealConfig, jobs: list[tuple[float, str]], latencies: list[float | None],
    best_s: dict[str, float],
) -> dict[str, Any]:  # fmt: skip
    burst = (config.before_s, config.before_s + config.burst_s)

    def of(chosen: list[int]) -> dict[str, float]:
        slow = [
            np.inf if latencies[i] is None else latencies[i] / best_s[jobs[i][1]]  # type: ignore[operator]
            for i in chosen
        ]
        ok = sum(s <= config.max_slowdown for s in slow)
        return {"jobs": len(chosen), "attainment": ok / max(1, len(chosen)),
                "p95_slowdown": float(np.percentile(slow, 95)) if slow else 0.0}  # fmt: skip

    every = list(range(len(jobs)))
    hot = [i for i, (t, w) in enumerate(jobs) if w == "hot" and burst[0] <= t < burst[1]]
    return {"all": of(every), "burst_hot": of(hot)}


def run_real(config: ReplicasRealConfig, json_path: str | None = None) -> dict[str, Any]:
    """Both sides on the same arrivals; print a table and write JSON."""
    jobs = arrivals(config)
    with tempfile.TemporaryDirectory(prefix="compass-replicas-real-") as folder:
        spec = _spec(config, Path(folder))
        workload = load_workload(spec)
        profiles = Profiles.from_workload(workload)
        best_s = {n: best_time_s(wf, profiles) for n, wf in workload.workflows.items()}
        sides = {
            "off": asyncio.run(_side(config, spec, jobs, replicate=False)),
            "on": asyncio.run(_side(config, spec, jobs, replicate=True)),
        }
    results = {
        k: {**_summary(config, jobs, v["latencies"], best_s),
            "warmed": sum(r.get("warmed", 0) for r in v["replicas"].values()),
            "replicas": v["replicas"], "resident_before": v["resident_before"]}
        for k, v in sides.items()
    }  # fmt: skip
    on, off = results["on"], results["off"]
    ratios = {
        f"{part}_{key}_on_over_off": on[part][key] / off[part][key]
        for part in ("all", "burst_hot")
        for key in ("attainment", "p95_slowdown")
        if off[part][key]
    }
    print_table(
        f"replicas --real: {len(jobs)} jobs on {config.workers} workers, seed {config.seed}; "
        f"a burst of hot at {config.burst_rate:g}/s for {config.burst_s:g} s",
        ["side", "jobs", "attainment", "p95 slowdown", "burst hot jobs", "burst attainment",
         "burst p95 slowdown", "copies warmed"],
        [[k, v["all"]["jobs"], v["all"]["attainment"], v["all"]["p95_slowdown"],
          v["burst_hot"]["jobs"], v["burst_hot"]["attainment"], v["burst_hot"]["p95_slowdown"],
          v["warmed"]] for k, v in results.items()],
    )  # fmt: skip
    print("on/off: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    out = {
        "config": {**asdict(config), "machine": machine()},
        "best_s": best_s,
        "results": results,
        "ratios": ratios,
    }
    write_json(json_path, out)
    return out


#: the ratios :func:`run_sweep` sums up, on over off (attainment: higher is better; p95
#: slowdown: lower is better)
SWEEP_RATIOS = (
    "all_attainment_on_over_off",
    "all_p95_slowdown_on_over_off",
    "burst_hot_attainment_on_over_off",
    "burst_hot_p95_slowdown_on_over_off",
)


def run_sweep(
    config: ReplicasRealConfig,
    seeds: tuple[int, ...],
    caches_mb: tuple[int, ...],
    json_path: str | None = None,
    many_small: bool = False,
) -> dict[str, Any]:
    """:func:`run_real` for every cache size and seed (and :meth:`~ReplicasRealConfig.
    many_small`'s setup, as ``many-small``); a table of every run's sides and, per setup, the
    geometric mean of each on/off ratio over the seeds; JSON."""
    setups = {str(mb): replace(config, gpu_memory_mb=mb) for mb in caches_mb}
    if many_small:
        setups["many-small"] = replace(ReplicasRealConfig.many_small(), seed=config.seed)
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, setup in setups.items():
        for seed in seeds:
            runs.setdefault(name, []).append(run_real(replace(setup, seed=seed)))
    rows: list[list[Any]] = []
    means: dict[str, dict[str, float]] = {}
    for cache, done in runs.items():
        for one in done:
            for side, v in one["results"].items():
                rows.append([cache, one["config"]["seed"], side, v["all"]["attainment"],
                             v["all"]["p95_slowdown"], v["burst_hot"]["attainment"],
                             v["burst_hot"]["p95_slowdown"], v["warmed"]])  # fmt: skip
        means[cache] = {
            key: statistics.geometric_mean(o["ratios"][key] for o in done)
            for key in SWEEP_RATIOS
            if all(o["ratios"].get(key, 0) > 0 for o in done)
        }
    print_table(
        f"replicas --real, seeds {', '.join(map(str, seeds))}: every run",
        ["setup", "seed", "side", "attainment", "p95 slowdown", "burst attainment",
         "burst p95 slowdown", "copies warmed"],
        rows,
    )  # fmt: skip
    print_table(
        "replicas --real: on over off, per seed (geometric mean last)",
        ["setup", "seed", "attainment", "p95 slowdown", "burst attainment",
         "burst p95 slowdown"],
        [[cache, o["config"]["seed"], *(o["ratios"].get(k, math.nan) for k in SWEEP_RATIOS)]
         for cache, done in runs.items() for o in done]
        + [[cache, "geo-mean", *(m.get(k, math.nan) for k in SWEEP_RATIOS)]
           for cache, m in means.items()],
    )  # fmt: skip
    out = {
        "config": {**asdict(config), "seeds": list(seeds), "caches_mb": list(caches_mb),
                   "many_small": many_small, "machine": machine()},
        "runs": runs,
        "geomean_ratios": means,
    }  # fmt: skip
    write_json(json_path, out)
    return out
