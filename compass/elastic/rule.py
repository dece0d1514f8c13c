"""How many workers the cluster needs for its objective: a sans-IO rule, no clock, no I/O.

Any worker can compute it from what it already knows; the simulator
(:mod:`compass.elastic.sim`) and the real worker (``compass_desired_workers``) call the same
:meth:`ScaleRule.decide`. The rule, per control step (``Signals`` in, :class:`Decision` out):

1. **Need from the capacity model.** The planner's profiles say how many GPU-lane seconds a
   job of the workload's mix needs (``lane_s_per_job``); at an arrival rate ``r`` the cluster
   needs ``ceil(r * lane_s_per_job / (lanes * target_util))`` workers, the utilization target
   leaving the headroom that queueing within the objective needs. The rate is the larger of a
   short window's (seconds: a burst is seen at once) and a long window's.
2. **Scale out fast, before attainment falls.** Pressure is a mean queue wait (at the lowest
   priority, what every heartbeat carries) above ``wait_fraction`` of the slack a job has
   within its objective, a raised priority's wait above that slack, or the attainment below
   the objective's quantile while some queue still waits. Under pressure the target is at
   least the current size plus ``out_step`` of it. A higher target applies at once (no
   delay): starting workers count toward the current size, so a step is not asked twice.
3. **Scale in slowly, with hysteresis.** A lower target applies only when the need computed
   at the *lower* utilization ``target_util - band`` (the long window's rate) stays below the
   current size for ``in_after_s`` without pressure (and the short window's rate is not
   rising past the long one's), and then by at most ``in_step`` workers or ``in_fraction`` of
   the size, whichever is more, per ``in_after_s``: a load that flaps around a threshold moves
   the target out, never in and out again.
4. **Bounds.** The target is kept within ``[minimum, maximum]``.

Which workers go when the target falls is :func:`pick_drain`'s: never one that holds the only
ready copy of a hot model (the caller warms another copy first; the hold is reported).
:class:`RayServeRule` is the baseline the bench compares with: Ray Serve's default
autoscaling policy (target ongoing requests per replica, its default delays).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compass.errors import ConfigError

__all__ = [
    "Decision",
    "RayServeConfig",
    "RayServeRule",
    "ScaleConfig",
    "ScaleRule",
    "Signals",
    "WorkerLoad",
    "parse_bounds",
    "pick_drain",
    "staffed",
    "staffing_beta",
    "util_at",
    "workers_at",
    "workers_for",
]


def parse_bounds(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (``--autoscale``) as two integers, 1 <= MIN <= MAX; a one-line error else."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"autoscale bounds must be MIN:MAX (two whole numbers), got {text!r}")
    low, high = int(parts[0]), int(parts[1])
    if low < 1:
        raise ConfigError(f"autoscale MIN must be at least 1, got {low}")
    if low > high:
        raise ConfigError(f"autoscale MIN ({low}) is above MAX ({high})")
    return low, high


def workers_for(rate: float, lane_s_per_job: float, lanes: int, util: float) -> int:
    """Workers whose ``lanes`` GPU lanes each are busy ``util`` of the time at ``rate`` jobs/s
    of ``lane_s_per_job`` lane-seconds each (at least 1)."""
    if not 0 < util <= 1:
        raise ConfigError(f"utilization must be in (0, 1], got {util!r}")
    return max(1, math.ceil(rate * lane_s_per_job / (lanes * util) - 1e-9))


def staffed(load: float, beta: float, margin: float = 1.0) -> int:
    """Square-root staffing: ``load + beta * sqrt(load)`` workers for ``load`` workers' worth of
    work (times ``margin``; at least 1). Queueing needs a headroom that grows as the square
    root of the load, not in proportion to it (the Halfin-Whitt regime): a cluster ten times
    larger needs about three times the spare workers, so one utilization target calibrated
    on a small cluster over-provisions a large one."""
    return max(1, math.ceil(margin * (load + beta * math.sqrt(max(load, 0.0))) - 1e-9))


def staffing_beta(workers: int, util: float) -> float:
    """The ``beta`` of :func:`staffed` that gives ``workers`` at utilization ``util`` (the
    capacity model's calibration point)."""
    load = workers * util
    return (workers - load) / math.sqrt(load)


def util_at(table: Sequence[tuple[int, float]], workers: int) -> float:
    """The utilization a cluster of ``workers`` can run at within its objective, from a table
    of ``(workers, utilization)`` points in increasing size (:mod:`compass.elastic.capacity`
    calibrates one): linear between two points, the nearest end's outside them."""
    if workers <= table[0][0]:
        return table[0][1]
    for (n0, u0), (n1, u1) in itertools.pairwise(table):
        if workers <= n1:
            return u0 + (u1 - u0) * (workers - n0) / (n1 - n0)
    return table[-1][1]


def workers_at(
    load: float, table: Sequence[tuple[int, float]], scale: float = 1.0, most: int = 1 << 16
) -> int:
    """The fewest workers (at least 1, at most ``most``) whose utilization at ``load``
    workers' worth of work is within the table's for their size (times ``scale``): a larger
    cluster queues less at the same utilization, so each size is held to its own."""
    for n in range(1, most + 1):
        if load <= n * scale * util_at(table, n) + 1e-9:
            return n
    return most


@dataclass(frozen=True, slots=True)
class ScaleConfig:
    """The rule's settings (see the module docstring); times in seconds."""

    minimum: int = 1
    maximum: int = 64
    target_util: float = 0.6
    band: float = 0.15
    wait_fraction: float = 0.3
    out_step: float = 0.25
    in_after_s: float = 30.0
    in_step: int = 1
    in_fraction: float = 0.2
    #: square-root staffing (None: off): the need is ``R + staffing * sqrt(R)`` workers for
    #: ``R`` lanes' worth of work, not ``R / target_util`` (:func:`staffed`)
    staffing: float | None = None
    #: utilization by cluster size (``(workers, utilization)``, increasing sizes; empty: off):
    #: the need is the fewest workers held to their own size's utilization (:func:`workers_at`),
    #: not one ``target_util`` for every size; the scale-in band is then the same share of it
    #: as ``band`` is of ``target_util``
    by_size: tuple[tuple[int, float], ...] = ()
    #: the share of the table's utilization the rule aims at (1: the table as calibrated);
    #: :func:`~compass.elastic.capacity.day_margin` chooses it for a day's attainment
    margin: float = 1.0
    #: a start not yet done is called off as soon as the present rate leaves a surplus past
    #: the band (no ``in_after_s`` wait: it serves no one yet)
    call_off: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ConfigError(
                f"need 1 <= minimum <= maximum workers, got {self.minimum}:{self.maximum}"
            )
        if not 0 < self.target_util <= 1 or not 0 <= self.band < self.target_util:
            raise ConfigError(
                f"need 0 < target_util <= 1 and 0 <= band < target_util, got "
                f"{self.target_util!r}, {self.band!r}"
            )
        if not self.wait_fraction > 0 or not self.out_step > 0:
            raise ConfigError("wait_fraction and out_step must be > 0")
        if not self.in_after_s >= 0 or self.in_step < 1 or not 0 <= self.in_fraction < 1:
            raise ConfigError("need in_after_s >= 0, in_step >= 1 and 0 <= in_fraction < 1")
        if self.staffing is not None and not 0 <= self.staffing < math.inf:
            raise ConfigError(f"staffing must be a finite number >= 0, got {self.staffing!r}")
        if not 0 < self.margin <= 1:
            raise ConfigError(f"margin must be in (0, 1], got {self.margin!r}")
        sizes = [n for n, _ in self.by_size]
        if sizes != sorted(set(sizes)) or any(n < 1 or not 0 < u <= 1 for n, u in self.by_size):
            raise ConfigError(
                "by_size needs increasing sizes >= 1, each with a utilization in (0, 1], got "
                f"{self.by_size!r}"
            )

    def need(self, rate: float, lane_s_per_job: float, lanes: int, *, low: bool = False) -> int:
        """Workers for ``rate`` jobs/s (``low``: at the scale-in utilization, ``target_util -
        band``), within the bounds."""
        util = self.target_util - self.band if low else self.target_util
        if self.by_size:
            load = rate * lane_s_per_job / lanes
            scale = self.margin * util / self.target_util
            n = workers_at(load, self.by_size, scale, self.maximum)
        elif self.staffing is None:
            n = workers_for(rate, lane_s_per_job, lanes, util)
        else:
            n = staffed(rate * lane_s_per_job / lanes, self.staffing, self.target_util / util)
        return min(max(n, self.minimum), self.maximum)


@dataclass(frozen=True, slots=True)
class Signals:
    """What a worker knows at ``now``: ``current`` workers serving or starting; the arrival
    rate over a short and a long window (jobs/s, summed over every ingress); the per-job
    lane-seconds of the mix and the lanes per worker (the planner's capacity model); the
    queue waits of the serving workers per priority (priority -> one wait per worker); the
    slack a job has within its objective (seconds of queueing it can take); the recent
    attainment (None: no job finished lately) and the objective's quantile."""

    now: float
    current: int
    rate_short: float
    rate_long: float
    lane_s_per_job: float
    lanes: int = 1
    waits: Mapping[int, Sequence[float]] = field(default_factory=dict)
    slack_s: float = math.inf
    attainment: float | None = None
    quantile: float = 0.95
    #: of ``current``, the workers still starting (not yet serving)
    starting: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """The desired worker count and why (``out``, ``in``, ``hold``, ``steady``)."""

    desired: int
    reason: str
    pressure: bool = False

    def to_json(self) -> dict[str, Any]:
        """As ``compass status`` and the dashboard show it."""
        return {"desired": self.desired, "reason": self.reason, "pressure": self.pressure}


class ScaleRule:
    """The desired worker count, step by step (see the module docstring). It keeps only the
    time the surplus began and the last scale-in, so any worker fed the same signals (one
    gossip round spreads them) computes the same count."""

    def __init__(self, config: ScaleConfig | None = None) -> None:
        self.config = config or ScaleConfig()
        self._surplus_since: float | None = None
        self._last_in = -math.inf
        self.desired = self.config.minimum

    def pressure(self, s: Signals) -> bool:
        """Whether the objective is about to break: waits or attainment (rule 2)."""
        c = self.config
        low = s.waits.get(min(s.waits), ()) if s.waits else ()
        if low and sum(low) / len(low) > c.wait_fraction * s.slack_s:
            return True
        # a raised priority is owed its slack on every worker (the lowest: on average, as a
        # single long task queued anywhere is not a shortage of workers)
        lowest = min(s.waits) if s.waits else 0
        if any(w > s.slack_s for p, ws in s.waits.items() if p != lowest for w in ws):
            return True
        # attainment lags (it is of jobs already done): it presses only while queues wait
        lagging = s.attainment is not None and s.attainment < s.quantile
        return lagging and bool(low) and max(low) > 0.1 * s.slack_s

    def decide(self, s: Signals) -> Decision:
        c = self.config
        rate = max(s.rate_short, s.rate_long)
        need = c.need(rate, s.lane_s_per_job, s.lanes)
        pressed = self.pressure(s)
        current = max(1, s.current)
        if pressed:
            need = max(need, current + max(1, math.ceil(c.out_step * current)))
        need = min(max(need, c.minimum), c.maximum)
        if need > current or (need == current and pressed):
            self._surplus_since = None
            self.desired = need
            return Decision(need, "out" if need > current else "steady", pressed)
        low_need = c.need(s.rate_long, s.lane_s_per_job, s.lanes, low=True)
        # a start not yet done serves no one: once even the present rate leaves a surplus
        # past the band, it is called off at once (a spike shorter than a start is the
        # headroom's to absorb, not a reason to pay for workers that come after it)
        now_need = c.need(rate, s.lane_s_per_job, s.lanes, low=True)
        if c.call_off and s.starting and not pressed and now_need < current:
            self._surplus_since = None
            self.desired = max(now_need, current - s.starting)
            return Decision(self.desired, "call-off")
        if pressed or low_need >= current or s.rate_short > s.rate_long * 1.5:
            self._surplus_since = None
            self.desired = current
            return Decision(current, "steady", pressed)
        if self._surplus_since is None:
            self._surplus_since = s.now
        sustained = s.now - self._surplus_since >= c.in_after_s
        spaced = s.now - self._last_in >= c.in_after_s
        if sustained and spaced:
            self._last_in = s.now
            step = max(c.in_step, math.floor(c.in_fraction * current))
            self.desired = max(low_need, current - step)
            return Decision(self.desired, "in")
        self.desired = current
        return Decision(current, "hold")


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A serving worker as the view shows it: its queue wait and the models it holds."""

    name: str
    wait_s: float
    models: frozenset[str]


def pick_drain(
    workers: Sequence[WorkerLoad], count: int, hot: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Up to ``count`` workers to drain, least loaded first, and the hot models that kept a
    worker (the only serving copy of a hot model is never dropped: warm another first).

    A worker may go when every hot model it holds is also held by a worker that stays."""
    hot_set = set(hot)
    holders: dict[str, int] = {}
    for w in workers:
        for m in w.models & hot_set:
            holders[m] = holders.get(m, 0) + 1
    chosen: list[str] = []
    kept: list[str] = []
    for w in sorted(workers, key=lambda w: (w.wait_s, len(w.models), w.name)):
        if len(chosen) >= count or len(workers) - len(chosen) <= 1:
            break
        sole = sorted(m for m in w.models & hot_set if holders[m] <= 1)
        if sole:
            kept.extend(sole)
            continue
        for m in w.models & hot_set:
            holders[m] -= 1
        chosen.append(w.name)
    return chosen, kept


@dataclass(frozen=True, slots=True)
class RayServeConfig:
    """Ray Serve's autoscaling defaults (``AutoscalingConfig``, Ray 2.32 on)."""

    minimum: int = 1
    maximum: int = 64
    target_ongoing: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0


class RayServeRule:
    """The baseline: desired replicas ``ceil(mean ongoing requests / target)`` from samples
    taken every ``metrics_interval_s`` and averaged over ``look_back_s``; a higher count
    applies once wanted for ``upscale_delay_s``, a lower one once wanted for
    ``downscale_delay_s`` (Ray Serve's decision counters). Call :meth:`observe` with the
    cluster's ongoing requests (queued and running tasks) and :meth:`decide` at each step."""

    def __init__(self, config: RayServeConfig | None = None, start: int = 1) -> None:
        self.config = config or RayServeConfig()
        self.desired = max(self.config.minimum, min(start, self.config.maximum))
        self._samples: list[tuple[float, float]] = []
        self._last_sample = -math.inf
        self._up_since: float | None = None
        self._down_since: float | None = None

    def observe(self, now: float, ongoing: float) -> None:
        if now - self._last_sample >= self.config.metrics_interval_s:
            self._last_sample = now
            self._samples.append((now, ongoing))
        cutoff = now - self.config.look_back_s
        self._samples = [(t, v) for t, v in self._samples if t >= cutoff]

    def decide(self, now: float) -> Decision:
        c = self.config
        if not self._samples:
            return Decision(self.desired, "steady")
        mean = sum(v for _, v in self._samples) / len(self._samples)
        want = min(max(math.ceil(mean / c.target_ongoing - 1e-9), c.minimum), c.maximum)
        if want > self.desired:
            self._down_since = None
            self._up_since = now if self._up_since is None else self._up_since
            if now - self._up_since >= c.upscale_delay_s:
                self.desired, self._up_since = want, None
                return Decision(want, "out")
        elif want < self.desired:
            self._up_since = None
            self._down_since = now if self._down_since is None else self._down_since
            if now - self._down_since >= c.downscale_delay_s:
                self.desired, self._down_since = want, None
                return Decision(want, "in")
        else:
            self._up_since = self._down_since = None
        return Decision(self.desired, "hold")
