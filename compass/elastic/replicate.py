"""Hot models replicated ahead of need: which worker should warm which model, sans-IO.

The planner places a task where its cost is least: its queue, plus the model's load where the
model is not resident. When a model's work grows, the workers holding it queue up, and the
planner sends its tasks elsewhere only once their queues outweigh a load: the objective is
already bending then, and each such task still waits for its model. Vortex's anticipatory
preloading warms the model before that point; :func:`replicas_wanted` is that rule, fed what
every worker's view already holds (each worker's queue wait and the models it holds or loads):

1. **Hot**: a model some worker uses (:func:`hot_models`: its running or queued tasks need
   it, or a task began with it there within ``cold_s``), whose holders' mean queue wait is above
   ``warm_fraction`` of the slack a job has within its objective. The elastic rule's pressure
   is the mean over *every* worker: a wave on one model raises its holders' waits well before
   the cluster's mean, so a copy is warmed before the cluster asks for another worker.
2. **Headroom**: a serving worker that does not hold it, whose queue wait is below
   ``headroom_fraction`` of the slack, and that is not loading a model.
3. **One copy per model per step**, the most pressed model first, each worker given at most
   one: the new copy's short queue lowers its holders' mean wait, so the next step asks for
   another only if the wave still rises.

The copy is made by the worker's own core (``Tick.hot``, :mod:`compass.core.replica`): a
speculative load into free slabs, or over models colder than the one warmed, never over one
its queue needs, nor over one a task used there within ``cold_s`` unless :func:`spare_models`
names it (another worker holds it too, and its holders queue less than the warmed model's).
Where the copy must evict the only copy of a model in use, it would only move the queue from
one model to the other: refused. Nothing
pins the copy: the planner sees it as any resident model and sends the model's tasks there
because no load is due, and once the wave passes and the copy goes unused, the cache's
least-recently-used order evicts it like any other. So the cache policy and the planner agree
on it without a new state to keep: a replica is an ordinary resident model.
:func:`compass.elastic.rule.pick_drain` keeps the same hot set from losing its last copy when
the cluster shrinks.

:class:`Replicator` is the rule with a memory, what the simulator and a real worker run: a
**cool-down** of ``cooldown_s`` per worker and model. A worker it asked to warm a model (its
core loaded it, or declined), or that dropped a model since the last round (evicted, by a copy
or by the planner's own load), is not asked to warm that model again within the window: the
next worker with headroom is. So a wave that passes leaves its copies to go cold, and two
models short of room do not take turns evicting each other on the same worker.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from compass.core.replica import COLD_S
from compass.errors import ConfigError

__all__ = [
    "MAX_SLOWDOWN",
    "REPLICATE_EVERY_S",
    "Holding",
    "ReplicaConfig",
    "Replicator",
    "hot_models",
    "objective_slack_s",
    "replicas_wanted",
    "spare_models",
]

#: seconds of a worker's clock between two rounds of the rule, on a real worker and in the
#: simulator (``compass sim``; the elastic simulator's ``control_s``)
REPLICATE_EVERY_S = 2.0
#: the objective a job's slack is counted against: p95 within 3x a job's best time (the
#: elastic rule's and the benchmarks')
MAX_SLOWDOWN = 3.0


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The rule's thresholds, as fractions of the slack a job has within its objective."""

    #: measured (``compass bench replicas``; docs/RESULTS.md): 0.15 and 0.3 warmed copies
    #: that evicted models still in use as often as they helped
    warm_fraction: float = 0.5
    headroom_fraction: float = 0.1
    #: seconds a worker is not asked again to warm a model it was asked to warm, or dropped
    #: (:class:`Replicator`)
    cooldown_s: float = 30.0
    #: a copy evicts only models unused on its worker for this long (:mod:`compass.core.replica`);
    #: a model some worker used within it is hot (:func:`hot_models`)
    cold_s: float = COLD_S

    def __post_init__(self) -> None:
        if not 0 <= self.headroom_fraction < self.warm_fraction:
            raise ConfigError(
                f"need 0 <= headroom_fraction < warm_fraction, got "
                f"{self.headroom_fraction!r}, {self.warm_fraction!r}"
            )
        if not (self.cooldown_s >= 0 and self.cold_s >= 0):
            raise ConfigError(
                f"need cooldown_s >= 0 and cold_s >= 0, got {self.cooldown_s!r}, {self.cold_s!r}"
            )


@dataclass(frozen=True, slots=True)
class Holding:
    """A serving worker as the view shows it: its queue wait, the models it holds (resident
    or loading), whether a load is under way there, and the models it uses (``recent``: its
    running and queued tasks need them, or a task began with one there within ``cold_s``)."""

    name: str
    wait_s: float
    models: frozenset[str]
    loading: bool = False
    recent: frozenset[str] = frozenset()


