"""The simulator with a cluster that changes size: :func:`simulate_elastic`.

The same discrete-event simulation as :func:`compass.sim.simulate` (the real planner and
worker cores), over a pool of ``maximum`` workers of which only some serve; it is the
engine's :class:`~compass.sim.engine.Simulation` with hooks (:mod:`compass.sim.hooks`), and
acts through its public methods only. A worker is
``off``, ``starting``, ``serving`` or ``draining``:

- **Starting** takes ``start_s`` (process start, runtime init, models into host memory), then
  the worker warms its cache with the cluster's hot models (the real core's warming, from
  host memory at the spec's bandwidth) and serves only once those loads would be done: it
  joins cold, and is useful when it says it is ready.
- **Serving** workers take new jobs: jobs enter at them in turn, and planners see the others
  (starting, draining, off) with an endless queue, so they place nothing new there.
- **Draining** workers finish what they hold (their queued tasks and those already planned
  on them) and are off when idle: nothing is lost.

A worker costs GPU time from the moment it is asked to start until it is off. A controller
decides the size at every ``control_s``: ``autoscale`` (:class:`~compass.elastic.rule.
ScaleRule`), ``live`` (what ``compass up --autoscale`` follows: the real worker's
:class:`~compass.elastic.live.LiveDesired`, from the serving workers' waits and busy lanes,
deciding nothing while a worker starts, as the local autoscaler waits for its spawns),
``ray-serve`` (:class:`~compass.elastic.rule.RayServeRule`) or ``fixed`` (the initial size
throughout).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from compass.core.events import Tick
from compass.core.lanes import Lanes
from compass.elastic.live import LiveDesired, Seen
from compass.elastic.replicate import ReplicaConfig, Replicator
from compass.elastic.rule import (
    RayServeConfig,
    RayServeRule,
    ScaleConfig,
    ScaleRule,
    Signals,
    WorkerLoad,
    pick_drain,
)
from compass.errors import ConfigError
from compass.sim.arrivals import Arrival
from compass.sim.engine import Simulation
from compass.sim.modes import ingress_spread
from compass.sim.replicas import replicate_round
from compass.sim.result import JobRecord, SimResult
from compass.sim.settings import SimSettings
from compass.workflow.spec import Workload

__all__ = ["CONTROLLERS", "ElasticOptions", "ElasticResult", "lane_s_per_job", "simulate_elastic"]

#: the controllers :func:`simulate_elastic` knows
CONTROLLERS = ("autoscale", "live", "ray-serve", "fixed")


@dataclass(frozen=True, slots=True)
class ElasticOptions:
    """How the cluster changes size; times in simulated seconds."""

    controller: str = "autoscale"
    initial: int = 1
    minimum: int = 1
    maximum: int = 16
    start_s: float = 30.0
    control_s: float = 2.0
    short_s: float = 10.0
    long_s: float = 120.0
    attain_s: float = 60.0
    max_slowdown: float = 3.0
    quantile: float = 0.95
    rule: ScaleConfig | None = None
    ray: RayServeConfig | None = None
    #: hot models replicated ahead of need (:mod:`compass.elastic.replicate`); None: off
    replicate: ReplicaConfig | None = None

    def __post_init__(self) -> None:
        if self.controller not in CONTROLLERS:
            raise ConfigError(
                f"unknown controller {self.controller!r}; known: {', '.join(CONTROLLERS)}"
            )
        if not 1 <= self.minimum <= self.maximum:
            raise ConfigError(f"autoscale MIN ({self.minimum}) is above MAX ({self.maximum})")
        if not self.minimum <= self.initial <= self.maximum:
            raise ConfigError(
                f"initial size {self.initial} is outside {self.minimum}:{self.maximum}"
            )
        if not self.start_s >= 0 or not self.control_s > 0:
            raise ConfigError("start_s must be >= 0 and control_s > 0")


@dataclass(slots=True)
class ElasticResult:
    """What a run cost and gave: GPU-hours (worker time from start request to off, over
    3,600), the jobs, and the size over time ``(t, serving, starting or draining)``."""

    controller: str
    gpu_hours: float
    jobs: list[JobRecord]
    sizes: list[tuple[float, int, int]]
    starts: int = 0
    drains: int = 0
    #: drains a hot model's only copy prevented
    holds: int = 0
    #: copies of hot models warmed ahead of need
    replicas: int = 0
    horizon_s: float = 0.0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def attainment(self, max_slowdown: float, since: float = 0.0, until: float = math.inf) -> float:
        """Share of the jobs arriving in ``[since, until)`` within ``max_slowdown`` (a job
        that did not finish is a miss); 1.0 with no job."""
        chosen = [j for j in self.jobs if since <= j.arrival < until]
        if not chosen:
            return 1.0
        ok = sum(1 for j in chosen if j.slowdown is not None and j.slowdown <= max_slowdown)
        return ok / len(chosen)


def lane_s_per_job(workload: Workload) -> float:
    """GPU-lane seconds a job of the workload's mix needs (its workflows' task times, by
    weight): the planner's profiles, the capacity model the rule sizes with."""
    weights = workload.weights
    total = sum(weights.get(name, 1.0) for name in workload.workflows)
    seconds = sum(
        weights.get(name, 1.0) * sum(t.profile.exec_s for t in wf.tasks.values())
        for name, wf in workload.workflows.items()
    )
    return seconds / total


