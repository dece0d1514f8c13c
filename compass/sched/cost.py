"""Cost tables, and the one rule every placement decision uses: where a task would finish.

A :class:`WorkflowCosts` turns a workflow, the current :class:`~compass.workflow.Profiles` and
a worker list into flat Python tuples and numpy rows: the task order by upward rank,
predecessor indices, per-task execution-time rows over the workers, model fetch rows, and a
:class:`TransferModel` that gives a whole row of transfer times in one or two vector
operations. It does not depend on the job or on queue state, so :class:`CostCache` reuses it
until the profiles change (their version counters say when) or the worker list does.

:func:`finish_row` is the finish-time rule (the paper's EST/EFT) over every worker at once, in
absolute seconds on the caller's clock; planning, dynamic adjustment and join placement
(:mod:`compass.sched.planner`) all rank workers by it. Given the queued batches of the task's
model (:func:`join_row`), it also counts joining one: a batchable task whose input arrives
before a queued batch of its model starts, where that batch has room, finishes with the batch,
its marginal cost instead of the whole queue's wait.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Task, Workflow, batch_key, batch_limit, batch_scale
from compass.workflow.profile import Profiles

__all__ = [
    "BatchRows",
    "CacheRows",
    "CostCache",
    "TransferModel",
    "WorkflowCosts",
    "fetch_row",
    "finish_row",
    "join_row",
]

_T = TypeVar("_T", "TransferModel", "WorkflowCosts")

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
IntpArray = npt.NDArray[np.intp]

#: a model's queued batches over the workers: (tasks queued that may batch, absolute expected
#: start of the first of them)
BatchRows = tuple[IntArray, FloatArray]
#: the caches over the workers as a model fetch reads them (:func:`fetch_row`'s arguments):
#: where the task's model is or is coming, free bytes, capacity bytes, the least capacity
CacheRows = tuple[BoolArray, IntArray, IntArray, int]


class TransferModel:
    """Transfer times from one worker to every worker of ``names``, as numpy rows.

    ``row(src, nbytes, base)`` is ``base + transfer_s(names[src], w, nbytes)`` for every ``w``,
    with exactly ``base`` at ``src`` itself; ``src = -1`` means a sender outside ``names``.
    It matches :meth:`Profiles.transfer_s` term for term.
    """

    __slots__ = (
        "_d2h_default_inv",
        "_fixed",
        "_inv_d2h",
        "_inv_h2d",
        "_inv_net",
        "_link_rows",
        "_names",
        "_per_byte",
        "_profiles",
        "n_workers",
        "uniform",
    )

    def __init__(self, profiles: Profiles, names: tuple[str, ...]) -> None:
        self._profiles = profiles
        self._names = names
        self.n_workers = len(names)
        self._fixed = profiles.net_fixed_s
        self._inv_net = 1.0 / profiles.net_bytes_per_s
        inv_h2d = profiles.h2d_inverse(names) if profiles.staged else 0.0
        inv_d2h = profiles.d2h_inverse(names) if profiles.staged else 0.0
        self._inv_h2d = inv_h2d
        self._inv_d2h = inv_d2h
        self._d2h_default_inv = 1.0 / profiles.default_d2h_bytes_per_s if profiles.staged else 0.0
        self.uniform = (
            isinstance(inv_h2d, float) and isinstance(inv_d2h, float) and not profiles.has_links
        )
        # seconds per byte on the default path, all terms: the fast path of row()
        self._per_byte = self._inv_net + (float(inv_h2d) + float(inv_d2h) if self.uniform else 0.0)
        self._link_rows: dict[int, tuple[FloatArray | float, FloatArray | float]] = {}

    def take(self, index: IntpArray, names: tuple[str, ...]) -> TransferModel:
        """The same model over the workers at positions ``index`` of this one's (``names``)."""
        out = _shallow(self)
        out._names = names
        out.n_workers = len(names)
        if isinstance(self._inv_h2d, np.ndarray):
            out._inv_h2d = self._inv_h2d[index]
        if isinstance(self._inv_d2h, np.ndarray):
            out._inv_d2h = self._inv_d2h[index]
        out._link_rows = {}  # rows by sender position: positions differ here
        return out

    def mean_s(self, nbytes: float) -> float:
        """Transfer time on the default path (for ranks, which need one number per edge)."""
        inv_h2d = float(np.mean(self._inv_h2d)) if self.n_workers else 0.0
        inv_d2h = float(np.mean(self._inv_d2h)) if self.n_workers else 0.0
        return self._fixed + nbytes * (self._inv_net + inv_h2d + inv_d2h)

    def _net_row(self, src: int) -> tuple[FloatArray | float, FloatArray | float]:
        """``(fixed, seconds per byte)`` of the network from ``src``, per destination."""
        found = self._link_rows.get(src)
        if found is not None:
            return found
        links = self._profiles.links_from(self._names[src]) if src >= 0 else {}
        if not links:
            result: tuple[FloatArray | float, FloatArray | float] = (self._fixed, self._inv_net)
        else:
            fixed = np.full(self.n_workers, self._fixed)
            inv = np.full(self.n_workers, self._inv_net)
            for dst, (bps, fix) in links.items():
                # a link to a worker outside this view is irrelevant here
                j = _position(self._names, dst)
                if j >= 0:
                    fixed[j] = fix
                    inv[j] = 1.0 / bps
            result = (fixed, inv)
        self._link_rows[src] = result
        return result

    def row(self, src: int, nbytes: float, base: float) -> FloatArray:
        """``base`` + seconds to move ``nbytes`` from worker ``src`` to each worker."""
        if self.uniform:
            out = _filled(self.n_workers, float(base + self._fixed + nbytes * self._per_byte))
        else:
            fixed, inv_net = self._net_row(src)
            if src < 0:
                d2h = self._d2h_default_inv
            elif isinstance(self._inv_d2h, float):
                d2h = self._inv_d2h
            else:
                d2h = float(self._inv_d2h[src])
            seconds = (base + fixed) + nbytes * (inv_net + d2h + self._inv_h2d)
            if isinstance(seconds, np.ndarray):
                out = seconds
            else:
                out = _filled(self.n_workers, float(seconds))
        if src >= 0:
            out[src] = base
        return out