def hot_models(workers: Iterable[Holding]) -> frozenset[str]:
    """The models the cluster uses now: every worker's ``recent`` models. A model held but
    unused is not hot, however long its holders queue for other models: a copy of it would
    take no work off them. The simulator and a real worker read the hot set this way."""
    return frozenset().union(*(w.recent for w in workers))


def objective_slack_s(best_times_s: Sequence[float]) -> float:
    """The queueing a job can take within its objective (:data:`MAX_SLOWDOWN` times its best
    time), averaged over workflows of ``best_times_s``, every workflow weighed alike (a real
    worker and ``compass sim``; the elastic simulator weighs them by the workload's mix)."""
    return (MAX_SLOWDOWN - 1.0) * sum(best_times_s) / max(1, len(best_times_s))


def replicas_wanted(
    workers: Sequence[Holding],
    hot: Iterable[str],
    slack_s: float,
    config: ReplicaConfig | None = None,
    skip: Collection[tuple[str, str]] = (),
) -> list[tuple[str, str]]:
    """``(worker, model)`` pairs to warm now, the most pressed model first (module doc).
    ``hot``: the models in use (:func:`hot_models`); ``slack_s``: the queueing a job can
    take; ``skip``: pairs not to ask for (cooling down: :class:`Replicator`)."""
    c = config or ReplicaConfig()
    pressed: list[tuple[float, str]] = []
    for model in sorted(set(hot)):
        wait_s = _holders_wait_s(workers, model)
        if wait_s is not None and wait_s > c.warm_fraction * slack_s:
            pressed.append((wait_s, model))
    pressed.sort(key=lambda pair: (-pair[0], pair[1]))
    free = sorted(
        (w for w in workers if not w.loading and w.wait_s < c.headroom_fraction * slack_s),
        key=lambda w: (w.wait_s, len(w.models), w.name),
    )
    chosen: list[tuple[str, str]] = []
    for _, model in pressed:
        target = next(
            (w for w in free if model not in w.models and (w.name, model) not in skip), None
        )
        if target is not None:
            chosen.append((target.name, model))
            free.remove(target)
    return chosen


def spare_models(workers: Sequence[Holding], worker: str, model: str) -> frozenset[str]:
    """The models ``worker`` holds that a copy of ``model`` there may evict though a task used
    them there lately: those another worker holds too, whose holders' mean queue wait is below
    ``model``'s holders' (colder by the view: their work has another copy and queues less)."""

    def pressure(name: str) -> float:
        wait_s = _holders_wait_s(workers, name)
        return 0.0 if wait_s is None else wait_s

    target = next((w for w in workers if w.name == worker), None)
    if target is None:
        return frozenset()
    hot = pressure(model)
    return frozenset(
        m
        for m in target.models
        if m != model
        and any(m in w.models for w in workers if w.name != worker)
        and pressure(m) < hot
    )


def _holders_wait_s(workers: Sequence[Holding], model: str) -> float | None:
    """The mean queue wait of the workers that hold ``model`` (None: none holds it): the
    pressure on it."""
    waits = [w.wait_s for w in workers if model in w.models]
    return sum(waits) / len(waits) if waits else None


class Replicator:
    """:func:`replicas_wanted` with a memory: a cool-down per worker and model (module doc).

    Fed each round every serving worker's :class:`Holding`; it remembers, for ``cooldown_s``,
    the pairs it asked for and the models each worker dropped since the round before. Bounded:
    a pair is forgotten once its window ends, and only the workers of the last round are kept.
    Every worker running it over the same view remembers the same pairs."""

    def __init__(self, config: ReplicaConfig | None = None) -> None:
        self.config = config or ReplicaConfig()
        #: (worker, model) -> when it was asked to warm, or dropped, the model
        self.cooling: dict[tuple[str, str], float] = {}
        self._held: dict[str, frozenset[str]] = {}

    def step(
        self, now: float, workers: Sequence[Holding], hot: Iterable[str], slack_s: float
    ) -> list[tuple[str, str]]:
        """The ``(worker, model)`` pairs to warm at ``now``, none cooling down."""
        window = self.config.cooldown_s
        cooling = {pair: t for pair, t in self.cooling.items() if now - t < window}
        held: dict[str, frozenset[str]] = {}
        for w in workers:
            held[w.name] = w.models
            for model in self._held.get(w.name, frozenset()) - w.models:
                cooling[(w.name, model)] = now  # dropped since the last round
        self._held = held
        chosen = replicas_wanted(workers, hot, slack_s, self.config, skip=cooling)
        for pair in chosen:
            cooling[pair] = now
        self.cooling = cooling
        return chosen
