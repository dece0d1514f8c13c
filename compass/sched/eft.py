"""The earliest-finish rule (EFT): where each task of a job would finish first.

The planner follows the paper (arXiv 2402.17652, section "Scheduling"): tasks in HEFT
upward-rank order; for each task and each worker ``w``::

    arrive(w) = max over predecessors p of finish(p) + transfer(out_p, worker(p) -> w)
                (a root: the job input's transfer from the ingress)
    fetch(w)  = h2d time of the task's model unless resident, loading, or brought to w by an
                earlier task of this plan; doubled when w's free cache bytes are fewer than the
                model's (the eviction penalty); infinite where the model exceeds w's cache
    start(w)  = max(now + wait(w), arrive(w)) + fetch(w);   finish(w) = start(w) + exec(w)

and the task goes to the smallest finish (ties: fewest bytes to move, then the ingress, then the
lowest index), after which that worker's availability becomes the finish and its free bytes
shrink by what was fetched. That rule is :func:`~compass.sched.cost.finish_row`, a handful of
numpy operations over all workers, and it is the only one: planning (:func:`plan_eft`),
dynamic adjustment and join placement (:mod:`compass.sched.planner`, :mod:`compass.sched.adjust`)
all rank workers by it, in absolute seconds on the caller's clock ``now``.

Batches (:attr:`FinishTerms.batches`): a task that batches (``Task.batch > 1``, with a curve
where a batch gains) may also join a batch of its model already queued on ``w``: when ``c``
such tasks wait there (``0 < c <`` the batch limit) and its input arrives before the first of
them is expected to start, at ``s``, it finishes with them::

    join(w)   = s + exec(w) * (scale(c + 1) + c * (scale(c + 1) - scale(c)))
    finish(w) = min(EFT(w), join(w))

(no fetch: the queued batch brings the model). The second term is what the join costs the
batch's ``c`` members (each ends that much later), so a join is taken only where it saves
more than it costs. It stays in the finish the task's successors are planned on, which
over-states when a joined task ends: splitting it into a rank term and a true finish was
measured worse at 1.5x the rate (docs/RESULTS.md, "Batching"), so the conservative finish
stays until a capacity study says otherwise. A plan counts its own tasks in those batches,
so two same-model tasks of one job see each other; so does adjustment, for the siblings it
places.

:class:`FinishTerms` says which terms an estimate counts (the ablations turn some off).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.errors import ModelTooLarge, WorkerUnavailable
from compass.sched.cost import BatchRows, WorkflowCosts, finish_row
from compass.sched.heartbeat import DEGRADED_WAIT_S
from compass.sched.policy import LARGE_CLUSTER, TIE_S, JobInfo
from compass.sched.snapshot import ViewSnapshot
from compass.sched.streamed import bound_end, first_step, stream_ready

__all__ = ["FinishTerms", "fewest_bytes", "finish_now", "plan_eft", "view_batches"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True)
class FinishTerms:
    """Which terms a finish estimate counts: ``load``, queue waits (off: every worker idle at
    ``now``); ``cache``, model fetches; ``host_lanes``, model-less tasks run off the GPU lanes,
    so they neither wait for a worker's queue nor add to it; ``batches``, joining a batch
    queued on a worker (only with ``load``: without queues there is no batch to join)."""

    load: bool = True
    cache: bool = True
    host_lanes: bool = False
    batches: bool = False


def plan_eft(
    job: JobInfo,
    view: ViewSnapshot,
    costs: WorkflowCosts,
    now: float,
    terms: FinishTerms = FinishTerms(),
) -> dict[str, str]:
    """Place every task of ``job`` at its earliest estimated finish (see the module docstring),
    counting the ``terms`` asked for. Raises :class:`WorkerUnavailable` on an empty view and
    :class:`ModelTooLarge` when a model fits in no worker's cache.
    """
    use_load, use_cache, host_lanes = terms.load, terms.cache, terms.host_lanes
    batch_aware = terms.batches
    n_workers = len(view.names)
    if n_workers == 0:
        raise WorkerUnavailable(f"no workers in the view to plan job {job.job_id!r} on")
    n_tasks = len(costs.preds)
    avail = view.wait_s + now if use_load else np.full(n_workers, now)
    free = view.free_bytes
    free_is_mine = False
    capacity = view.capacity_bytes
    min_capacity = view.min_capacity_bytes
    brought: dict[str, BoolArray] = {}
    placed = [0] * n_tasks
    finish = [0.0] * n_tasks
    ingress = view.positions.get(job.ingress, -1)
    from_ingress = (ingress,)
    at_now = (now,)
    preds_of = costs.preds
    batches = _PlanBatches(view, now) if batch_aware and use_load else None
    #: when each worker can start a task off its lanes (None: now, everywhere)
    off_lane = off_lane_avail(view, now) if host_lanes and use_load else None

    #: each task's first step's end, where a streamed edge starts its successor
    first = [0.0] * n_tasks if any(costs.streamed) else None
    for t in costs.rank_order:
        preds = preds_of[t]
        streamed = first is not None and costs.streamed[t]
        if preds:
            sources: Sequence[int] = [placed[p] for p in preds]
            ready: Sequence[float] = [finish[p] for p in preds]
            if streamed:
                assert first is not None
                ready = stream_ready(costs, t, finish, first)
            root_bytes = 0
        else:
            sources, ready = from_ingress, at_now
            root_bytes = job.input_bytes or costs.input_bytes[t]
        model = costs.models[t]
        on_lane = model is not None or not host_lanes
        have: BoolArray | None = None
        if use_cache and model is not None:
            have = brought.get(model)
            if have is None:
                have = view.holds(model)
        rows = None
        key = costs.batch_keys[t]
        if batches is not None and key is not None:
            rows = batches.rows(key)
        fetch = None if have is None else (have, free, capacity, min_capacity)
        starts = avail if on_lane else off_lane
        eft, joined = finish_row(costs, t, sources, ready, starts, fetch, root_bytes, rows)
        if streamed:
            bound_end(costs, t, sources, finish, eft)
        j = int(eft.argmin())
        best = float(eft[j])
        if best == math.inf:
            size = costs.model_bytes[t]
            raise ModelTooLarge(
                f"job {job.job_id!r}: model {model!r} of task {job.workflow.order[t]!r} "
                f"({size} B) fits in no worker's cache "
                f"(largest: {int(view.capacity_bytes.max())} B)",
                detail={"model": model, "bytes": size},
            )
        ties = (eft <= best + TIE_S).nonzero()[0]
        if len(ties) > 1:
            j = fewest_bytes(ties, costs, t, sources, ingress, root_bytes, have, ingress)
            best = float(eft[j])
        placed[t] = j
        finish[t] = best
        if first is not None:
            first[t] = first_step(costs, t, j, best)
        joins = joined is not None and float(joined[j]) <= finish[t]
        if joins:
            # the batch runs longer by this item: so does everything queued behind it
            assert rows is not None and key is not None and batches is not None
            scale = costs.batch_scales[t]
            assert scale is not None
            c = int(rows[0][j])
            extra = float(costs.exec_rows[t][j]) * float(scale[j, c + 1] - scale[j, c])
            avail[j] = max(float(avail[j]) + extra, finish[t])
            if costs.batch_shared[t]:
                batches.joined(key, j)
        else:
            if on_lane:
                avail[j] = finish[t]
            if batches is not None and costs.batch_shared[t]:
                assert key is not None
                limits = costs.batch_limits[t]
                assert limits is not None
                batches.opened(key, j, finish[t] - float(costs.exec_rows[t][j]), int(limits[j]))
        if have is not None and not have[j]:
            assert model is not None
            mine = have.copy()
            mine[j] = True
            brought[model] = mine
            if not joins:  # a joined batch brings the model itself
                if not free_is_mine:
                    free = free.copy()
                    free_is_mine = True
                free[j] -= costs.model_bytes[t]

    names = view.names
    order = job.workflow.order
    return {order[t]: names[placed[t]] for t in range(n_tasks)}


class _PlanBatches:
    """The batches one plan may join, per model: the view's (with absolute starts) plus the
    plan's own batchable tasks, copied on the plan's first change to a model's rows."""

    __slots__ = ("_mine", "_now", "_rows", "_view")

    def __init__(self, view: ViewSnapshot, now: float) -> None:
        self._view = view
        self._now = now
        self._rows: dict[str, BatchRows | None] = {}
        self._mine: set[str] = set()

    def rows(self, model: str) -> BatchRows | None:
        """``(counts, absolute start)`` of ``model``'s batches (None: none anywhere)."""
        if model not in self._rows:
            self._rows[model] = _absolute(self._view, model, self._now)
        return self._rows[model]

    def _own(self, model: str) -> BatchRows:
        rows = self.rows(model)
        if rows is None:
            n = len(self._view.names)
            rows = (np.zeros(n, dtype=np.int64), np.zeros(n))
        elif model not in self._mine:
            rows = (rows[0].copy(), rows[1])  # the starts are already this plan's own array
        self._mine.add(model)
        self._rows[model] = rows
        return rows

    def joined(self, model: str, j: int) -> None:
        """A task of the plan joined ``model``'s batch on worker ``j``."""
        self._own(model)[0][j] += 1

    def opened(self, model: str, j: int, start: float, limit: int) -> None:
        """A task of the plan queued on ``j`` without joining, to start at ``start``: it leads
        the next batch there, unless full batches of the model wait ahead of it (they would
        take it: not counted)."""
        rows = self.rows(model)
        if rows is not None and rows[0][j] >= limit:
            return
        counts, starts = self._own(model)
        counts[j] = 1
        starts[j] = start