def _shallow(obj: _T) -> _T:
    """A copy of ``obj`` sharing its fields: :func:`copy.copy` by slot names, without the
    pickling protocol (``copy.copy`` of a slotted object reduces and rebuilds it, three times
    as slow: a bounded view takes a table per plan)."""
    out = object.__new__(type(obj))
    for name in type(obj).__slots__:
        setattr(out, name, getattr(obj, name))
    return out


def _filled(n: int, value: float) -> FloatArray:
    """``np.full(n, value)`` for a float, without its Python-level wrapper (a plan fills a
    row per predecessor of every task)."""
    out = np.empty(n)
    out.fill(value)
    return out


def _position(names: tuple[str, ...], name: str) -> int:
    try:
        return names.index(name)
    except ValueError:
        return -1


class WorkflowCosts:
    """Everything job-independent the planner needs for ``workflow`` over ``names``.

    Tasks are referred to by their position in ``workflow.order``. A task that batches on
    some worker has ``batch_limits[t]`` (the largest batch worth forming on each worker, 1
    where its curve gains nothing: :func:`~compass.workflow.dag.batch_limit`) and
    ``batch_scales[t]`` (row ``w``, column ``k``: a batch of ``k`` costs that many single runs
    on worker ``w``); None for the others. ``batch_shared[t]``: another batchable task of the
    workflow has its model, so one plan may batch them together.
    """

    __slots__ = (
        "batch_keys",
        "batch_limits",
        "batch_scales",
        "batch_shared",
        "edge_bytes",
        "exec_rows",
        "fetch2_rows",
        "fetch_rows",
        "input_bytes",
        "is_join",
        "links_version",
        "max_model_bytes",
        "model_bytes",
        "models",
        "names",
        "out_bytes",
        "preds",
        "profiles",
        "rank",
        "rank_order",
        "step_frac",
        "streamed",
        "transfer",
        "wf_version",
        "workflow",
    )

    def __init__(self, workflow: Workflow, profiles: Profiles, names: tuple[str, ...]) -> None:
        profiles.add_workflow(workflow)
        self.workflow = workflow
        self.profiles = profiles
        self.names = names
        self.wf_version = profiles.workflow_version(workflow.name)
        self.links_version = profiles.links_version
        order = workflow.order
        index = workflow.index
        tasks = [workflow.tasks[t] for t in order]
        self.preds: tuple[tuple[int, ...], ...] = tuple(
            tuple(index[p] for p in task.after) for task in tasks
        )
        self.is_join = tuple(len(p) >= 2 for p in self.preds)
        self.models: tuple[str | None, ...] = tuple(task.model for task in tasks)
        self.model_bytes: tuple[int, ...] = tuple(
            0 if task.model is None else profiles.model_bytes(task.model) for task in tasks
        )
        self.max_model_bytes = max(self.model_bytes)
        self.input_bytes: tuple[int, ...] = tuple(task.profile.input_bytes for task in tasks)
        self.out_bytes: tuple[float, ...] = tuple(
            float(b) for b in profiles.output_vector(workflow.name)
        )
        self._edges(tasks, index)
        exec_matrix = profiles.exec_matrix(workflow.name, names)
        self.exec_rows: tuple[FloatArray, ...] = tuple(exec_matrix)
        inv_h2d = profiles.h2d_inverse(names)
        fetch: list[FloatArray | None] = []
        fetch2: list[FloatArray | None] = []
        for size in self.model_bytes:
            if size == 0:
                fetch.append(None)
                fetch2.append(None)
                continue
            row = np.broadcast_to(np.asarray(size * inv_h2d, dtype=np.float64), (len(names),))
            fetch.append(np.ascontiguousarray(row))
            # the paper's eviction penalty: a fetch that must first evict counts twice
            fetch2.append(2.0 * row)
        self.fetch_rows: tuple[FloatArray | None, ...] = tuple(fetch)
        self.fetch2_rows: tuple[FloatArray | None, ...] = tuple(fetch2)
        self.transfer = TransferModel(profiles, names)
        self.rank, self.rank_order = self._ranks(exec_matrix)
        limits: list[IntArray | None] = []
        scales: list[FloatArray | None] = []
        for task in tasks:
            curves = (
                [profiles.batch_scale(workflow.name, task.name, w) for w in names]
                if task.batch > 1
                else []
            )
            limit = np.array([batch_limit(c, task.batch) for c in curves], dtype=np.int64)
            if not curves or int(limit.max()) <= 1:
                limits.append(None)
                scales.append(None)
                continue
            # columns 0..max limit + 1: a join adds one item to fewer than the limit
            size = int(limit.max()) + 2
            table = np.array(
                [[batch_scale(c, k) if k else 0.0 for k in range(size)] for c in curves]
            )
            limits.append(limit)
            scales.append(table)
        self.batch_limits: tuple[IntArray | None, ...] = tuple(limits)
        self.batch_scales: tuple[FloatArray | None, ...] = tuple(scales)
        #: what each batchable task's batches are counted under (its model, or its model's
        #: step batches: :func:`batch_key`); None where it never batches
        self.batch_keys: tuple[str | None, ...] = tuple(
            None if lim is None or task.model is None else batch_key(task.model, task.profile.steps)
            for task, lim in zip(tasks, limits, strict=True)
        )
        keys = [k for k in self.batch_keys if k is not None]
        self.batch_shared: tuple[bool, ...] = tuple(
            k is not None and keys.count(k) > 1 for k in self.batch_keys
        )

    def _edges(self, tasks: Sequence[Task], index: Mapping[str, int]) -> None:
        """What each edge carries: ``edge_bytes[t][k]``, the bytes from the ``k``-th
        predecessor of ``t`` (its output; one step's share of it on a streamed edge, whose
        cost counts per chunk); ``streamed[t]``, the ``k`` of its streamed predecessors;
        ``step_frac[t]``, one step's share of ``t``'s time (1 for a plain task)."""
        self.step_frac: tuple[float, ...] = tuple(1.0 / task.profile.steps for task in tasks)
        self.streamed: tuple[tuple[int, ...], ...] = tuple(
            tuple(k for k, p in enumerate(task.after) if p in task.streamed) for task in tasks
        )
        out = self.out_bytes
        self.edge_bytes: tuple[tuple[float, ...], ...] = tuple(
            tuple(
                out[index[p]] / tasks[index[p]].profile.steps if p in task.streamed
                else out[index[p]]
                for p in task.after
            )
            for task in tasks
        )  # fmt: skip

    def take(self, index: IntpArray, names: tuple[str, ...]) -> WorkflowCosts:
        """This table over the workers at positions ``index`` of its own (``names``), without
        recomputing anything: every row indexed down. The ranks, and so the task order, stay
        those over all of this table's workers (a job's task order does not depend on which
        workers a bounded view sampled)."""
        out = _shallow(self)
        out.names = names
        out.exec_rows = tuple(row[index] for row in self.exec_rows)
        out.fetch_rows = tuple(None if row is None else row[index] for row in self.fetch_rows)
        out.fetch2_rows = tuple(None if row is None else row[index] for row in self.fetch2_rows)
        out.transfer = self.transfer.take(index, names)
        out.batch_limits = tuple(None if row is None else row[index] for row in self.batch_limits)
        out.batch_scales = tuple(None if row is None else row[index] for row in self.batch_scales)
        return out

    def _ranks(self, exec_matrix: FloatArray) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """HEFT upward ranks from the current estimates (mean over workers), and the task
        order by decreasing rank (ties: topological position, so predecessors come first)."""
        n = len(self.preds)
        mean_exec = exec_matrix.mean(axis=1) if exec_matrix.shape[1] else np.zeros(n)
        succs: list[list[int]] = [[] for _ in range(n)]
        for t, preds in enumerate(self.preds):
            for p in preds:
                succs[p].append(t)
        rank = [0.0] * n
        for t in reversed(range(n)):
            xfer = self.transfer.mean_s(self.out_bytes[t])
            rank[t] = float(mean_exec[t]) + max((xfer + rank[s] for s in succs[t]), default=0.0)
        # a predecessor's rank exceeds its successor's (exec >= 0 and xfer >= 0); when exec and
        # xfer are both zero the ranks tie and the topological position keeps the order valid
        order = tuple(sorted(range(n), key=lambda t: (-rank[t], t)))
        return tuple(rank), order


