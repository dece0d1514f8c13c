"""Hot models replicated ahead of need: which worker should warm which model, sans-IO.

The planner places a task where its cost is least: its queue, plus the model's load where the
model is not resident. When a model's work grows, the workers holding it queue up, and the
planner sends its tasks elsewhere only once their queues outweigh a load: the objective is
already bending then, and each such task still waits for its model. Vortex's anticipatory
preloading warms the model before that point; :func:`replicas_wanted` is that rule, fed what
every worker's view already holds (each worker's queue wait and the models it holds or loads):

1. **Hot**: a model that recent jobs used, whose holders' mean queue wait is above
   ``warm_fraction`` of the slack a job has within its objective. The elastic rule's pressure
   is the mean over *every* worker: a wave on one model raises its holders' waits well before
   the cluster's mean, so a copy is warmed before the cluster asks for another worker.
2. **Headroom**: a serving worker that does not hold it, whose queue wait is below
   ``headroom_fraction`` of the slack, and that is not loading a model.
3. **One copy per model per step**, the most pressed model first, each worker given at most
   one: the new copy's short queue lowers its holders' mean wait, so the next step asks for
   another only if the wave still rises.

The copy is made by the worker's own core (``Tick.hot``: a speculative load that evicts, by
the cache's own order, only models its queue does not need), and nothing pins it: the planner
sees it as any resident model and sends the model's tasks there because no load is due, and
once the wave passes and the copy goes unused, the cache's least-recently-used order evicts
it like any other. So the cache policy and the planner agree on it without a new state to
keep: a replica is an ordinary resident model. :func:`compass.elastic.rule.pick_drain` keeps
the same hot set from losing its last copy when the cluster shrinks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compass.errors import ConfigError

__all__ = ["Holding", "ReplicaConfig", "replicas_wanted"]


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The rule's thresholds, as fractions of the slack a job has within its objective."""

    #: measured (``compass bench replicas``; docs/RESULTS.md): 0.15 and 0.3 warmed copies
    #: that evicted models still in use as often as they helped
    warm_fraction: float = 0.5
    headroom_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 0 <= self.headroom_fraction < self.warm_fraction:
            raise ConfigError(
                f"need 0 <= headroom_fraction < warm_fraction, got "
                f"{self.headroom_fraction!r}, {self.warm_fraction!r}"
            )


@dataclass(frozen=True, slots=True)
class Holding:
    """A serving worker as the view shows it: its queue wait, the models it holds (resident
    or loading), and whether a load is under way there."""

    name: str
    wait_s: float
    models: frozenset[str]
    loading: bool = False


def replicas_wanted(
    workers: Sequence[Holding],
    hot: Iterable[str],
    slack_s: float,
    config: ReplicaConfig | None = None,
) -> list[tuple[str, str]]:
    """``(worker, model)`` pairs to warm now, the most pressed model first (module doc).
    ``hot``: the models recent jobs used; ``slack_s``: the queueing a job can take."""
    c = config or ReplicaConfig()
    pressed: list[tuple[float, str]] = []
    for model in sorted(set(hot)):
        waits = [w.wait_s for w in workers if model in w.models]
        if waits and sum(waits) / len(waits) > c.warm_fraction * slack_s:
            pressed.append((sum(waits) / len(waits), model))
    pressed.sort(key=lambda pair: (-pair[0], pair[1]))
    free = sorted(
        (w for w in workers if not w.loading and w.wait_s < c.headroom_fraction * slack_s),
        key=lambda w: (w.wait_s, len(w.models), w.name),
    )
    chosen: list[tuple[str, str]] = []
    for _, model in pressed:
        target = next((w for w in free if model not in w.models), None)
        if target is not None:
            chosen.append((target.name, model))
            free.remove(target)
    return chosen