def simulate_elastic(
    workload: Workload,
    arrivals: Sequence[Arrival],
    options: ElasticOptions,
    *,
    policy: str = "compass",
    seed: int = 0,
) -> ElasticResult:
    """Run ``arrivals`` on a cluster sized by ``options.controller``; see the module doc."""
    settings = SimSettings(
        workers=options.maximum,
        policy=policy,
        heartbeat_s=0.01,
        staleness_s=0.01,
        lanes=1,
        prefetch=True,
        warm=True,
        cache_bytes=workload.cluster.gpu_memory_bytes,
        slab_bytes=64 << 20,
        seed=seed,
        host_lanes=0,
        prefetch_evicts=True,
        policy_options=None,
    )
    sim = _Elastic(workload, settings, options)
    result = sim.run(arrivals)
    return ElasticResult(
        controller=options.controller,
        gpu_hours=sim.worker_s / 3600.0,
        jobs=result.jobs,
        sizes=sim.sizes,
        starts=sim.starts,
        drains=sim.drains,
        holds=sim.holds,
        replicas=sim.replicas,
        horizon_s=result.horizon_s,
        wall_s=result.wall_s,
        extra={"loads": result.loads},
    )


class _Elastic:
    """The engine's hooks (:class:`~compass.sim.hooks.SimHooks`) for a cluster that changes
    size: it owns the simulation and acts through its public methods."""

    def __init__(self, workload: Workload, settings: SimSettings, options: ElasticOptions) -> None:
        spread = ingress_spread("spread", options.maximum)
        self.sim = sim = Simulation(workload, settings, spread=spread, hooks=self)
        self.workload = workload
        self.options = options
        n = len(sim.workers)
        self.phase = ["off"] * n
        self.on_since: list[float | None] = [None] * n
        self.worker_s = 0.0
        self.sizes: list[tuple[float, int, int]] = []
        self.starts = self.drains = self.holds = self.replicas = 0
        self._turn = 0
        self._recent: deque[tuple[float, str]] = deque()  # arrivals: time, workflow
        self._done: deque[tuple[float, bool]] = deque()  # finishes: time, within objective
        self._last_arrival = 0.0
        self.lane_s = lane_s_per_job(workload)
        weights = workload.weights
        total = sum(weights.get(w, 1.0) for w in workload.workflows)
        best = sum(weights.get(w, 1.0) * sim.best_s(w) for w in workload.workflows) / total
        self.slack_s = (options.max_slowdown - 1.0) * best
        self.rule = ScaleRule(
            options.rule or ScaleConfig(minimum=options.minimum, maximum=options.maximum)
        )
        ray = options.ray or RayServeConfig(minimum=options.minimum, maximum=options.maximum)
        self.ray = RayServeRule(ray, start=options.initial)
        self.live = LiveDesired(options.rule)
        self.replicator = Replicator(options.replicate)
        for i in range(n):
            sim.set_open(i, False)
        for i in range(options.initial):
            self._serve(i)

    def run(self, arrivals: Sequence[Arrival]) -> SimResult:
        self._last_arrival = max((a.t_s for a in arrivals), default=0.0)
        result = self.sim.run(arrivals)
        self._close_books()
        return result

    @property
    def now(self) -> float:
        return self.sim.now

    def _lanes(self, i: int) -> Lanes:
        return self.sim.workers[i].lanes

    # -- the engine's hooks --------------------------------------------------------------------

    def began(self) -> None:
        self.sim.schedule(0.0, self._control, None)

    def entry(self, arrival: Arrival) -> int:
        serving = [i for i, p in enumerate(self.phase) if p == "serving"]
        self._turn += 1
        self._recent.append((self.now, arrival.workflow))
        worker = self.sim.workers[serving[self._turn % len(serving)]]
        return int(worker.name[1:])

    def may_tick(self, index: int) -> bool:
        return self.phase[index] != "off"  # an off worker holds no GPU: nothing to warm

    def recorded(self, record: JobRecord) -> None:
        slowdown = record.slowdown
        self._done.append(
            (self.now, slowdown is not None and slowdown <= self.options.max_slowdown)
        )

    # -- phases --------------------------------------------------------------------------------

    def _on(self, i: int) -> None:
        if self.on_since[i] is None:
            self.on_since[i] = self.now

    def _off(self, i: int) -> None:
        since = self.on_since[i]
        if since is not None:
            self.worker_s += self.now - since
        self.on_since[i] = None
        self.phase[i] = "off"
        self.sim.set_open(i, False)

    def _serve(self, i: int) -> None:
        self._on(i)
        self.phase[i] = "serving"
        self.sim.set_open(i, True)

    def _start(self, i: int) -> None:
        """Worker ``i`` (off) starts cold: a fresh core and an empty cache."""
        self._on(i)
        self.phase[i] = "starting"
        self.starts += 1
        # a new process: a new instance in its job ids (the peers remember the old ones)
        self.sim.restart(i, f"r{self.starts}")
        self.sim.schedule(self.now + self.options.start_s, self._started, i)

    def _started(self, i: int) -> None:
        if self.phase[i] != "starting":
            return
        self.sim.apply(i, Tick(self.now))  # warms the cache from host memory: the hot models
        hot = self._hot_models()
        cache = self._lanes(i).cache
        nbytes = 0
        for model in sorted(hot, key=cache.size_bytes):
            size = cache.size_bytes(model)
            if nbytes + size <= cache.capacity_bytes():
                nbytes += size
        name = self.sim.workers[i].name
        self.sim.schedule(self.now + self.sim.profiles.fetch_s(name, nbytes), self._ready, i)

    def _ready(self, i: int) -> None:
        if self.phase[i] == "starting":
            self._serve(i)

    def _idle(self, i: int) -> bool:
        """Nothing to lose: no task queued or running, no partial inputs, no job it is the
        ingress of."""
        rules = self.sim.workers[i].rules
        assert rules is not None
        lanes = rules.lanes
        return not (
            lanes.busy
            or lanes.host_busy
            or len(lanes.queue)
            or len(lanes.host_queue)
            or len(rules.inbox)
            or rules.ingress.jobs
        )

    def _close_books(self) -> None:
        for i, since in enumerate(self.on_since):
            if since is not None:
                self.worker_s += self.now - since
                self.on_since[i] = self.now

    # -- the controller ------------------------------------------------------------------------

    def _hot_models(self) -> set[str]:
        since = self.now - self.options.long_s
        flows = {w for t, w in self._recent if t >= since}
        tasks = (self.workload.workflows[w].tasks.values() for w in flows)
        return {t.model for group in tasks for t in group if t.model is not None}

    def _rate(self, window_s: float) -> float:
        since = self.now - window_s
        count = sum(1 for t, _ in reversed(self._recent) if t >= since) if self._recent else 0
        return count / max(min(window_s, self.now), self.options.control_s)

    def _control(self, _: object) -> None:
        o = self.options
        now = self.now
        for i, p in enumerate(self.phase):
            if p == "draining" and self._idle(i):
                self._off(i)
            elif p == "off" and not self._idle(i):  # a task planned before its drain came late
                self._on(i)
                self.phase[i] = "draining"
        while self._recent and self._recent[0][0] < now - o.long_s:
            self._recent.popleft()
        while self._done and self._done[0][0] < now - o.attain_s:
            self._done.popleft()
        serving = [i for i, p in enumerate(self.phase) if p == "serving"]
        starting = [i for i, p in enumerate(self.phase) if p == "starting"]
        current = len(serving) + len(starting)
        if o.controller == "autoscale":
            attained = [ok for _, ok in self._done]
            signals = Signals(
                now=now,
                current=current,
                rate_short=self._rate(o.short_s),
                rate_long=self._rate(o.long_s),
                lane_s_per_job=self.lane_s,
                waits={0: [self._lanes(i).wait_s(now) for i in serving]},
                slack_s=self.slack_s,
                attainment=sum(attained) / len(attained) if len(attained) >= 20 else None,
                quantile=o.quantile,
                starting=len(starting),
            )
            desired = self.rule.decide(signals).desired
        elif o.controller == "live":
            seen = [
                Seen(self._lanes(i).wait_s(now), self._lanes(i).lanes,
                     self._lanes(i).busy)
                for i in serving
            ]  # fmt: skip
            wanted = self.live.update(now, seen).desired if not starting else current
            desired = min(max(wanted, o.minimum), o.maximum)
        elif o.controller == "ray-serve":
            ongoing = sum(len(self._lanes(i).queue) + self._lanes(i).busy for i in serving)
            self.ray.observe(now, ongoing)
            desired = self.ray.decide(now).desired
        else:
            desired = current
        if desired > current:
            self._grow(desired - current)
        elif desired < current:
            self._shrink(current - desired, serving, starting, o.controller == "autoscale")
        if o.replicate is not None:
            self._replicate()
        self.sizes.append(
            (
                now,
                sum(p == "serving" for p in self.phase),
                sum(p in ("starting", "draining") for p in self.phase),
            )
        )
        # stuck jobs (none expected) end the run an hour after the last arrival
        active = self.sim.has_jobs or any(p == "draining" for p in self.phase)
        if now < self._last_arrival or (active and now < self._last_arrival + 3600.0):
            self.sim.schedule(now + o.control_s, self._control, None)

    def _replicate(self) -> None:
        """Warm hot models on serving workers with headroom (:class:`Replicator`)."""
        serving = [i for i, p in enumerate(self.phase) if p == "serving"]
        self.replicas += replicate_round(self.sim, self.replicator, self.slack_s, serving)

    def _grow(self, count: int) -> None:
        # a draining worker is still warm: it serves again at once
        for i, p in enumerate(self.phase):
            if count and p == "draining":
                self._serve(i)
                count -= 1
        for i, p in enumerate(self.phase):
            if count and p == "off" and self._idle(i):
                self._start(i)
                count -= 1

    def _shrink(self, count: int, serving: list[int], starting: list[int], keep_hot: bool) -> None:
        for i in reversed(starting):  # a start not yet done is the cheapest to call off
            if count:
                self._off(i)
                count -= 1
        if not count:
            return
        now = self.now
        loads = [
            WorkerLoad(
                self.sim.workers[i].name,
                self._lanes(i).wait_s(now),
                self._lanes(i).cache.residency()[0],
            )
            for i in serving
        ]
        chosen, kept = pick_drain(loads, count, self._hot_models() if keep_hot else ())
        self.holds += len(kept) > 0
        for name in chosen:
            i = self.sim.positions[name]
            self.phase[i] = "draining"
            self.sim.set_open(i, False)
            self.drains += 1