class CostCache:
    """One :class:`WorkflowCosts` per workflow, rebuilt when the profiles or workers change."""

    __slots__ = ("_entries", "_taken")

    def __init__(self) -> None:
        self._entries: dict[str, WorkflowCosts] = {}
        #: per workflow, the last table indexed down to a view that shows some of its members
        self._taken: dict[str, tuple[WorkflowCosts, WorkflowCosts]] = {}

    def for_view(self, workflow: Workflow, profiles: Profiles, view: ViewSnapshot) -> WorkflowCosts:
        """The cost table of ``workflow`` over ``view``'s workers: :meth:`get`, or for a view
        that shows only some of its members (a bounded view), the table over all the members
        indexed down to them (:meth:`WorkflowCosts.take`), so a job planned over a few sampled
        workers costs no table of its own."""
        members = view.members
        if members is None:
            return self.get(workflow, profiles, view.names)
        full = self.get(workflow, profiles, members.names)
        last = self._taken.get(workflow.name)
        if last is not None and last[0] is full and last[1].names == view.names:
            return last[1]
        taken = full.take(members.index, view.names)
        self._taken[workflow.name] = (full, taken)
        return taken

    def get(self, workflow: Workflow, profiles: Profiles, names: tuple[str, ...]) -> WorkflowCosts:
        """The cost table of ``workflow`` over ``names`` under the current ``profiles``."""
        entry = self._entries.get(workflow.name)
        if (
            entry is not None
            and entry.workflow is workflow
            and entry.profiles is profiles
            and (entry.names is names or entry.names == names)
            and entry.links_version == profiles.links_version
            and entry.wf_version == profiles.workflow_version(workflow.name)
        ):
            return entry
        entry = WorkflowCosts(workflow, profiles, names)
        self._entries[workflow.name] = entry
        return entry


