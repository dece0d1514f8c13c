"""Utilization at the objective by cluster size: the table :class:`~compass.elastic.rule.
ScaleConfig` ``by_size`` sizes with, calibrated once per workload in the simulator.

A cluster of ``n`` workers fed Poisson arrivals of the workload's mix meets its objective
(``share`` of the jobs within ``max_slowdown`` of their best time) up to some GPU-lane
utilization ``u(n)``; a larger cluster queues less at the same utilization (pooling), so
``u(n)`` rises with ``n``, and one utilization calibrated on a small cluster over-provisions
a large one. :func:`utilization_by_size` bisects ``u(n)`` at a few sizes on
:func:`~compass.elastic.sim.simulate_elastic`'s own settings (the cluster fixed at ``n``,
warm-up jobs left out); the rule interpolates between them. ``u(n)`` need not rise: on a
workload of many models a larger cluster spreads each model over more cold caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from compass.elastic.curve import workload_rate
from compass.elastic.sim import ElasticOptions, lane_s_per_job, simulate_elastic
from compass.errors import ConfigError
from compass.sim.arrivals import workload_arrivals
from compass.workflow.spec import Workload

__all__ = ["Calibration", "utilization_by_size"]


@dataclass(frozen=True, slots=True)
class Calibration:
    """How :func:`utilization_by_size` searches: ``jobs`` per trial at the smallest size
    (more in proportion at larger ones, up to ``max_jobs``), ``steps`` bisection steps between
    ``low`` and ``high`` utilization, the first ``warmup`` share of each trial's jobs left
    out (cold caches), and ``margin`` applied to what it finds."""

    jobs: int = 400
    jobs_per_worker: int = 100
    max_jobs: int = 3000
    steps: int = 6
    low: float = 0.05
    high: float = 0.95
    warmup: float = 0.15
    margin: float = 0.9
    seeds: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if self.jobs < 1 or self.max_jobs < self.jobs or self.steps < 1:
            raise ConfigError("need jobs >= 1, max_jobs >= jobs and steps >= 1")
        if not 0 < self.low < self.high <= 1 or not 0 <= self.warmup < 1:
            raise ConfigError("need 0 < low < high <= 1 and 0 <= warmup < 1")
        if not self.seeds:
            raise ConfigError("a calibration needs at least one seed")
        if not 0 < self.margin <= 1:
            raise ConfigError(f"margin must be in (0, 1], got {self.margin!r}")


def _met(
    workload: Workload,
    workers: int,
    util: float,
    config: Calibration,
    objective: tuple[float, float],
) -> bool:
    """Whether ``workers`` meet the objective at ``util``, the jobs of every seed pooled."""
    max_slowdown, share = objective
    jobs = min(config.max_jobs, max(config.jobs, config.jobs_per_worker * workers))
    load = util * workers / (workload_rate(workload) * lane_s_per_job(workload))
    options = ElasticOptions(
        controller="fixed", initial=workers, maximum=workers, max_slowdown=max_slowdown
    )
    ok = total = 0
    for seed in config.seeds:
        arrivals = workload_arrivals(workload, jobs, process="poisson", load=load, seed=seed)
        result = simulate_elastic(workload, arrivals, options, seed=seed)
        since = arrivals[int(config.warmup * len(arrivals))].t_s
        counted = [j for j in result.jobs if j.arrival >= since]
        total += len(counted)
        ok += sum(1 for j in counted if j.slowdown is not None and j.slowdown <= max_slowdown)
    return ok >= share * total


def utilization_by_size(
    workload: Workload,
    sizes: Sequence[int],
    *,
    max_slowdown: float = 3.0,
    share: float = 0.99,
    config: Calibration | None = None,
) -> tuple[tuple[int, float], ...]:
    """``(n, margin * u(n))`` for each of ``sizes`` (see the module docstring), each size
    bisected on its own: a larger cluster is not assumed to do better (on a workload of many
    models it may do worse, each model spread over more cold caches)."""
    c = config or Calibration()
    if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
        raise ConfigError(f"sizes must be increasing whole numbers >= 1, got {list(sizes)!r}")
    objective = (max_slowdown, share)
    table: list[tuple[int, float]] = []
    for n in sizes:
        low, high = c.low, c.high
        if _met(workload, n, high, c, objective):
            low = high
        elif _met(workload, n, low, c, objective):
            for _ in range(c.steps):
                mid = (low + high) / 2
                low, high = (mid, high) if _met(workload, n, mid, c, objective) else (low, mid)
        table.append((n, c.margin * low))
    return tuple(table)
