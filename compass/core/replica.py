"""A copy of a hot model loaded ahead of need: the worker core's side of hot-model replication
(:mod:`compass.elastic.replicate` decides which worker warms which model; sans-IO).

The copy is a speculative load (``Tick.hot``) and must never make this worker worse at what
it already does. It goes only into free slabs, or over models **colder than the one warmed**,
by what this worker knows of them:

- **queued demand**: never a model a running or queued task here needs, nor a pinned or
  loading one (the cache's ``allow_evict_needed=False`` plan);
- **recent use**: a model a task began with here, or that was warmed here, within the last
  ``cold_s`` seconds only if it is ``spare``: the rule's word that another worker holds it
  too and its holders queue less than the warmed model's
  (:func:`~compass.elastic.replicate.spare_models`). The model warmed is hot by the rule's
  measure (its holders queue for it now); a model this worker ran nothing of for ``cold_s``
  is colder, and so is one whose work another copy takes with less queueing; the only copy of
  a model in use, used here a moment ago, is not, whatever the local queue holds at this
  instant. A copy that would evict such a model is refused, not shrunk: the rule, which
  remembers what it asked for, asks another worker next round
  (:class:`~compass.elastic.replicate.Replicator`).

The eviction order stays the cache's own (least recently used first), so a refusal means no
plan of this cache could make room from cold models alone.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from compass.cache.policy import CacheCore, LoadPlan
from compass.errors import CompassError

__all__ = ["COLD_S", "recent_models", "replica_plan"]

#: seconds without a use after which a resident model may make room for a hot copy (the
#: rule's :attr:`~compass.elastic.replicate.ReplicaConfig.cold_s` default)
COLD_S = 10.0
_NEVER = float("-inf")


def recent_models(
    used: Mapping[str, float], upcoming: Sequence[str], now: float, window_s: float, limit: int
) -> frozenset[str]:
    """The models this worker is using: those its running and queued tasks need
    (``upcoming``), and those ``used`` (model -> when a task here last began with it, or it
    was last warmed here) shows used within ``window_s`` of ``now``; at most ``limit``, the
    queued first, then the most recently used. What it gossips as its ``recent`` models: the
    cluster's hot set is their union (:func:`compass.elastic.replicate.hot_models`)."""
    chosen: dict[str, None] = {}
    for model in upcoming:
        if len(chosen) == limit:
            return frozenset(chosen)
        chosen[model] = None
    lately = sorted(
        ((t, m) for m, t in used.items() if now - t < window_s and m not in chosen), reverse=True
    )
    chosen.update(dict.fromkeys(m for _, m in lately[: limit - len(chosen)]))
    return frozenset(chosen)


def replica_plan(
    cache: CacheCore,
    model: str,
    upcoming: Sequence[str],
    used: Mapping[str, float],
    now: float,
    cold_s: float = COLD_S,
    spare: Collection[str] = (),
) -> LoadPlan | None:
    """The plan that loads a copy of ``model`` here now, or None: it is resident, loading or
    unknown here, can never fit, or would evict a model that ``upcoming`` (the queue's models)
    needs, that is pinned or loading, or that is not ``spare`` and ``used`` (model -> when a
    task here last began with it, or it was last warmed here) shows used within ``cold_s`` of
    ``now``."""
    if model not in cache.models() or cache.is_resident(model) or cache.is_loading(model):
        return None
    try:
        plan = cache.plan_load(model, upcoming, allow_evict_needed=False)
    except CompassError:  # ModelTooLarge: it can never fit here
        return None
    if plan is None:
        return None
    for victim in plan.evict:
        if victim not in spare and now - used.get(victim, _NEVER) < cold_s:
            return None
    return plan