def finish_row(
    costs: WorkflowCosts,
    t: int,
    sources: Sequence[int],
    ready: Sequence[float],
    avail: FloatArray | None,
    fetch: CacheRows | None,
    input_bytes: int = 0,
    batches: BatchRows | None = None,
) -> tuple[FloatArray, FloatArray | None]:
    """When task ``t`` would finish on each worker, in absolute seconds (a fresh array), and
    the :func:`join_row` that took into account (None: joining a batch is possible nowhere), so
    a caller knows where the task would join one::

        arrive(w) = max over predecessors p of ready(p) + transfer(out_p, sources(p) -> w)
        EST(w)    = max(avail(w), arrive(w)) + fetch(w);   EFT(w) = EST(w) + exec(w)
        finish(w) = min(EFT(w), join(w))   (join: :func:`join_row`, given ``batches``)

    ``sources[k]`` and ``ready[k]`` are the worker index (-1: outside the view) holding the
    output of the ``k``-th predecessor (``costs.preds[t]`` order) and the time it is there; a
    root has one input instead, the job's ``input_bytes`` held at ``sources[0]`` (the ingress)
    from ``ready[0]``. On a streamed edge ``out_p`` is one step's share and ``ready(p)`` when
    its first step is (:mod:`compass.sched.streamed` bounds the end). ``avail``: when each
    worker's lane frees (None: the task does not queue, or load is ignored). ``fetch``:
    :func:`fetch_row`'s ``(have, free, capacity, min_capacity)``, where the task's model is,
    or is coming (no fetch there), and the caches that price the fetch elsewhere (None: no
    fetch term, for a model-less task or a planner blind to the cache). ``batches``: the
    queued batches of the task's model (None: batch-blind, or none queued).
    """
    row = costs.transfer.row
    preds = costs.preds[t]
    if preds:
        edge_bytes = costs.edge_bytes[t]  # a predecessor's output, or a streamed step's
        arrive = row(sources[0], edge_bytes[0], ready[0])
        for k in range(1, len(preds)):
            np.maximum(arrive, row(sources[k], edge_bytes[k], ready[k]), out=arrive)
    else:
        arrive = row(sources[0], input_bytes, ready[0])
    joined = None
    if batches is not None and costs.batch_limits[t] is not None:
        joined = join_row(costs, t, arrive, batches)
    if avail is not None:
        np.maximum(arrive, avail, out=arrive)
    if fetch is not None:
        have, free, capacity, min_capacity = fetch
        arrive += fetch_row(costs, t, have, free, capacity, min_capacity)
    arrive += costs.exec_rows[t]
    if joined is not None:
        np.minimum(arrive, joined, out=arrive)
    return arrive, joined


