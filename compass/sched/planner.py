"""Compass's planner: :class:`CompassPolicy`, the paper's placement and dynamic adjustment.

A job is planned whole at its ingress by the earliest-finish rule (:func:`~compass.sched.eft.
plan_eft`); when a task finishes, each successor is kept on its planned worker or moved where
it would finish first (:meth:`CompassPolicy.adjust`, driven by
:func:`~compass.sched.adjust.adjust_successors`), and a join fed only by those successors may
follow them (:meth:`CompassPolicy.place_joins`).

:class:`CompassOptions` holds its switches: the ablations (no cache term, no load term, no
adjustment), classic HEFT and the ``central`` variant are all the same code with some off
(:func:`~compass.sched.policies.make_policy`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError, ModelTooLarge, WorkerUnavailable
from compass.sched.cost import CostCache, WorkflowCosts, finish_row
from compass.sched.eft import FinishTerms, fewest_bytes, finish_now, plan_eft, view_batches
from compass.sched.policy import TIE_S, JobInfo
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = [
    "DEFAULT_ADJUST_THRESHOLD",
    "DEFAULT_DEADLINE_SLACK",
    "CompassOptions",
    "CompassPolicy",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

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
#: (:func:`~compass.sched.adjust.adjust_successors`), anything from 0.01 to 0.5 cut the
#: simulated p99 by about a fifth, across seeds, loads and bursty arrivals. Of 0.1, 0.25, 0.5
#: and 1.5, 0.1 sustained the most load at every SLO on the paper's workload and on generated
#: ones (``bench defaults``, docs/RESULTS.md "Defaults chosen for all workloads").
DEFAULT_ADJUST_THRESHOLD = 0.1


@dataclass(frozen=True, slots=True)
class CompassOptions:
    """The switches of :class:`CompassPolicy` (all on, as compass ships, by default).

    ``use_load``: count queue waits (off: every worker idle); ``use_cache``: count model
    fetches; ``dynamic``: let :meth:`CompassPolicy.adjust` move tasks; ``adjust_threshold``:
    keep a successor on its planned worker while that worker's wait is at most this times its
    expected execution time; ``central``: one fixed worker (the lowest name) plans every job;
    ``oldest_job_first`` and ``warms_cache``: see :class:`~compass.sched.policy.Policy`
    (warming on for Compass, off for classic HEFT; oldest job first applies only without
    ``deadline_slack``: it gained 5-8% of capacity on the paper's workload but lost 9-15% at
    p99x5 on generated ones, docs/RESULTS.md); ``host_lanes``: the workers run model-less
    tasks on host lanes, off the GPU queue, so such a task's estimate has no queue wait, it
    adds none, and adjustment leaves it where it was planned; ``counts_siblings``: see
    :class:`~compass.sched.policy.Policy`; ``moves_joins``: re-place a join fed only by the
    successors of a finishing task (:meth:`CompassPolicy.place_joins`; off: joins stay where
    planned, as in the paper); ``deadline_slack``: queues run tasks by their job's deadline
    (see :class:`~compass.sched.policy.Policy`; None: FIFO, or oldest job first);
    ``batch_aware``: finish times count joining a batch queued on a worker
    (:mod:`compass.sched.eft`), in planning, adjustment and join placement (it needs
    ``use_load``: without queues there is no batch to join, so it is off then).
    """

    use_load: bool = True
    use_cache: bool = True
    dynamic: bool = True
    adjust_threshold: float = DEFAULT_ADJUST_THRESHOLD
    central: bool = False
    oldest_job_first: bool = False
    warms_cache: bool = True
    host_lanes: bool = False
    counts_siblings: bool = True
    moves_joins: bool = True
    batch_aware: bool = True
    deadline_slack: float | None = DEFAULT_DEADLINE_SLACK
    #: each step of a workflow decided at run time is a job of its own, as a user chaining
    #: ``submit`` calls runs it (the ``compass-chained`` baseline, :mod:`compass.core.unfold`)
    chained: bool = False
    #: a task of a workflow decided at run time ranks in the queue by the expected best time
    #: of a job that reached it, not its workflow's likely path's (:mod:`compass.sched.unfold`)
    progress_rank: bool = True
    #: a job of a workflow decided at run time counts its whole likely path in its workers'
    #: waits at admission (off: one step at a time, each when the choice before it is made;
    #: :func:`compass.core.unfold.counts_steps`)
    count_likely_path: bool = True
    #: a worker running a decision task of a workflow decided at run time prefetches the
    #: models of the successors its most likely choice runs, where the plan puts them on it
    #: (:mod:`compass.core.likely`; off: only the models of queued tasks, as for any workflow)
    likely_prefetch: bool = True
    #: a task of a workflow decided at run time is weighed at step boundaries (the slowdown
    #: rule of preemption, :mod:`compass.core.preempt`) against the best time it ranks by in
    #: the queue (:func:`compass.core.unfold.rank_basis`: the expected best time of a job that
    #: reached it; under ``chained``, its step's, the job a chaining client submitted); off:
    #: its workflow's likely path's, whatever the task
    rank_yardstick: bool = True

    def __post_init__(self) -> None:
        threshold, slack = self.adjust_threshold, self.deadline_slack
        if not isinstance(threshold, int | float) or not threshold > 0:
            raise ConfigError(f"adjust_threshold must be > 0, got {threshold!r}")
        if slack is not None and (
            isinstance(slack, bool) or not isinstance(slack, int | float) or not slack >= 0
        ):
            raise ConfigError(f"deadline_slack must be >= 0 or None, got {slack!r}")
        object.__setattr__(self, "adjust_threshold", float(threshold))
        object.__setattr__(self, "deadline_slack", None if slack is None else float(slack))
        object.__setattr__(self, "batch_aware", bool(self.batch_aware) and self.use_load)


class CompassPolicy:
    """The paper's planner and dynamic adjustment, with switches for the ablations
    (:class:`CompassOptions`; :func:`~compass.sched.policies.make_policy` names the variants).

    Adjustment, on the worker where a predecessor finished: keep the planned worker when the
    successor is a join (its inputs must meet), or when that worker's wait is at most
    ``options.adjust_threshold`` x the successor's expected execution time; otherwise move it to the
    worker where it would finish first, ``max(wait, input transfer) + fetch + exec``. The
    paper's rule is the smallest ``wait + fetch``; counting the transfer of the finished
    output from this worker (and the execution time, for unequal GPUs) is our addition, so a
    3 MB output does not chase a queue a few microseconds shorter across a slow network. With
    ``options.batch_aware``, a successor that would join a batch queued on its planned worker counts
    the wait it would see there, ``join - exec - now``, when that is below the queue's wait.
    """

    def __init__(self, name: str = "compass", options: CompassOptions = CompassOptions()) -> None:
        self.name = name
        self.options = options
        self.dynamic = options.dynamic
        self.oldest_job_first = options.oldest_job_first
        self.deadline_slack = options.deadline_slack
        self.warms_cache = options.warms_cache
        self.host_lanes = options.host_lanes
        self.counts_siblings = options.counts_siblings
        self.batch_aware = options.batch_aware
        self._terms = FinishTerms(
            load=options.use_load,
            cache=options.use_cache,
            host_lanes=options.host_lanes,
            batches=options.batch_aware,
        )
        self._costs = CostCache()
        self._joins: dict[tuple[str, str], tuple[Workflow, tuple[str, ...]]] = {}

    def __repr__(self) -> str:
        return f"CompassPolicy({self.name!r})"

    def costs(self, workflow: Workflow, profiles: Profiles, view: ViewSnapshot) -> WorkflowCosts:
        """The (cached) cost table of ``workflow`` over ``view``'s workers."""
        return self._costs.for_view(workflow, profiles, view)

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`~compass.sched.policy.Policy`."""
        costs = self._costs.for_view(job.workflow, profiles, view)
        return plan_eft(job, view, costs, now, self._terms)

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """See :class:`~compass.sched.policy.Policy` and the class docstring."""
        wf = job.workflow
        profiles.add_workflow(wf)  # this worker may not have planned a job of it yet
        planned = plan.get(task)
        if planned is not None and wf.is_join(task):
            # a join stays where it was planned, in this view or not (a draining worker still
            # runs it): its other inputs may be on their way there already, and each
            # predecessor's worker moving it on its own would send them to different places
            return planned
        i = -1 if planned is None else view.positions.get(planned, -1)
        if i >= 0:
            assert planned is not None
            if not self.dynamic or not self.options.use_load:
                return planned
            if self.host_lanes and wf.tasks[task].model is None:
                return planned  # no queue to escape: it starts when its input arrives
            exec_s = profiles.exec_s(wf.name, task, planned)
            if float(view.wait_s[i]) <= self.options.adjust_threshold * exec_s:
                return planned
            if self.batch_aware and self._joined_wait_s(
                job, task, plan, view, profiles, now, i
            ) <= (self.options.adjust_threshold * exec_s):
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
        costs = self._costs.for_view(job.workflow, profiles, view)
        t = job.workflow.index[task]
        key = costs.batch_keys[t]
        if key is None:
            return math.inf
        rows = view.batched(key)
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
        """See :class:`~compass.sched.policy.Policy`: with this policy's load, cache and
        host-lane switches."""
        if not view.names:
            raise WorkerUnavailable(f"no workers in the view to place task {task!r} on")
        costs = self._costs.for_view(job.workflow, profiles, view)
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
        return finish_now(costs, job, t, plan, view, now, self._terms)

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
        costs = self._costs.for_view(job.workflow, profiles, view)
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
            j = fewest_bytes(ties, costs, t, sources, ingress, root_bytes, have, finisher)
        return view.names[j]

    def planner(self, view: ViewSnapshot) -> str | None:
        """The lowest-named worker for ``central``; None (the ingress plans) otherwise."""
        if self.options.central and view.names:
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
        costs = self._costs.for_view(wf, profiles, view)
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
            rows = view_batches(costs, t, view, now) if self.batch_aware and on_lane else None
            fetch = None
            if self.options.use_cache and model is not None:
                have = view.holds(model)
                fetch = (have, view.free_bytes, view.capacity_bytes, view.min_capacity_bytes)
            avail = view.wait_s + now if on_lane else None
            eft, _ = finish_row(costs, t, sources, ready, avail, fetch, 0, rows)
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
        if not (self.dynamic and self.options.use_load and self.options.moves_joins):
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
