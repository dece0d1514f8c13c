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

The table is calibrated on steady traffic at fixed sizes; a day of traffic is judged on
something else: the share of the whole day's jobs within the objective, while the cluster
grows cold workers into rises and bursts that outrun a start. :func:`day_margin` closes that
gap with one cheap calibration day per workload (a curve of its own seed, never one that is
judged): the largest ``margin`` on the table (the rule aims at ``margin * u(n)``) whose day
meets the objective and whose 3x burst is absorbed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compass.elastic.curve import burst_curve, curve_arrivals, daily_curve, workload_rate
from compass.elastic.rule import ScaleConfig
from compass.elastic.sim import ElasticOptions, lane_s_per_job, simulate_elastic
from compass.errors import ConfigError
from compass.sim.arrivals import workload_arrivals
from compass.workflow.spec import Workload

__all__ = ["Calibration", "DayCheck", "day_margin", "utilization_by_size"]


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


@dataclass(frozen=True, slots=True)
class DayCheck:
    """How :func:`day_margin` judges a margin: a :func:`~compass.elastic.curve.daily_curve` of
    ``seed`` (keep it apart from the seeds a result is judged on) of ``minutes`` minutes of
    ``minute_s`` seconds, workers starting in ``start_s``; met when at least ``share`` of the
    day's jobs are within ``max_slowdown`` and, in a separate real-time run (``burst_before``
    steady minutes, one at 3x, ``burst_after`` after), at least ``burst_share`` of the burst
    minute's. ``margins`` are tried largest first."""

    seed: int = 100
    minutes: int = 1440
    minute_s: float = 1.0
    start_s: float = 30.0
    max_slowdown: float = 3.0
    share: float = 0.99
    burst_share: float = 0.95
    burst_before: int = 8
    burst_after: int = 3
    margins: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7, 0.6)

    def __post_init__(self) -> None:
        if not self.margins or list(self.margins) != sorted(set(self.margins), reverse=True):
            raise ConfigError(f"margins must be decreasing, got {list(self.margins)!r}")
        if any(not 0 < m <= 1 for m in self.margins):
            raise ConfigError(f"every margin must be in (0, 1], got {list(self.margins)!r}")
        if not 0 < self.share <= 1 or not 0 < self.burst_share <= 1:
            raise ConfigError("share and burst_share must be in (0, 1]")


def day_margin(
    workload: Workload,
    rule: ScaleConfig,
    sizes: Callable[[float], tuple[int, int]],
    check: DayCheck | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """The largest of ``check.margins`` at which ``rule`` (sized by its ``by_size`` table)
    meets the objective over a calibration day and absorbs its burst (:class:`DayCheck`),
    and every margin tried with its figures. If none meets both, the one that comes nearest
    (the more of the two it meets, then the higher day's attainment): where attainment does
    not rise with workers, a smaller margin would only spend more.
    ``sizes(margin)``: the workers the day and the burst run start with at that margin."""
    c = check or DayCheck()
    if not rule.by_size:
        raise ConfigError("day_margin needs a rule sized by a utilization table (by_size)")
    day = curve_arrivals(
        workload, daily_curve(c.seed, minutes=c.minutes), minute_s=c.minute_s, seed=c.seed
    )
    burst = curve_arrivals(
        workload, burst_curve(c.burst_before, c.burst_after), minute_s=60.0, seed=c.seed
    )
    at = c.burst_before * 60.0
    tried: list[dict[str, Any]] = []
    for margin in c.margins:
        initial, burst_initial = sizes(margin)
        scaled = replace(rule, margin=margin)
        top = max(scaled.maximum, initial, burst_initial)
        options = ElasticOptions(
            controller="autoscale",
            initial=initial,
            maximum=top,
            start_s=c.start_s,
            max_slowdown=c.max_slowdown,
            rule=replace(scaled, maximum=top),
        )
        ran = simulate_elastic(workload, day, options, seed=c.seed)
        spike = simulate_elastic(
            workload, burst, replace(options, initial=burst_initial), seed=c.seed
        )
        figures = {
            "margin": margin,
            "attainment": ran.attainment(c.max_slowdown),
            "gpu_hours": ran.gpu_hours,
            "burst_attainment": spike.attainment(c.max_slowdown, at, at + 60.0),
        }
        tried.append(figures)
        if figures["attainment"] >= c.share and figures["burst_attainment"] >= c.burst_share:
            return margin, tried
    # none meets both: capacity does not buy the last point here, so the margin that comes
    # nearest (most of the two met, then the day's attainment; the larger margin on a tie)
    best = max(
        tried,
        key=lambda t: (
            (t["attainment"] >= c.share) + (t["burst_attainment"] >= c.burst_share),
            t["attainment"],
            t["margin"],
        ),
    )
    return float(best["margin"]), tried