def join_row(
    costs: WorkflowCosts, t: int, arrive: FloatArray, batches: BatchRows
) -> FloatArray | None:
    """When task ``t`` would finish on each worker by joining the batch of its model queued
    there, or the step batch running there for a step-wise ``t`` (infinite where it cannot),
    or None where it can join none.

    ``batches`` is ``(counts, start)``: ``counts[w]`` tasks of the model wait on ``w`` to
    batch, the first expected to start at ``start[w]``. The task joins when its input arrives
    (``arrive``) by then and the batch has room (fewer than ``costs.batch_limits[t]``); then
    it finishes with it, at ``start + exec * scale(count + 1)``, with no model fetch (the
    queued batch brings the model). A step batch takes the task whenever its input arrives
    while it has room: it finishes at ``max(arrive, start) + exec * scale(count + 1)``.

    A queued batch's join is ranked by that finish plus what it costs the batch's other
    members, ``count * exec * (scale(count + 1) - scale(count))``: each of them now ends that
    much later, so a join is chosen only where it saves more than it costs (at low load an
    idle worker usually beats a join that delays a whole batch). A step batch's join is
    ranked by its own finish alone. Its members are partway through their steps, so that term
    overstates what they lose, and it kept generations apart in small batches on every worker
    where one fuller batch serves more of them on the same lane time: with it, on the paper's
    workload with steps, capacity 4.17 / 3.31 / 4.12 (median2 / p95x3 / p99x5) and goodput at
    4x 3.36; without, 4.46 / 3.65 / 4.08 and 3.57; on ten generated step-wise workloads,
    1.015 / 1.010 / 1.000 in the median (docs/RESULTS.md, "A step batch's join")."""
    limits = costs.batch_limits[t]
    table = costs.batch_scales[t]
    if limits is None or table is None:
        return None
    counts, start = batches
    steps = costs.step_frac[t] < 1.0
    ok = (counts > 0) & (counts < limits)
    if not steps:
        ok &= arrive <= start
    if not ok.any():
        return None
    if steps:
        start = np.maximum(start, arrive)
    rows = np.arange(len(counts))
    size = np.minimum(counts + 1, table.shape[1] - 1)
    scale: FloatArray = table[rows, size]
    if not steps:  # what the join costs a queued batch's members
        scale = scale + counts * (scale - table[rows, np.minimum(counts, table.shape[1] - 1)])
    joined: FloatArray = start + costs.exec_rows[t] * scale
    joined[~ok] = np.inf
    return joined


def fetch_row(
    costs: WorkflowCosts,
    t: int,
    have: BoolArray,
    free: IntArray,
    capacity: IntArray,
    min_capacity: int,
) -> FloatArray:
    """Seconds to bring task ``t``'s model to each worker: 0 where it is (or is coming), twice
    the copy where free bytes are short (the paper's eviction penalty), infinite where the whole
    cache is too small (no worker's is when the model fits in ``min_capacity``)."""
    fetch1, fetch2 = costs.fetch_rows[t], costs.fetch2_rows[t]
    assert fetch1 is not None
    assert fetch2 is not None
    size = costs.model_bytes[t]
    # where(have, 0, where(free < size, fetch2, fetch1)) with a copy and masked writes: about
    # a third less over a bounded view's ten workers (np.where's wrapper costs a microsecond)
    fetch = fetch1.copy()
    np.copyto(fetch, fetch2, where=free < size)
    fetch[have] = 0.0
    if size > min_capacity:
        fetch[capacity < size] = np.inf
    return fetch
