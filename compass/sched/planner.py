"""Compass planning: place a whole job at its ingress, then adjust as tasks finish.

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
numpy operations over all workers, and it is the only one: planning, dynamic adjustment and
join placement all rank workers by it, in absolute seconds on the caller's clock ``now``.

Batches (``batch_aware``): a task that batches (``Task.batch > 1``, with a curve where a batch
gains) may also join a batch of its model already queued on ``w``: when ``c`` such tasks wait
there (``0 < c <`` the batch limit) and its input arrives before the first of them is expected
to start, at ``s``, it finishes with them::

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

When a task finishes, :func:`adjust_successors` re-places its successors one after another on
a view that counts the siblings already placed (each busy until the finish the policy expects
of it, so a fan-out does not pile onto one idle worker), and Compass also re-places a join
whose every input comes from those siblings: none of its inputs has been sent yet, so it can
still follow them. What that needs of a policy is part of :class:`Policy`.

:class:`CompassPolicy` also implements the ablations (no cache term, no load term, no
adjustment), classic HEFT and the ``central`` variant, all by flags on the same code.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError, ModelTooLarge, WorkerUnavailable
from compass.sched.cost import BatchRows, CostCache, WorkflowCosts, finish_row
from compass.sched.view import BatchCurve, Placement, ViewSnapshot
from compass.workflow.dag import Workflow, batch_limit
from compass.workflow.profile import Profiles

__all__ = [
    "DEFAULT_ADJUST_THRESHOLD",
    "CompassPolicy",
    "JobInfo",
    "Policy",
    "adjust_successors",
    "finish_now",
    "plan_eft",
    "record_plan",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]
IntArray = npt.NDArray[np.int64]

#: finish times closer than this are a tie (seconds; far below any real task or transfer)
TIE_S = 1e-9

#: Compass's queues run a task by its job's deadline: the job's arrival plus this many times
#: its workflow's best time. A short job's task overtakes a long job's that arrived a little
#: earlier, a long job that has waited long enough overtakes fresh short ones. Chosen on the
#: paper's workload and five generated ones, up to four arrival seeds each (docs/RESULTS.md,
#: "Queue order by deadline"): against FIFO, +29-54% at the paper's tail SLOs, up to 2x at
#: p99x5 on generated ones, one loss (-10% at p99x5 on one workload and seed pair).
DEFAULT_DEADLINE_SLACK = 4.0

#: Compass keeps a successor on its planned worker while that worker's wait is at most this
#: times the successor's expected time. The paper's 1.5 keeps a 0.8 s task waiting up to 1.2 s
#: for its planned worker while others sit idle; with siblings counted in the view
#: (:func:`adjust_successors`), anything from 0.01 to 0.5 cut the simulated p99 by about a
#: fifth, across seeds, loads and bursty arrivals. Of 0.1, 0.25, 0.5 and 1.5, 0.1 sustained the
#: most load at every SLO on the paper's workload and on generated ones (``bench defaults``,
#: docs/RESULTS.md "Defaults chosen for all workloads").
DEFAULT_ADJUST_THRESHOLD = 0.1


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the planner knows of a job: its id, workflow, ingress worker and input size.

    ``input_bytes`` is the size of the job's inputs, which every root task receives from the
    ingress; 0 means unknown, and the root's declared ``input_bytes`` stands in. ``priority``
    is the job's (its tasks count in the waits of their level and those below).
    """

    job_id: str
    workflow: Workflow
    ingress: str
    input_bytes: int
    priority: int = 0