def finish_now(
    costs: WorkflowCosts,
    job: JobInfo,
    t: int,
    plan: Mapping[str, str],
    view: ViewSnapshot,
    now: float,
    terms: FinishTerms = FinishTerms(),
) -> tuple[FloatArray, list[int], int, BoolArray | None]:
    """:func:`~compass.sched.cost.finish_row` of task ``t`` once a predecessor finished: each
    input ready at ``now`` on the worker ``plan`` names for its producer (a root's: the job's
    inputs, at the ingress), queues and models as ``view`` has them, counting ``terms``.

    Returns the finish row, the input sources (worker indices, -1 outside the view), the
    root's input bytes (0 unless ``t`` is a root) and where the model is (None: no fetch term).
    """
    preds = costs.preds[t]
    positions = view.positions
    if preds:
        order = job.workflow.order
        sources = [positions.get(plan.get(order[p], ""), -1) for p in preds]
        ready = [now] * len(preds)
        root_bytes = 0
    else:
        sources = [positions.get(job.ingress, -1)]
        ready = [now]
        root_bytes = job.input_bytes or costs.input_bytes[t]
    model = costs.models[t]
    on_lane = model is not None or not terms.host_lanes
    if not terms.load:
        avail = None
    elif on_lane:
        avail = view.wait_s + now
    else:
        avail = off_lane_avail(view, now)
    have = view.holds(model) if terms.cache and model is not None else None
    rows = view_batches(costs, t, view, now) if terms.batches and avail is not None else None
    fetch = None
    if have is not None:
        fetch = (have, view.free_bytes, view.capacity_bytes, view.min_capacity_bytes)
    eft, _ = finish_row(costs, t, sources, ready, avail, fetch, root_bytes, rows)
    return eft, sources, root_bytes, have


