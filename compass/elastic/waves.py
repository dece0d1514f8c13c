"""Waves of one workflow's popularity at a steady total rate: what makes a model hot.

A daily curve (:mod:`compass.elastic.curve`) scales every workflow alike, so the models'
shares of the work never change and the placement the cache settled on stays right; what
replicating a hot model answers is a shift of the mix (a model that trends). In
:func:`wave_arrivals`, a job's workflow is drawn by the workload's weights, except during a
wave: one workflow (drawn by seed, a different one each wave where there are several) has its
weight multiplied by a factor that ramps up linearly over ``ramp`` minutes, holds for
``hold`` minutes and ramps down again. The total rate stays ``load`` times the workload's own,
so a fixed cluster has the same work throughout, only on other models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compass.elastic.curve import workload_rate
from compass.errors import ConfigError
from compass.sim.arrivals import Arrival
from compass.workflow.spec import Workload

__all__ = ["Waves", "wave_arrivals"]


@dataclass(frozen=True, slots=True)
class Waves:
    """``count`` waves, each ``gap`` steady minutes then a wave that ramps a workflow's weight
    to ``factor`` times over ``ramp`` minutes, holds ``hold`` and ramps down; ``gap`` steady
    minutes at the end."""

    count: int = 4
    factor: float = 6.0
    ramp: int = 3
    hold: int = 4
    gap: int = 5

    def __post_init__(self) -> None:
        if self.count < 1 or self.ramp < 1 or self.hold < 0 or self.gap < 0:
            raise ConfigError("need count >= 1, ramp >= 1, hold >= 0 and gap >= 0 minutes")
        if not self.factor >= 1 or not math.isfinite(self.factor):
            raise ConfigError(f"a wave's factor must be a finite number >= 1, got {self.factor!r}")


def wave_arrivals(
    workload: Workload,
    waves: Waves = Waves(),
    *,
    minute_s: float = 10.0,
    load: float = 1.0,
    seed: int = 0,
) -> list[Arrival]:
    """Arrivals over ``waves`` (module doc); a job's client is its workflow's index."""
    if not minute_s > 0 or not load > 0 or not math.isfinite(minute_s * load):
        raise ConfigError(f"need minute_s > 0 and load > 0, got {minute_s!r}, {load!r}")
    names = list(workload.workflows)
    weights = np.asarray(workload.weight_list(), dtype=np.float64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 39]))
    order = rng.permutation(len(names))
    w = waves
    shape = [*np.linspace(1.0, w.factor, w.ramp + 1)[1:], *([w.factor] * w.hold)]
    shape += shape[-2::-1][: w.ramp - 1] if w.ramp > 1 else []
    minutes: list[tuple[int, float]] = []  # (workflow in a wave or -1, its factor)
    for k in range(w.count):
        minutes += [(-1, 1.0)] * w.gap + [(int(order[k % len(names)]), f) for f in shape]
    minutes += [(-1, 1.0)] * w.gap
    rate = workload_rate(workload) * load
    out: list[Arrival] = []
    for m, (hot, f) in enumerate(minutes):
        share = weights.copy()
        if hot >= 0:
            share[hot] *= f
        count = int(rng.poisson(rate * minute_s))
        times = np.sort(m * minute_s + rng.uniform(0.0, minute_s, count))
        which = rng.choice(len(names), size=count, p=share / share.sum())
        out += [Arrival(float(t), names[int(w)], int(w)) for t, w in zip(times, which, strict=True)]
    return out
