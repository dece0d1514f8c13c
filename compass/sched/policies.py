"""Every placement policy behind one interface, and :func:`make_policy` to pick one by name.

Compass and its variants live in :mod:`compass.sched.planner`; the baselines the paper compares
against live here: ``hash``, ``random``, ``round_robin``, ``jsq`` (the paper's JIT), ``jit``
(Cascade's JIT with model locality) and, through :class:`~compass.sched.planner.CompassOptions`,
``heft``.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError, WorkerUnavailable
from compass.sched.cost import CostCache, WorkflowCosts, fetch_row
from compass.sched.eft import finish_now
from compass.sched.planner import DEFAULT_ADJUST_THRESHOLD, CompassOptions, CompassPolicy
from compass.sched.policy import TIE_S, JobInfo, Policy
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = [
    "POLICY_NAMES",
    "HashPolicy",
    "JoinShortestQueuePolicy",
    "ModelLocalityPolicy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "hash_worker",
    "make_policy",
    "worker_seed",
]

POLICY_NAMES: tuple[str, ...] = (
    "compass",
    "compass_nocache",
    "compass_noload",
    "compass_noadjust",
    "hash",
    "random",
    "round_robin",
    "jsq",
    "jit",
    "heft",
    "central",
    "compass-chained",
)


def make_policy(
    name: str,
    *,
    adjust_threshold: float = DEFAULT_ADJUST_THRESHOLD,
    seed: int = 0,
    host_lanes: bool = False,
    options: Mapping[str, Any] | None = None,
) -> Policy:
    """The policy called ``name`` (one of :data:`POLICY_NAMES`).

    ``adjust_threshold`` is Compass's keep-the-plan factor; ``seed`` seeds ``random``;
    ``options`` changes ``compass``'s settings (:data:`VARIANT_OPTIONS`, for ablations);
    ``host_lanes`` tells Compass's planner that model-less tasks run off the GPU lanes (see
    :class:`~compass.sched.planner.CompassPolicy`). Policies with per-instance state
    (``round_robin``, ``random``, the cost caches) should be made once per worker and reused.
    """
    if not isinstance(adjust_threshold, int | float) or not adjust_threshold > 0:
        raise ConfigError(f"adjust_threshold must be > 0, got {adjust_threshold!r}")
    if options:
        return _compass_variant(name, adjust_threshold, host_lanes, options)
    if name in _COMPASS_VARIANTS:
        switches = _COMPASS_VARIANTS[name]
        return CompassPolicy(
            name,
            CompassOptions(adjust_threshold=adjust_threshold, host_lanes=host_lanes, **switches),
        )
    if name == "heft":
        return CompassPolicy(name, HEFT)
    if name == "hash":
        return HashPolicy()
    if name == "random":
        return RandomPolicy(seed)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "jsq":
        return JoinShortestQueuePolicy()
    if name == "jit":
        return ModelLocalityPolicy()
    raise ConfigError(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")


#: compass and its ablations: what each turns off (the workers' ``adjust_threshold`` and
#: ``host_lanes`` apply to all of them)
_COMPASS_VARIANTS: Mapping[str, Mapping[str, bool]] = {
    "compass": {},
    "compass_nocache": {"use_cache": False},
    "compass_noload": {"use_load": False},
    "compass_noadjust": {"dynamic": False},
    "central": {"central": True},
    "compass-chained": {"chained": True},
}

#: classic HEFT: rank order, idle workers, transfers but no model cost, static (the workers'
#: threshold and host lanes do not apply)
HEFT = CompassOptions(
    use_load=False,
    use_cache=False,
    dynamic=False,
    oldest_job_first=False,
    warms_cache=False,
    batch_aware=False,
    deadline_slack=None,
)

#: the :class:`CompassOptions` settings ``make_policy(options=...)`` may change
VARIANT_OPTIONS = frozenset(
    {
        "use_load",
        "use_cache",
        "dynamic",
        "adjust_threshold",
        "oldest_job_first",
        "warms_cache",
        "counts_siblings",
        "moves_joins",
        "batch_aware",
        "deadline_slack",
        "progress_rank",
        "count_likely_path",
        "likely_prefetch",
        "rank_yardstick",
        "chained",
    }
)


def _compass_variant(
    name: str, threshold: float, host_lanes: bool, options: Mapping[str, Any]
) -> Policy:
    """``compass`` with some of its settings changed (for measuring each one's worth)."""
    if name != "compass":
        raise ConfigError(f"policy options apply to 'compass' only, not {name!r}")
    unknown = sorted(set(options) - VARIANT_OPTIONS)
    if unknown:
        raise ConfigError(
            f"unknown compass option {unknown[0]!r}; known: {', '.join(sorted(VARIANT_OPTIONS))}"
        )
    settings: dict[str, Any] = {"adjust_threshold": threshold, **options}
    return CompassPolicy(name, CompassOptions(host_lanes=host_lanes, **settings))


def worker_seed(seed: int, worker: str) -> int:
    """The seed of ``worker``'s own ``random`` policy: every worker draws its own sequence
    (one shared seed would make every ingress pick the same workers in the same order)."""
    return zlib.crc32(f"{seed}\x00{worker}".encode())


#: a job id's ingress instance (``<ingress>-<instance>-<n>``: 12 hex digits)
_INSTANCE = re.compile(r"-[0-9a-f]{12}(?=-\d+$)")


def hash_worker(job_id: str, task: str, names: tuple[str, ...]) -> str:
    """A stable hash of task and job id onto ``names`` (the same on every worker and run).

    The id's instance part is left out: it is random per worker process, and the hash must
    place the n-th job of an ingress alike in every run, real or simulated."""
    if not names:
        raise WorkerUnavailable(f"no workers in the view to place task {task!r} on")
    key = f"{task}\x00{_INSTANCE.sub('', job_id)}".encode()
    return names[zlib.crc32(key) % len(names)]


class _StaticPolicy:
    """A plan that adjustment never changes, unless its worker has left the view.

    Its finish estimates (:meth:`finish_times`) count queues and model fetches, and every task
    on a GPU lane: the paper's workers, which the baselines run on as they were. It never
    moves a join (:meth:`joins_fed_by` is empty).
    """

    name = "static"
    dynamic = False
    # the paper's baselines run on its workers as they were: FIFO queues, caches filled on
    # demand, every task on the GPU lanes
    oldest_job_first = False
    deadline_slack: float | None = None
    warms_cache = False
    host_lanes = False
    counts_siblings = True
    # every policy's workers batch; knowing where a task would join a batch is compass's
    batch_aware = False

    def __init__(self) -> None:
        self._costs = CostCache()

    def finish_times(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> npt.NDArray[np.float64]:
        """See :class:`~compass.sched.policy.Policy`."""
        if not view.names:
            raise WorkerUnavailable(f"no workers in the view to place task {task!r} on")
        costs = self._costs.for_view(job.workflow, profiles, view)
        return finish_now(costs, job, job.workflow.index[task], plan, view, now)[0]

    def joins_fed_by(self, wf: Workflow, finished: str) -> tuple[str, ...]:
        """None: a baseline keeps every join where it was planned."""
        return ()

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
        """Nothing moves (:meth:`joins_fed_by` is empty)."""
        return {}

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """The planned worker, or a hashed one when it has left the view."""
        planned = plan.get(task)
        if planned is not None and planned in view.positions:
            return planned
        return hash_worker(job.job_id, task, view.names)

    def planner(self, view: ViewSnapshot) -> str | None:
        """None: the ingress plans."""
        return None


class HashPolicy(_StaticPolicy):
    """Each task on the worker its name and the job id hash to; blind to load and cache."""

    name = "hash"

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`~compass.sched.policy.Policy`."""
        names = view.names
        return {t: hash_worker(job.job_id, t, names) for t in job.workflow.order}


class RandomPolicy(_StaticPolicy):
    """Each task on a uniformly random worker (seeded: runs are reproducible)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._rng = random.Random(seed)

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`~compass.sched.policy.Policy`."""
        names = view.names
        if not names:
            raise WorkerUnavailable(f"no workers in the view to plan job {job.job_id!r} on")
        return {t: names[self._rng.randrange(len(names))] for t in job.workflow.order}


class RoundRobinPolicy(_StaticPolicy):
    """Tasks dealt to the workers in name order, continuing from job to job."""

    name = "round_robin"

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`~compass.sched.policy.Policy`."""
        names = view.names
        if not names:
            raise WorkerUnavailable(f"no workers in the view to plan job {job.job_id!r} on")
        plan = {}
        for t in job.workflow.order:
            plan[t] = names[self._next % len(names)]
            self._next += 1
        self._next %= len(names)
        return plan


class JoinShortestQueuePolicy(_StaticPolicy):
    """The paper's JIT baseline: a hash plan, then every non-join task goes to the shortest
    queue when it becomes ready (roots at plan time, the others in :meth:`adjust`). Joins
    keep their hashed worker. Ties go to the planned worker, then the lowest index."""

    name = "jsq"
    dynamic = True

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`~compass.sched.policy.Policy`."""
        wf = job.workflow
        names = view.names
        plan = {t: hash_worker(job.job_id, t, names) for t in wf.order}
        if len(wf.roots) == 1:
            root = wf.roots[0]
            plan[root] = _shortest(view.wait_s, view, plan[root])
            return plan
        # several roots start together: count each one in the queue the next one sees
        profiles.add_workflow(wf)
        waits = view.wait_s.copy()
        for root in wf.roots:
            worker = _shortest(waits, view, plan[root])
            plan[root] = worker
            waits[view.positions[worker]] += profiles.exec_s(wf.name, root, worker)
        return plan

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """The planned worker for a join (its hashed one when the plan's has left the view);
        for any other task :meth:`_move`'s choice."""
        planned = plan.get(task)
        if planned is None or planned not in view.positions:
            planned = hash_worker(job.job_id, task, view.names)
        if job.workflow.is_join(task):
            return planned
        return self._move(job, task, plan, planned, view, profiles)

    def _move(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        planned: str,
        view: ViewSnapshot,
        profiles: Profiles,
    ) -> str:
        """Where a ready non-join task goes: the shortest queue (``planned`` on a tie)."""
        return _shortest(view.wait_s, view, planned)


class ModelLocalityPolicy(JoinShortestQueuePolicy):
    """Cascade's JIT with model locality, the paper's strongest baseline: ``jsq`` with the
    shortest queue replaced by the cheapest start. A hash plan; then every non-join task, when
    it becomes ready (roots at plan time, the others in :meth:`adjust`), goes to the worker
    with the smallest::

        wait(w) + fetch(w) + transfer(w)

    ``fetch``: the model's host-to-device copy unless it is resident, loading or coming there
    (compass's own pricing, :func:`~compass.sched.cost.fetch_row`: doubled where free cache
    bytes are short, infinite where the cache is too small); ``transfer``: moving the task's
    input from the worker holding it (a root's: the job's inputs, at the ingress). Ties go to
    the task's current worker (the planned one), then the lowest index. Joins keep their
    hashed worker. Everything else (FIFO queues, no cache warming, every task on the GPU
    lanes) is ``jsq``'s, so the two differ only in counting model locality and transfers.
    """

    name = "jit"

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """See :class:`~compass.sched.policy.Policy`."""
        wf = job.workflow
        names = view.names
        plan = {t: hash_worker(job.job_id, t, names) for t in wf.order}
        costs = self._costs.for_view(wf, profiles, view)
        ingress = [view.positions.get(job.ingress, -1)]
        waits = view.wait_s
        free = view.free_bytes
        coming: dict[str, npt.NDArray[np.bool_]] = {}
        last = len(wf.roots) - 1
        for k, root in enumerate(wf.roots):
            t = wf.index[root]
            model = costs.models[t]
            have = None if model is None else coming.get(model, view.holds(model))
            root_bytes = job.input_bytes or costs.input_bytes[t]
            cost = _start_cost(costs, t, ingress, [float(root_bytes)], waits, have, free, view)
            j = _cheapest(cost, view.positions[plan[root]])
            plan[root] = names[j]
            if k == last:
                break
            # several roots start together: count each one where the next one looks
            if waits is view.wait_s:
                waits = waits.copy()
            waits[j] += float(costs.exec_rows[t][j])
            if have is not None and model is not None and not have[j]:
                have = have.copy()
                have[j] = True
                coming[model] = have
                if free is view.free_bytes:
                    free = free.copy()
                free[j] -= costs.model_bytes[t]
        return plan

    def _move(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        planned: str,
        view: ViewSnapshot,
        profiles: Profiles,
    ) -> str:
        """The cheapest start (see the class docstring), ``planned`` on a tie."""
        wf = job.workflow
        costs = self._costs.for_view(wf, profiles, view)
        t = wf.index[task]
        preds = costs.preds[t]
        if preds:
            order = wf.order
            sources = [view.positions.get(plan.get(order[p], ""), -1) for p in preds]
            nbytes = [costs.out_bytes[p] for p in preds]
        else:
            sources = [view.positions.get(job.ingress, -1)]
            nbytes = [float(job.input_bytes or costs.input_bytes[t])]
        model = costs.models[t]
        have = None if model is None else view.holds(model)
        cost = _start_cost(costs, t, sources, nbytes, view.wait_s, have, view.free_bytes, view)
        return view.names[_cheapest(cost, view.positions[planned])]


def _start_cost(
    costs: WorkflowCosts,
    t: int,
    sources: list[int],
    nbytes: list[float],
    waits: npt.NDArray[np.float64],
    have: npt.NDArray[np.bool_] | None,
    free: npt.NDArray[np.int64],
    view: ViewSnapshot,
) -> npt.NDArray[np.float64]:
    """``wait + fetch + transfer`` of task ``t`` on every worker: the inputs at ``sources``
    (-1: outside the view) of ``nbytes`` each, the model where ``have`` says (None: none)."""
    row = costs.transfer.row
    # a task waits for its slowest input
    cost = row(sources[0], nbytes[0], 0.0)
    for src, size in zip(sources[1:], nbytes[1:], strict=True):
        np.maximum(cost, row(src, size, 0.0), out=cost)
    cost += waits
    if have is not None:
        cost += fetch_row(costs, t, have, free, view.capacity_bytes, view.min_capacity_bytes)
    return cost


def _cheapest(cost: npt.NDArray[np.float64], prefer: int) -> int:
    """The index of the smallest ``cost``; ``prefer`` when it ties (or nothing is finite)."""
    j = int(cost.argmin())
    best = float(cost[j])
    if best == math.inf or float(cost[prefer]) <= best + TIE_S:
        return prefer
    return j


def _shortest(waits: npt.NDArray[np.float64], view: ViewSnapshot, prefer: str) -> str:
    j = int(waits.argmin())
    i = view.positions[prefer]
    if float(waits[i]) <= float(waits[j]) + TIE_S:
        return prefer
    return view.names[j]