class Policy(Protocol):
    """A placement policy. Every method returns workers that exist in ``view``."""

    name: str
    #: whether :meth:`adjust` may move tasks away from their planned worker
    dynamic: bool
    #: whether a worker's queue runs tasks by their job's arrival (oldest job first) rather
    #: than by their own arrival (FIFO)
    oldest_job_first: bool
    #: a worker's queue runs tasks by their job's deadline, its arrival plus this many times
    #: its workflow's best time (None: by ``oldest_job_first``, else FIFO)
    deadline_slack: float | None
    #: whether an idle worker fills free cache space with the models the cluster holds least
    #: (:func:`compass.sched.replicas.warm_order`)
    warms_cache: bool
    #: whether this policy plans model-less tasks onto host lanes, off the GPU queue: such a
    #: task neither waits for a worker's queue nor adds to it
    host_lanes: bool
    #: whether :func:`adjust_successors` places each successor of a finished task on a view
    #: that counts the siblings placed before it (off: all on one snapshot, as the paper did)
    counts_siblings: bool
    #: whether the policy's finish times count joining a batch queued on a worker (then
    #: :func:`adjust_successors` counts the siblings it places in those batches too)
    batch_aware: bool

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """Task -> worker for every task of ``job``, at its ingress."""
        ...

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """The worker for successor ``task``, decided when one of its predecessors finishes,
        on the worker where it finished, before that output is sent. ``plan`` is the job's
        current plan (with earlier moves recorded)."""
        ...

    def finish_times(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> FloatArray:
        """When ``task`` would finish on each worker of ``view``, in absolute seconds on the
        clock of ``now``, by this policy's own terms (:func:`finish_now`): every input ready
        now on the worker ``plan`` gives its producer. :func:`adjust_successors` counts a
        successor busy on its worker until then."""
        ...

    def joins_fed_by(self, wf: Workflow, finished: str) -> tuple[str, ...]:
        """The joins :meth:`place_joins` may move when task ``finished`` completes, in
        topological order (none for a policy that never moves joins)."""
        ...

    def place_joins(
        self,
        job: JobInfo,
        finished: str,
        plan: Mapping[str, str],
        finish: Mapping[str, tuple[int, float]],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> dict[str, str]:
        """New workers for the joins of :meth:`joins_fed_by`, after the successors of
        ``finished`` were placed: ``finish`` maps each of them to ``(worker index, expected
        absolute finish)`` and ``view`` counts them. Only the joins that move."""
        ...

    def planner(self, view: ViewSnapshot) -> str | None:
        """The one worker that must plan every job, or None when the ingress plans."""
        ...


def plan_eft(
    job: JobInfo,
    view: ViewSnapshot,
    costs: WorkflowCosts,
    now: float,
    *,
    use_load: bool = True,
    use_cache: bool = True,
    host_lanes: bool = False,
    batch_aware: bool = False,
) -> dict[str, str]:
    """Place every task of ``job`` at its earliest estimated finish (see the module docstring).

    ``use_load=False`` treats every worker as idle at ``now``; ``use_cache=False`` drops the
    model fetch term; ``host_lanes=True``: model-less tasks run off the GPU lanes, so they
    neither wait for a worker's queue nor add to it; ``batch_aware=True`` (with ``use_load``)
    counts joining a queued batch. Raises :class:`WorkerUnavailable` on an
    empty view and :class:`ModelTooLarge` when a model fits in no worker's cache.
    """
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

    for t in costs.rank_order:
        preds = preds_of[t]
        if preds:
            sources: Sequence[int] = [placed[p] for p in preds]
            ready: Sequence[float] = [finish[p] for p in preds]
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
        if batches is not None and model is not None and costs.batch_limits[t] is not None:
            rows = batches.rows(model)
        eft, joined = finish_row(
            costs,
            t,
            sources,
            ready,
            avail if on_lane else None,
            have,
            free,
            capacity,
            min_capacity,
            root_bytes,
            rows,
        )
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
            j = _fewest_bytes(ties, costs, t, sources, ingress, root_bytes, have, ingress)
        placed[t] = j
        finish[t] = float(eft[j])
        joins = joined is not None and float(joined[j]) <= finish[t]
        if joins:
            # the batch runs longer by this item: so does everything queued behind it
            assert rows is not None and model is not None and batches is not None
            scale = costs.batch_scales[t]
            assert scale is not None
            c = int(rows[0][j])
            extra = float(costs.exec_rows[t][j]) * float(scale[j, c + 1] - scale[j, c])
            avail[j] = max(float(avail[j]) + extra, finish[t])
            if costs.batch_shared[t]:
                batches.joined(model, j)
        else:
            if on_lane:
                avail[j] = finish[t]
            if batches is not None and costs.batch_shared[t]:
                assert model is not None
                limits = costs.batch_limits[t]
                assert limits is not None
                batches.opened(model, j, finish[t] - float(costs.exec_rows[t][j]), int(limits[j]))
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
    *,
    use_load: bool = True,
    use_cache: bool = True,
    host_lanes: bool = False,
    batch_aware: bool = False,
) -> tuple[FloatArray, list[int], int, BoolArray | None]:
    """:func:`~compass.sched.cost.finish_row` of task ``t`` once a predecessor finished: each
    input ready at ``now`` on the worker ``plan`` names for its producer (a root's: the job's
    inputs, at the ingress), queues and models as ``view`` has them; ``use_load``,
    ``use_cache``, ``host_lanes`` and ``batch_aware`` as for :func:`plan_eft`.

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
    avail = view.wait_s + now if use_load and (model is not None or not host_lanes) else None
    have = view.holds(model) if use_cache and model is not None else None
    rows = _view_batches(costs, t, view, now) if batch_aware and avail is not None else None
    eft, _ = finish_row(
        costs,
        t,
        sources,
        ready,
        avail,
        have,
        view.free_bytes,
        view.capacity_bytes,
        view.min_capacity_bytes,
        root_bytes,
        rows,
    )
    return eft, sources, root_bytes, have


def _view_batches(costs: WorkflowCosts, t: int, view: ViewSnapshot, now: float) -> BatchRows | None:
    """The batches of task ``t``'s model in ``view``, starts made absolute (None: ``t`` does
    not batch, or no worker has any)."""
    model = costs.models[t]
    if model is None or costs.batch_limits[t] is None:
        return None
    return _absolute(view, model, now)


def _absolute(view: ViewSnapshot, model: str, now: float) -> BatchRows | None:
    """``model``'s queued batches in ``view``, their starts on the caller's clock."""
    found = view.batched(model)
    return None if found is None else (found[0], found[1] + now)


def _fewest_bytes(
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
    ``prefer`` if it is among them; then the lowest index."""
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
    return int(keep[0])