def off_lane_avail(view: ViewSnapshot, now: float) -> FloatArray | None:
    """When each worker of ``view`` can start a task off its GPU lanes (a model-less task on a
    host lane): now (None), except on a degraded worker, whose reported wait carries
    :data:`~compass.sched.heartbeat.DEGRADED_WAIT_S` (it starts no task at all)."""
    wait = view.wait_s
    # the reduction ndarray.max() calls, without its Python-level wrapper
    if not len(wait) or float(np.maximum.reduce(wait)) < DEGRADED_WAIT_S:
        return None
    return np.where(wait >= DEGRADED_WAIT_S, wait + now, now)


def view_batches(costs: WorkflowCosts, t: int, view: ViewSnapshot, now: float) -> BatchRows | None:
    """The batches of task ``t``'s model in ``view``, starts made absolute (None: ``t`` does
    not batch, or no worker has any)."""
    key = costs.batch_keys[t]
    return None if key is None else _absolute(view, key, now)


def _absolute(view: ViewSnapshot, model: str, now: float) -> BatchRows | None:
    """``model``'s queued batches in ``view``, their starts on the caller's clock."""
    found = view.batched(model)
    return None if found is None else (found[0], found[1] + now)


def fewest_bytes(
    ties: IntpArray,
    costs: WorkflowCosts,
    t: int,
    sources: Sequence[int],
    ingress: int,
    root_bytes: int,
    have: BoolArray | None,
    prefer: int,
) -> int:
    """Among tied workers, the one moving the fewest bytes (inputs plus a model fetch); then
    ``prefer`` if it is among them; then the lowest index, or, in a cluster of
    :data:`~compass.sched.policy.LARGE_CLUSTER` workers or more, the first at or after the
    ingress's index (wrapping around): there many ingresses plan on the same view between two
    heartbeats, and all taking the lowest index would pile their tasks onto one worker
    (measured: docs/RESULTS.md, "Simulator scale")."""
    if len(ties) > _FEW_TIES:
        return _fewest_bytes_array(ties, costs, t, sources, ingress, root_bytes, have, prefer)
    # a few ties (a bounded view shows about ten workers): a Python loop over them costs a
    # third of the vector operations, each a microsecond or so for a handful of items. The
    # bytes are summed in the same order, so they are the same floats
    tied: list[int] = ties.tolist()
    moved = [0.0] * len(tied)
    preds = costs.preds[t]
    if preds:
        out_bytes = costs.out_bytes
        for p, src in zip(preds, sources, strict=True):
            size = out_bytes[p]
            moved = [m + size * (w != src) for m, w in zip(moved, tied, strict=True)]
    elif root_bytes:
        size = float(root_bytes)
        moved = [m + size * (w != ingress) for m, w in zip(moved, tied, strict=True)]
    if have is not None:
        size = float(costs.model_bytes[t])
        held = have.tolist()
        moved = [m + size * (not held[w]) for m, w in zip(moved, tied, strict=True)]
    least = min(moved)
    keep = [w for m, w in zip(moved, tied, strict=True) if m <= least]
    if prefer >= 0 and prefer in keep:
        return prefer
    if ingress >= 0 and len(costs.exec_rows[t]) >= LARGE_CLUSTER:
        return keep[bisect_left(keep, ingress) % len(keep)]
    return keep[0]


#: above this many tied workers :func:`fewest_bytes` sums the bytes with vector operations
_FEW_TIES = 32


def _fewest_bytes_array(
    ties: IntpArray,
    costs: WorkflowCosts,
    t: int,
    sources: Sequence[int],
    ingress: int,
    root_bytes: int,
    have: BoolArray | None,
    prefer: int,
) -> int:
    """:func:`fewest_bytes` over many ties (a full view of a large cluster), as vectors."""
    moved = np.zeros(len(ties))
    preds = costs.preds[t]
    if preds:
        for p, src in zip(preds, sources, strict=True):
            moved += costs.out_bytes[p] * (ties != src)
    elif root_bytes:
        moved += float(root_bytes) * (ties != ingress)
    if have is not None:
        moved += float(costs.model_bytes[t]) * ~have[ties]
    keep = ties[moved <= moved.min()]
    if prefer >= 0 and bool((keep == prefer).any()):
        return prefer
    if ingress >= 0 and len(costs.exec_rows[t]) >= LARGE_CLUSTER:
        return int(keep[int(keep.searchsorted(ingress)) % len(keep)])
    return int(keep[0])
