"""Planning over candidates: the workers a planner needs to see to place one job.

A full view (the mesh: every worker's load heard from every peer each heartbeat) costs each
worker O(N) per period. A bounded view shows a planner, for one job, only:

- the planner itself (its own state is exact; at the ingress it holds the job's inputs);
- the workers that hold the job's inputs: at the ingress, the ingress; when a task finishes,
  the workers of the job's current plan (a successor's other predecessors, and the planned
  workers the adjustment may keep);
- the workers that hold, or are loading, a model the job's workflow needs (residency changes
  rarely, so it is disseminated to all), or at most ``holders`` of them per model, sampled;
- ``k`` workers sampled from all the others: the power of k choices, so an idle worker
  without the model can still win on its load. A planner that says which workers it already
  watches (their load is fresh; another is known only as last heard) has them sampled first,
  all but ``explore`` of the ``k``, and the holders likewise.

:func:`pick` is the rule over worker indices (what the simulator's cluster state uses, to build
a snapshot over the candidates only); :func:`candidates` the same rule over a
:class:`~compass.sched.snapshot.ViewSnapshot`, by name (a worker holding a full view of
residency can use it, then :meth:`ViewSnapshot.subset`). Both are pure: the same view, scope
and generator state give the same workers.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow

__all__ = ["CandidateRule", "PlanScope", "candidates", "pick"]

BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class PlanScope:
    """Whom a snapshot is for: a job of ``workflow``, with ``keep`` (the planner and the
    workers holding the job's inputs) always in view. ``keep`` may name a worker twice: it is
    built on every snapshot, also for a view that ignores it, so it is not made a set."""

    workflow: Workflow
    keep: Collection[str]

    @property
    def models(self) -> tuple[str, ...]:
        """The models the job's workflow needs, sorted (a fixed order, so sampling is
        deterministic whatever the process's string hashing)."""
        return tuple(sorted(self.workflow.models))


@dataclass(frozen=True, slots=True)
class CandidateRule:
    """How many workers a bounded view shows beyond the planner and the input holders: ``k``
    sampled from the workers that are not otherwise candidates, and at most ``holders`` of
    the holders of each model the job needs (None: every holder)."""

    k: int
    holders: int | None = None
    #: with the workers the planner watches given (``fresh``), the sampled ``k`` are drawn
    #: from them first but for this many, and the sampled holders from them first (None:
    #: every worker alike)
    explore: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ConfigError(f"candidates: k must be an integer >= 0, got {self.k!r}")
        h = self.holders
        if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 1):
            raise ConfigError(f"candidates: holders must be an integer >= 1 or None, got {h!r}")
        e = self.explore
        if e is not None and (isinstance(e, bool) or not isinstance(e, int) or e < 0):
            raise ConfigError(f"candidates: explore must be an integer >= 0 or None, got {e!r}")


def pick(
    n: int,
    held: Sequence[BoolArray],
    keep: Iterable[int],
    rule: CandidateRule,
    rng: random.Random,
    fresh: BoolArray | None = None,
) -> IntpArray:
    """The candidates among workers ``0..n-1``, as sorted indices: every index of ``keep``;
    for each row of ``held`` (where one needed model is resident or loading, in a fixed model
    order), its holders, or with ``rule.holders`` as many as needed to have that many of them
    in view (those already kept count), sampled; then ``rule.k`` sampled from the workers not
    chosen yet (all of them when there are no more). With ``rule.explore`` set and ``fresh``
    given (per worker: whether the planner watches it), the sampled holders are drawn from
    the fresh ones first, and the ``k`` too but for ``rule.explore`` of them."""
    if _all_chosen(n, held, rule):  # no draw to make, fresh or not
        return np.arange(n, dtype=np.intp)
    # ``a.nonzero()[0]`` is ``np.flatnonzero(a)`` for these 1-d masks, without the Python
    # wrappers around it (about 60 bytecode instructions a call, most of what a small view's
    # pick cost)
    chosen = np.zeros(n, dtype=np.bool_)
    kept = list(keep)
    if kept:
        chosen[kept] = True
    cap = rule.holders
    for row in held:
        if cap is None:
            chosen |= row
            continue
        need = cap - int(np.count_nonzero(row & chosen))
        if need <= 0:
            continue
        more = (row & ~chosen).nonzero()[0]
        if len(more) > need:
            more = _sample(more, need, rng, fresh if rule.explore is not None else None, 0)
        chosen[more] = True
    if rule.k:
        rest = (~chosen).nonzero()[0]
        if len(rest) > rule.k:
            explore = rule.explore
            rest = _sample(rest, rule.k, rng, None if explore is None else fresh, explore or 0)
        chosen[rest] = True
    return chosen.nonzero()[0]


def _sample(
    pool: IntpArray, need: int, rng: random.Random, fresh: BoolArray | None, explore: int
) -> IntpArray:
    """``need`` of ``pool``, sampled; with ``fresh``, ``need - explore`` from its fresh
    workers (all of them if fewer), the rest from the others left."""
    if fresh is None:
        return pool[rng.sample(range(len(pool)), need)]
    at = np.flatnonzero(fresh[pool])  # where the fresh ones are in the pool
    take = min(len(at), max(need - explore, 0))
    if take < len(at):
        at = at[rng.sample(range(len(at)), take)]
    known = pool[at]
    left = np.ones(len(pool), dtype=np.bool_)
    left[at] = False
    others = pool[left]  # the explorers: any other (a fresh one too)
    rest = need - take
    if len(others) > rest:
        others = others[rng.sample(range(len(others)), rest)]
    return np.concatenate((known, others))


def candidates(
    view: ViewSnapshot,
    scope: PlanScope,
    rule: CandidateRule,
    rng: random.Random,
    fresh: Iterable[str] = (),
) -> tuple[str, ...]:
    """The workers of ``view`` a planner keeps for ``scope``'s job (:func:`pick` by name,
    sorted; names of ``scope.keep`` missing from the view are left out); ``fresh``: the
    workers it watches (names not in the view are ignored)."""
    held = [view.holds(m) for m in scope.models]
    names = view.names
    if _all_chosen(len(names), held, rule):
        return names
    positions = view.positions
    keep = [positions[w] for w in scope.keep if w in positions]
    mask = None
    if rule.explore is not None:
        mask = np.zeros(len(names), dtype=np.bool_)
        mask[[positions[w] for w in fresh if w in positions]] = True
    return tuple([names[i] for i in pick(len(names), held, keep, rule, rng, mask).tolist()])


def _all_chosen(n: int, held: Sequence[BoolArray], rule: CandidateRule) -> bool:
    """Whether :func:`pick` would choose all ``n`` workers without a draw: ``rule.k`` takes
    every worker left, and no model has more holders than ``rule.holders``. The common case
    in a small cluster, answered without building the masks (the same workers, the
    generator untouched)."""
    if n > rule.k:
        return False
    cap = rule.holders
    return cap is None or all(int(np.count_nonzero(row)) <= cap for row in held)
