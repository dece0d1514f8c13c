"""``compass bench elastic --real``: the simulator's answer checked on a real local cluster.

One small emulated workload (one workflow, one task of ``exec_ms`` on a small model), a rate
curve compressed to ``minute_s`` seconds a minute (quiet, a rise to four times the rate, quiet
again), the same arrivals twice:

- **real**: worker processes on this host (one lane each), sized by ``compass up
  --autoscale MIN:MAX``'s adapter (:class:`~compass.elastic.local.LocalAutoscaler`, every
  ``period_s``: it asks the first worker for its desired count, starts workers joined to it or
  drains the newest); every job submitted at its arrival time through the first worker;
  GPU-seconds are each worker's time from the step that asked for it until it exited (or the
  end), attainment the share of jobs within ``max_slowdown`` of their best time;
- **simulated**: :func:`~compass.elastic.sim.simulate_elastic` with the ``live`` controller
  (the same rule the real worker computes, from the serving workers' waits and busy lanes,
  every ``period_s``), a worker start taking what the real run measured (the mean of its
  spawns, to listening).

``results`` per side have ``gpu_hours`` and ``attainment``; ``ratios`` their real/simulated
ratio and difference; the issue's check is within 10% on both.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compass.cluster import LocalCluster, WorkerProcess
from compass.elastic.curve import curve_arrivals
from compass.elastic.local import LocalAutoscaler
from compass.elastic.sim import ElasticOptions, simulate_elastic
from compass.sim.arrivals import Arrival
from compass.workflow.best import best_time_s
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload, load_workload

from .report import machine, print_table, write_json

__all__ = ["RealConfig", "run_real"]

#: relative rate per compressed minute: quiet, a rise to 4x, quiet again
CURVE = (1, 1, 1, 2, 3, 4, 4, 4, 4, 4, 3, 2, 1, 1, 1, 1, 1, 1)


@dataclass(frozen=True, slots=True)
class RealConfig:
    minute_s: float = 10.0
    curve: tuple[float, ...] = CURVE
    base_rate: float = 1.2
    exec_ms: int = 400
    minimum: int = 1
    maximum: int = 4
    period_s: float = 2.0
    seed: int = 0
    max_slowdown: float = 3.0


def _spec(config: RealConfig, folder: Path) -> Path:
    spec = {
        "name": "elastic-real",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 100}},
        "workflows": {"work": {"tasks": {"t": {"model": "m", "exec_ms": config.exec_ms,
                                               "input_kb": 1, "output_kb": 1, "after": []}}}},
        "arrivals": {"mean_interval_ms_per_client": 1000.0 / config.base_rate, "jobs": 100},
    }  # fmt: skip
    path = folder / "elastic-real.json"
    path.write_text(json.dumps(spec))
    return path


class _TimedCluster(LocalCluster):
    """A local cluster that notes how long each worker took to start (to listening)."""

    #: seconds each worker took to start (to listening), in order
    spawns: list[float]

    async def spawn(
        self, name: str, join: str | None = None, extra: Sequence[str] = (), port: int = 0
    ) -> WorkerProcess:
        began = time.monotonic()
        worker = await super().spawn(name, join, extra, port)
        self.spawns.append(time.monotonic() - began)
        return worker


async def _real(config: RealConfig, spec: Path, arrivals: Sequence[Arrival]) -> dict[str, Any]:
    args = ["--workload", str(spec), "--lanes", "1", "--host-lanes", "0"]
    lines: list[str] = []
    cluster = _TimedCluster(config.minimum, args=args)
    cluster.spawns = []
    async with cluster:
        cluster.spawns.clear()  # the first workers' starts are not the autoscaler's
        scaler = LocalAutoscaler(cluster, config.minimum, config.maximum,
                                 period_s=config.period_s, say=lines.append)  # fmt: skip
        loop = asyncio.get_running_loop()
        start = loop.time()
        born: dict[int, float] = {id(w): 0.0 for w in cluster.workers}
        died: dict[int, float] = {}
        latencies: list[float | None] = []
        done = asyncio.Event()

        async def control() -> None:
            while not done.is_set():
                asked = loop.time() - start
                try:
                    await scaler.step()
                except Exception as exc:  # a failed step is the autoscaler's to report
                    lines.append(f"step failed: {exc}")
                now = loop.time() - start
                for w in cluster.workers:
                    born.setdefault(id(w), asked)
                    if not w.running:
                        died.setdefault(id(w), now)
                await asyncio.sleep(config.period_s)

        async with cluster.client() as client:

            async def one(a: Arrival) -> None:
                await asyncio.sleep(max(0.0, start + a.t_s - loop.time()))
                began = loop.time()
                try:
                    await client.submit(a.workflow, x=1, timeout=120)
                except Exception:  # a job lost or refused is a miss
                    latencies.append(None)
                else:
                    latencies.append(loop.time() - began)

            controller = asyncio.create_task(control())
            await asyncio.gather(*(one(a) for a in arrivals))
            done.set()
            await controller
        end = loop.time() - start
        worker_s = sum(died.get(key, end) - t for key, t in born.items())
    return {"worker_s": worker_s, "latencies": latencies, "spawns": cluster.spawns,
            "lines": lines, "horizon_s": end}  # fmt: skip


def run_real(config: RealConfig, json_path: str | None = None) -> dict[str, Any]:
    """The real run, then the simulated one on the same arrivals; print and write JSON."""
    with tempfile.TemporaryDirectory(prefix="compass-elastic-real-") as folder:
        spec = _spec(config, Path(folder))
        workload: Workload = load_workload(spec)
        curve = np.asarray(config.curve, dtype=np.float64)
        arrivals = curve_arrivals(workload, curve, minute_s=config.minute_s, seed=config.seed)
        real = asyncio.run(_real(config, spec, arrivals))
    wf = workload.workflows["work"]
    best = best_time_s(wf, Profiles.from_workload(workload), lanes=1, host_lanes=0) or 1.0
    within = [lat is not None and lat <= config.max_slowdown * best for lat in real["latencies"]]
    start_s = statistics.fmean(real["spawns"]) if real["spawns"] else 1.0
    sim = simulate_elastic(
        workload,
        arrivals,
        ElasticOptions(controller="live", initial=config.minimum, minimum=config.minimum,
                       maximum=config.maximum, start_s=start_s, control_s=config.period_s,
                       max_slowdown=config.max_slowdown),
        seed=config.seed,
    )  # fmt: skip
    results = {
        "real": {"gpu_hours": real["worker_s"] / 3600.0, "attainment": sum(within) / len(within),
                 "jobs": len(within), "starts": len(real["spawns"]),
                 "answered": sum(lat is not None for lat in real["latencies"]),
                 "mean_workers": real["worker_s"] / real["horizon_s"]},
        "simulated": {"gpu_hours": sim.gpu_hours, "attainment": sim.attainment(config.max_slowdown),
                      "jobs": len(sim.jobs), "starts": sim.starts,
                      "answered": sum(j.finish is not None for j in sim.jobs),
                      "mean_workers": sim.gpu_hours * 3600.0 / sim.horizon_s},
    }  # fmt: skip
    r, s = results["real"], results["simulated"]
    ratios = {
        "gpu_hours_real_over_sim": r["gpu_hours"] / s["gpu_hours"],
        "attainment_real_over_sim": r["attainment"] / s["attainment"],
    }
    within_10 = all(abs(v - 1.0) <= 0.10 for v in ratios.values())
    print_table(
        f"elastic --real: {len(arrivals)} jobs over {len(curve)} minutes of "
        f"{config.minute_s:g} s, autoscale {config.minimum}:{config.maximum} every "
        f"{config.period_s:g} s; a start measured {start_s:.2f} s",
        ["side", "GPU-h", "mean workers", "attainment", "starts", "jobs"],
        [[k, v["gpu_hours"], v["mean_workers"], v["attainment"], v["starts"], v["jobs"]]
         for k, v in results.items()],
    )  # fmt: skip
    print(f"real/simulated: GPU-hours {ratios['gpu_hours_real_over_sim']:.3f}, attainment "
          f"{ratios['attainment_real_over_sim']:.3f} (within 10%: {within_10})")  # fmt: skip
    out = {
        "config": {**asdict(config), "machine": machine()},
        "workloads": {workload.name: {"results": {"autoscale": results}, "ratios": ratios,
                                      "within_10_percent": within_10,
                                      "measured_start_s": start_s,
                                      "autoscaler_lines": real["lines"]}},
    }  # fmt: skip
    write_json(json_path, out)
    return out
