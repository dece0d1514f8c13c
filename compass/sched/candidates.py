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
from compass.records import record
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow

__all__ = ["CandidateRule", "PlanScope", "candidates", "pick"]

BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]


# made for every plan and adjustment: a record, frozen by convention (:mod:`compass.records`)
@record
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
        return self.workflow.model_order


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
    # One n-long mask of the workers chosen: each step is a few whole-array operations (about
    # a microsecond each at a thousand workers), and each draw is made from a pool's size
    # alone, the workers it names looked up afterwards, instead of Python loops over the
    # watched workers (a hundred or more in a busy cluster) and a list of positions for each.
    chosen = np.zeros(n, dtype=np.bool_)
    for i in keep:  # a handful: faster one by one than as an index array
        chosen[i] = True
    cap = rule.holders
    watched = None if rule.explore is None else fresh
    for row in held:
        if cap is None:
            chosen |= row
            continue
        need = cap - int(np.count_nonzero(row & chosen))
        if need > 0:
            _draw(chosen, row & ~chosen, watched, need, 0, rng)
    if rule.k:
        _draw(chosen, ~chosen, watched, rule.k, rule.explore or 0, rng)
    return chosen.nonzero()[0]


def _draw(
    chosen: BoolArray,
    pool: BoolArray,
    fresh: BoolArray | None,
    need: int,
    explore: int,
    rng: random.Random,
) -> None:
    """Adds to ``chosen`` ``need`` workers of ``pool`` (workers not chosen yet), sampled, or
    all of them if there are no more; with ``fresh``, ``need - explore`` of the pool's fresh
    ones (all if fewer), then the rest from the pool's others left (fresh or not). A sample
    is of positions among those it is drawn from, in worker order."""
    size = int(np.count_nonzero(pool))
    if size <= need:
        chosen |= pool
        return
    if fresh is None:
        _mark(chosen, pool.nonzero()[0], rng.sample(range(size), need))
        return
    known = (pool & fresh).nonzero()[0].tolist()
    take = min(len(known), max(need - explore, 0))
    # the same draws as sampling their positions (a sample of a list picks its items at the
    # positions a sample of its range draws), without indexing an array by a list
    for worker in rng.sample(known, take) if take < len(known) else known:
        chosen[worker] = True
    if need > take:  # from the pool less the fresh ones taken: more than that left (size > need)
        left = (pool & ~chosen).nonzero()[0]
        _mark(chosen, left, rng.sample(range(size - take), need - take))


def _mark(chosen: BoolArray, pool: IntpArray, positions: list[int]) -> None:
    """Marks chosen the workers at ``positions`` of ``pool`` (a few: one by one)."""
    for i in positions:
        chosen[pool[i]] = True


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