class CompassPolicy:
    """The paper's planner and dynamic adjustment, with switches for the ablations.

    ``use_load``: count queue waits (off: every worker idle); ``use_cache``: count model
    fetches; ``dynamic``: let :meth:`adjust` move tasks; ``central``: one fixed worker (the
    lowest name) plans every job; ``oldest_job_first`` and ``warms_cache``: see
    :class:`Policy` (warming on for Compass, off for classic HEFT; oldest job first applies
    only without ``deadline_slack``: it gained 5-8% of capacity on the paper's workload but
    lost 9-15% at p99x5 on generated ones, docs/RESULTS.md); ``host_lanes``: the workers
    run model-less tasks on host lanes, off the GPU queue, so such a task's estimate has no
    queue wait, it adds none, and adjustment leaves it where it was planned;
    ``counts_siblings``: see :class:`Policy`; ``moves_joins``: re-place a join fed only by
    the successors of a finishing task (:meth:`place_joins`; off: joins stay where planned,
    as in the paper); ``deadline_slack``: queues run tasks by their job's deadline (see
    :class:`Policy`; None: FIFO, or oldest job first); ``batch_aware``: finish times count
    joining a batch queued on a worker
    (the module docstring), in planning, adjustment and join placement (it needs
    ``use_load``: without queues there is no batch to join, so it is off then).

    Adjustment, on the worker where a predecessor finished: keep the planned worker when the
    successor is a join (its inputs must meet), or when that worker's wait is at most
    ``adjust_threshold`` x the successor's expected execution time; otherwise move it to the
    worker where it would finish first, ``max(wait, input transfer) + fetch + exec``. The
    paper's rule is the smallest ``wait + fetch``; counting the transfer of the finished
    output from this worker (and the execution time, for unequal GPUs) is our addition, so a
    3 MB output does not chase a queue a few microseconds shorter across a slow network. With
    ``batch_aware``, a successor that would join a batch queued on its planned worker counts
    the wait it would see there, ``join - exec - now``, when that is below the queue's wait.
    """

    def __init__(
        self,
        name: str = "compass",
        *,
        use_load: bool = True,
        use_cache: bool = True,
        dynamic: bool = True,
        adjust_threshold: float = DEFAULT_ADJUST_THRESHOLD,
        central: bool = False,
        oldest_job_first: bool = False,
        warms_cache: bool = True,
        host_lanes: bool = False,
        counts_siblings: bool = True,
        moves_joins: bool = True,
        batch_aware: bool = True,
        deadline_slack: float | None = DEFAULT_DEADLINE_SLACK,
    ) -> None:
        if not isinstance(adjust_threshold, int | float) or not adjust_threshold > 0:
            raise ConfigError(f"adjust_threshold must be > 0, got {adjust_threshold!r}")
        if deadline_slack is not None and (
            isinstance(deadline_slack, bool)
            or not isinstance(deadline_slack, int | float)
            or not deadline_slack >= 0
        ):
            raise ConfigError(f"deadline_slack must be >= 0 or None, got {deadline_slack!r}")
        self.deadline_slack = None if deadline_slack is None else float(deadline_slack)
        self.name = name
        self.use_load = use_load
        self.use_cache = use_cache
        self.dynamic = dynamic
        self.adjust_threshold = float(adjust_threshold)
        self.central = central
        self.oldest_job_first = oldest_job_first
        self.warms_cache = warms_cache
        self.host_lanes = host_lanes
        self.counts_siblings = counts_siblings
        self.moves_joins = moves_joins
        self.batch_aware = bool(batch_aware) and use_load
        self._costs = CostCache()
        self._joins: dict[tuple[str, str], tuple[Workflow, tuple[str, ...]]] = {}

    def __repr__(self) -> str:
        return f"CompassPolicy({self.name!r})"

    def costs(self, workflow: Workflow, profiles: Profiles, view: ViewSnapshot) -> WorkflowCosts:
        """The (cached) cost table of ``workflow`` over ``view``'s workers."""
        return self._costs.get(workflow, profiles, view.names)

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`Policy`."""
        costs = self._costs.get(job.workflow, profiles, view.names)
        return plan_eft(
            job,
            view,
            costs,
            now,
            use_load=self.use_load,
            use_cache=self.use_cache,
            host_lanes=self.host_lanes,
            batch_aware=self.batch_aware,
        )

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """See :class:`Policy` and the class docstring."""
        wf = job.workflow
        profiles.add_workflow(wf)  # this worker may not have planned a job of it yet
        planned = plan.get(task)
        i = -1 if planned is None else view.positions.get(planned, -1)
        if i >= 0:
            assert planned is not None
            if not self.dynamic or not self.use_load or wf.is_join(task):
                return planned
            if self.host_lanes and wf.tasks[task].model is None:
                return planned  # no queue to escape: it starts when its input arrives
            exec_s = profiles.exec_s(wf.name, task, planned)
            if float(view.wait_s[i]) <= self.adjust_threshold * exec_s:
                return planned
            if self.batch_aware and self._joined_wait_s(
                job, task, plan, view, profiles, now, i
            ) <= (self.adjust_threshold * exec_s):
                return planned
        return self.best_worker(job, task, plan, view, profiles, now, prefer=i)

    def _joined_wait_s(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
        i: int,
    ) -> float:
        """The wait ``task`` would see on worker ``i`` by joining a batch queued there
        (infinite when it would not join one)."""
        costs = self._costs.get(job.workflow, profiles, view.names)
        t = job.workflow.index[task]
        model = costs.models[t]
        if model is None or costs.batch_limits[t] is None:
            return math.inf
        rows = view.batched(model)
        if rows is None or not rows[0][i]:
            return math.inf
        eft = self._finish_now(costs, job, t, plan, view, now)[0]
        waited = float(eft[i]) - now - float(costs.exec_rows[t][i])
        # only a join finishes before the queue's wait plus the run
        return waited if waited < float(view.wait_s[i]) else math.inf

    def finish_times(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> FloatArray:
        """See :class:`Policy`: with this policy's load, cache and host-lane switches."""
        if not view.names:
            raise WorkerUnavailable(f"no workers in the view to place task {task!r} on")
        costs = self._costs.get(job.workflow, profiles, view.names)
        return self._finish_now(costs, job, job.workflow.index[task], plan, view, now)[0]

    def _finish_now(
        self,
        costs: WorkflowCosts,
        job: JobInfo,
        t: int,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        now: float,
    ) -> tuple[FloatArray, list[int], int, BoolArray | None]:
        return finish_now(
            costs,
            job,
            t,
            plan,
            view,
            now,
            use_load=self.use_load,
            use_cache=self.use_cache,
            host_lanes=self.host_lanes,
            batch_aware=self.batch_aware,
        )

    def best_worker(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
        *,
        prefer: int = -1,
    ) -> str:
        """Where ``task`` would finish first (:meth:`finish_times`) given its inputs' current
        workers in ``plan`` (ties: ``prefer``, then fewest bytes moved, then the lowest
        index)."""
        if not view.names:
            raise WorkerUnavailable(f"no workers in the view to place task {task!r} on")
        costs = self._costs.get(job.workflow, profiles, view.names)
        t = job.workflow.index[task]
        eft, sources, root_bytes, have = self._finish_now(costs, job, t, plan, view, now)
        j = int(eft.argmin())
        best = float(eft[j])
        if best == math.inf:
            raise ModelTooLarge(
                f"job {job.job_id!r}: model {costs.models[t]!r} of task {task!r} fits in no "
                "worker's cache",
                detail={"model": costs.models[t]},
            )
        if prefer >= 0 and float(eft[prefer]) <= best + TIE_S:
            return view.names[prefer]
        ties = (eft <= best + TIE_S).nonzero()[0]
        if len(ties) > 1:
            ingress = view.positions.get(job.ingress, -1)
            finisher = next((s for s in sources if s >= 0), ingress)
            j = _fewest_bytes(ties, costs, t, sources, ingress, root_bytes, have, finisher)
        return view.names[j]

    def planner(self, view: ViewSnapshot) -> str | None:
        """The lowest-named worker for ``central``; None (the ingress plans) otherwise."""
        if self.central and view.names:
            return view.names[0]
        return None

    def place_joins(
        self,
        job: JobInfo,
        finished: str,
        plan: Mapping[str, str],
        finish: Mapping[str, tuple[int, float]],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> dict[str, str]:
        """New workers for the joins that only the successors of ``finished`` feed.

        ``finish`` maps each such successor to ``(worker index, expected finish)`` and
        ``view`` already counts them. A join qualifies when each of its predecessors has
        ``finished`` as its only predecessor: then every input of the join will be sent with
        the plan decided now, so moving it cannot split its inputs. It goes where it would
        finish first, preferring the worker of its last input (whose lane frees just then).
        """
        joins = self.joins_fed_by(job.workflow, finished)
        if not joins or not view.names:
            return {}
        wf = job.workflow
        order = wf.order
        costs = self._costs.get(wf, profiles, view.names)
        moves: dict[str, str] = {}
        for j in joins:
            t = wf.index[j]
            preds = costs.preds[t]
            inputs = [finish.get(order[p]) for p in preds]
            if any(found is None for found in inputs):
                continue
            sources = [found[0] for found in inputs if found is not None]
            ready = [found[1] for found in inputs if found is not None]
            model = costs.models[t]
            on_lane = model is not None or not self.host_lanes
            rows = _view_batches(costs, t, view, now) if self.batch_aware and on_lane else None
            eft, _ = finish_row(
                costs,
                t,
                sources,
                ready,
                view.wait_s + now if on_lane else None,
                view.holds(model) if self.use_cache and model is not None else None,
                view.free_bytes,
                view.capacity_bytes,
                view.min_capacity_bytes,
                0,
                rows,
            )
            k = int(eft.argmin())
            best = float(eft[k])
            if best == math.inf:
                continue  # nowhere better: the planned worker stays
            # the first of the latest inputs, as max() picks it
            last = max(range(len(ready)), key=ready.__getitem__)
            prefer = sources[last]
            if float(eft[prefer]) <= best + TIE_S:
                k = prefer
            target = view.names[k]
            if target != plan.get(j):
                moves[j] = target
        return moves

    def joins_fed_by(self, wf: Workflow, finished: str) -> tuple[str, ...]:
        """The joins :meth:`place_joins` may move when ``finished`` completes (none unless
        this policy adjusts with loads and moves joins), in topological order; cached per
        workflow."""
        if not (self.dynamic and self.use_load and self.moves_joins):
            return ()
        found = self._joins.get((wf.name, finished))
        if found is None or found[0] is not wf:
            found = (wf, _joins_fed_by(wf, finished))
            self._joins[(wf.name, finished)] = found
        return found[1]


def _joins_fed_by(wf: Workflow, finished: str) -> tuple[str, ...]:
    """Joins (in topological order) whose every predecessor has ``finished`` as its only
    predecessor."""
    succs = set(wf.succs(finished))
    joins: set[str] = set()
    for s in succs:
        if wf.preds(s) != (finished,):
            continue
        for j in wf.succs(s):
            if wf.is_join(j) and all(
                p in succs and wf.preds(p) == (finished,) for p in wf.preds(j)
            ):
                joins.add(j)
    return tuple(t for t in wf.order if t in joins)


@dataclass(frozen=True, slots=True)
class _Batchable:
    """A batchable sibling on its worker: its single run there and the largest batch worth
    forming."""

    exec_s: float
    limit: int


class _FanoutView:
    """The view the successors of one finished task are placed on: a snapshot plus the
    siblings placed so far, each busy on its worker until its expected finish and its model
    counted as coming there (and, for a batch-aware policy, leading the next batch of its model
    there, so a later sibling may join it).

    A sibling that joined a queued batch counts the same way, busy until the finish its join
    was ranked by: counting only its share of the batch measured worse (docs/RESULTS.md,
    "Batching")."""

    def __init__(self, view: ViewSnapshot) -> None:
        self.base = view
        self._wait = view.wait_s.copy()
        self._free = view.free_bytes.copy()
        self._resident = dict(view.resident)
        self._batches: dict[str, BatchRows] = dict(view.batches)
        self._own_batches: set[str] = set()
        self._current: ViewSnapshot | None = view

    def snapshot(self) -> ViewSnapshot:
        if self._current is None:
            base = self.base
            batches = {
                m: (c.copy(), s.copy()) if m in self._own_batches else (c, s)
                for m, (c, s) in self._batches.items()
            }
            self._current = ViewSnapshot.from_arrays(
                base.names,
                self._wait.copy(),
                self._free.copy(),
                base.capacity_bytes,
                self._resident,
                positions=base.positions,
                batches=batches,
            )
        return self._current

    def place(
        self,
        i: int,
        busy_s: float,
        model: str | None,
        model_bytes: int,
        batch: _Batchable | None = None,
    ) -> None:
        """Count a task on worker ``i``'s queue that keeps it busy ``busy_s`` seconds from now
        (until the task's expected finish), and its model as coming there; ``batch``: it may
        batch there, so it leads the next batch of its model there, from its start (unless
        full batches wait ahead of it: they would take it)."""
        if model is not None:
            row = self._resident.get(model)
            if row is None or not row[i]:
                row = np.zeros(len(self.base.names), dtype=np.bool_) if row is None else row.copy()
                row[i] = True
                self._resident[model] = row
                self._free[i] = max(0, int(self._free[i]) - model_bytes)
            if batch is not None:
                rows = self._batches.get(model)
                if rows is None or int(rows[0][i]) < batch.limit:
                    counts, starts = self._own(model)
                    counts[i] = 1
                    starts[i] = max(0.0, busy_s - batch.exec_s)
        # a policy blind to load finishes a task "before" the queue it ignores empties; the
        # queue itself only grows
        self._wait[i] = max(float(self._wait[i]), busy_s)
        self._current = None

    def _own(self, model: str) -> BatchRows:
        rows = self._batches.get(model)
        if rows is None:
            n = len(self.base.names)
            rows = (np.zeros(n, dtype=np.int64), np.zeros(n))
        elif model not in self._own_batches:
            rows = (rows[0].copy(), rows[1].copy())
        self._own_batches.add(model)
        self._batches[model] = rows
        return rows


def adjust_successors(
    policy: Policy,
    job: JobInfo,
    finished: str,
    plan: Mapping[str, str],
    view: ViewSnapshot,
    profiles: Profiles,
    now: float,
) -> dict[str, str]:
    """The job's plan once task ``finished`` is done, before its output is pushed on.

    Each successor of ``finished`` is re-placed by ``policy.adjust`` (see
    :meth:`Policy.adjust`), highest upward rank first, on a view that counts the siblings
    placed before it, each busy until its :meth:`Policy.finish_times` on its worker (unless
    ``policy.counts_siblings`` is off: then all on ``view``); then
    ``policy.place_joins`` re-places the joins those siblings alone feed
    (:meth:`Policy.joins_fed_by`). Returns the whole plan, with every change.
    """
    wf = job.workflow
    succs = wf.succs(finished)
    current = dict(plan)
    if not policy.dynamic or len(succs) < 2:
        # nothing to count between siblings, and a join needs two of them to be fed alone
        for task in succs:
            current[task] = policy.adjust(job, task, current, view, profiles, now)
        return current
    joins = policy.joins_fed_by(wf, finished)
    host_lanes = policy.host_lanes
    profiles.add_workflow(wf)
    ranks = wf.upward_rank(profiles.net_bytes_per_s)
    ordered = sorted(succs, key=lambda task: (-ranks[task], wf.index[task]))
    fanout = _FanoutView(view)
    finish: dict[str, tuple[int, float]] = {}
    last = len(ordered) - 1
    counts = policy.counts_siblings
    for k, task in enumerate(ordered):
        seen = fanout.snapshot() if counts else view
        target = policy.adjust(job, task, current, seen, profiles, now)
        current[task] = target
        i = view.positions.get(target, -1)
        if i < 0 or (k == last and not joins):
            continue
        done = float(policy.finish_times(job, task, current, seen, profiles, now)[i])
        if done == math.inf:
            continue  # its model cannot fit there: no finish to count or to follow
        finish[task] = (i, done)
        model = wf.tasks[task].model
        if counts and (model is not None or not host_lanes):
            size = 0 if model is None else profiles.model_bytes(model)
            batch = _batchable(wf, task, target, profiles) if policy.batch_aware else None
            fanout.place(i, done - now, model, size, batch)
    if joins:
        current.update(
            policy.place_joins(job, finished, current, finish, fanout.snapshot(), profiles, now)
        )
    return current


def _batchable(wf: Workflow, task: str, worker: str, profiles: Profiles) -> _Batchable | None:
    """``task`` on ``worker`` as a batch member, or None where it never batches."""
    curve = _curve(wf, task, worker, profiles)
    if curve is None:
        return None
    return _Batchable(profiles.exec_s(wf.name, task, worker), curve.limit)


def _curve(wf: Workflow, task: str, worker: str, profiles: Profiles) -> BatchCurve | None:
    """How ``task`` batches on ``worker``, or None where it never does."""
    declared = wf.tasks[task]
    if declared.batch <= 1:
        return None
    scale = profiles.batch_scale(wf.name, task, worker)
    limit = batch_limit(scale, declared.batch)
    return BatchCurve(scale, limit) if limit > 1 else None


class PlacementCounter(Protocol):
    """What :func:`record_plan` counts placements in: a :class:`ClusterView`, or a worker
    core's view port."""

    def note_placement(self, worker: str, placed: Placement, now: float) -> None: ...


def record_plan(
    view: PlacementCounter,
    job: JobInfo,
    plan: Mapping[str, str],
    profiles: Profiles,
    now: float,
    *,
    host_lanes: bool = False,
    planner: str | None = None,
    batch_aware: bool = False,
) -> None:
    """Count every task of a fresh plan in its worker's wait (:meth:`ClusterView.note_placement`),
    so the next job planned before the next heartbeats does not pile onto the same workers.
    With ``host_lanes`` model-less tasks are not counted: they do not use the queue. Tasks placed
    on ``planner`` itself are not counted either: its own state is exact, and counting them too
    would count them twice. Each placement names its job, whose own later re-planning leaves it
    out (:meth:`ClusterView.snapshot`). With ``batch_aware`` a task that may batch counts in its
    model's batches on its worker, as that worker's queue will count it
    (:class:`~compass.sched.view.PlacedCounts`)."""
    wf = job.workflow
    profiles.add_workflow(wf)
    for task, worker in plan.items():
        if worker == planner:
            continue
        model = wf.tasks[task].model
        if model is None and host_lanes:
            continue
        size = 0 if model is None else profiles.model_bytes(model)
        curve = _curve(wf, task, worker, profiles) if batch_aware else None
        seconds = profiles.exec_s(wf.name, task, worker)
        view.note_placement(
            worker, Placement(seconds, model, size, job.job_id, curve, job.priority), now
        )
