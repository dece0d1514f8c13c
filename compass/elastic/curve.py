"""Time-varying traffic for the simulator: a rate per minute, and the job arrivals it gives.

A *curve* is one relative rate per minute (mean 1 over the curve): :func:`daily_curve` draws
a day (1,440 minutes) by seed, a night trough, a morning rise, an afternoon peak and an
evening shoulder, with per-minute noise and a few bursts that triple the rate within a
minute; :func:`read_counts` reads a CSV of per-minute job counts (header ``minute,jobs``),
so a public trace can be replayed. :func:`curve_arrivals` turns a curve into arrivals for a
workload: minute ``k`` lasts ``minute_s`` simulated seconds (60: real time; less compresses
the day) and runs at ``curve[k] * rate_scale`` times the workload's own rate (its clients'
mean interval and weights), as a Poisson process within the minute.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.sim.arrivals import Arrival
from compass.workflow.spec import Workload

__all__ = [
    "DAY_MINUTES",
    "burst_curve",
    "curve_arrivals",
    "daily_curve",
    "read_counts",
    "workload_rate",
]

DAY_MINUTES = 1440
FloatArray = npt.NDArray[np.float64]


def daily_curve(
    seed: int,
    *,
    minutes: int = DAY_MINUTES,
    trough: float = 0.25,
    bursts: int = 6,
    burst_factor: float = 3.0,
    noise: float = 0.1,
) -> FloatArray:
    """A day's relative rate per minute (mean 1): the trough is ``trough`` of the peak of the
    daily shape; ``bursts`` bursts of 1 to 5 minutes each multiply the rate by
    ``burst_factor`` (reached within their first minute); per-minute noise of ``noise``
    (log-normal, correlated over a few minutes)."""
    if not isinstance(minutes, int) or minutes < 1:
        raise ConfigError(f"a curve needs a whole number of minutes >= 1, got {minutes!r}")
    if not 0 < trough <= 1 or not burst_factor >= 1 or not noise >= 0 or bursts < 0:
        raise ConfigError("need 0 < trough <= 1, burst_factor >= 1, noise >= 0 and bursts >= 0")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 37]))
    t = np.arange(minutes) / DAY_MINUTES  # fraction of a day
    peak_at = 0.6 + rng.uniform(-0.04, 0.04)  # mid-afternoon
    main = 0.5 - 0.5 * np.cos(2 * math.pi * (t - peak_at + 0.5))
    evening = np.exp(-(((t - 0.85) / 0.05) ** 2)) * 0.35
    shape = trough + (1 - trough) * np.clip(main**1.5 + evening, 0.0, 1.0)
    if noise > 0:
        steps = rng.normal(0.0, noise, minutes)
        smooth = np.convolve(steps, np.ones(5) / math.sqrt(5), mode="same")
        shape = shape * np.exp(smooth - smooth.mean())
    for _ in range(bursts):
        start = int(rng.integers(0, minutes))
        length = int(rng.integers(1, 6))
        shape[start : start + length] *= burst_factor
    return np.asarray(shape / shape.mean(), dtype=np.float64)


def burst_curve(before: int, after: int, factor: float = 3.0) -> FloatArray:
    """A steady rate of 1 for ``before`` minutes, ``factor`` times it for one minute, then 1
    again for ``after`` minutes (not normalised: the steady minutes are the unit)."""
    if before < 0 or after < 0 or not factor > 0:
        raise ConfigError("burst_curve needs before, after >= 0 and factor > 0")
    return np.concatenate([np.ones(before), [float(factor)], np.ones(after)])


def read_counts(path: str | Path) -> FloatArray:
    """Per-minute job counts from a CSV with header ``minute,jobs`` (minutes whole numbers
    from 0, in any order; a minute not listed has no jobs), as a relative curve (mean 1)."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot read trace {source}: {error.strerror or error}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip() for c in rows[0]] != ["minute", "jobs"]:
        raise ConfigError(f"trace {source}: the first line must be the header 'minute,jobs'")
    counts: dict[int, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            if len(row) != 2:
                raise ValueError
            minute, jobs = int(row[0]), float(row[1])
        except ValueError:
            raise ConfigError(
                f"trace {source} line {line}: expected a whole minute and a job count, "
                f"got {','.join(row)!r}"
            ) from None
        if minute < 0 or not jobs >= 0 or not math.isfinite(jobs):
            raise ConfigError(
                f"trace {source} line {line}: minute must be >= 0 and jobs a finite "
                f"count >= 0, got {minute}, {jobs}"
            )
        if minute in counts:
            raise ConfigError(f"trace {source} line {line}: minute {minute} is listed twice")
        counts[minute] = jobs
    total = sum(counts.values())
    if not total > 0:
        raise ConfigError(f"trace {source}: no jobs in any minute")
    curve = np.zeros(max(counts) + 1)
    for minute, jobs in counts.items():
        curve[minute] = jobs
    return np.asarray(curve / curve.mean(), dtype=np.float64)


def workload_rate(workload: Workload) -> float:
    """The workload's own job rate (jobs/s over every client, at load 1)."""
    interval_s = workload.arrivals.mean_interval_ms_per_client / 1000.0
    return sum(workload.weight_list()) / interval_s


def curve_arrivals(
    workload: Workload,
    curve: FloatArray,
    *,
    minute_s: float = 60.0,
    rate_scale: float = 1.0,
    seed: int = 0,
) -> list[Arrival]:
    """Arrivals over ``curve`` (see the module docstring); a job's workflow is drawn by the
    workflows' weights, its client is its workflow's index (one client per workflow)."""
    if not minute_s > 0 or not math.isfinite(minute_s):
        raise ConfigError(f"minute_s must be a finite number > 0, got {minute_s!r}")
    if not rate_scale > 0 or not math.isfinite(rate_scale):
        raise ConfigError(f"--rate-scale must be a finite number > 0, got {rate_scale!r}")
    names = list(workload.workflows)
    weights = np.asarray(workload.weight_list(), dtype=np.float64)
    share = weights / weights.sum()
    base = workload_rate(workload) * rate_scale
    rng = np.random.default_rng(np.random.SeedSequence([seed, 38]))
    counts = rng.poisson(np.asarray(curve, dtype=np.float64) * base * minute_s)
    total = int(counts.sum())
    starts = np.repeat(np.arange(len(counts)) * minute_s, counts)
    times = np.sort(starts + rng.uniform(0.0, minute_s, total))
    which = rng.choice(len(names), size=total, p=share)
    return [Arrival(float(t), names[int(w)], int(w)) for t, w in zip(times, which, strict=True)]
