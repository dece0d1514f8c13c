"""What one simulation runs (:class:`SimSettings`), and how each simulated worker is configured.

A simulated worker is configured as ``compass worker start`` configures a real one: the
simulator makes a :class:`~compass.config.WorkerConfig` of its settings
(:meth:`SimSettings.worker_config`), and its core's options of that with
:func:`~compass.core.options.core_options`, the function the asyncio worker uses. The defaults
are a worker's, but where :data:`compass.config.SIM_WORKER` differs on purpose, in that one
place, each difference with why (``tests/unit/test_config_sources.py`` fails on any other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from compass.config import SIM_WORKER, WorkerConfig

if TYPE_CHECKING:
    from compass.elastic.replicate import ReplicaConfig
    from compass.workflow.spec import Workload

__all__ = [
    "NO_PREEMPTION",
    "NO_STEP_BATCHING",
    "PLAN_ADMISSION",
    "SimSettings",
    "base_policy",
    "with_learned_admission",
    "with_preemption",
    "with_step_batching",
]

#: a policy's name with this suffix runs without preemption where the others have it on
#: (``--preempt both``: "compass" and "compass (no preemption)" side by side)
NO_PREEMPTION = " (no preemption)"
#: a policy's name with this suffix runs without step batching: the workload's step-wise tasks
#: run one job each (``--step-batch both``)
NO_STEP_BATCHING = " (no step batching)"
#: a policy's name with this suffix admits by its plan's estimate alone where the others learn
#: what share of each kind of job to admit (``--learned-admission both``)
PLAN_ADMISSION = " (plan admission)"


def base_policy(name: str) -> str:
    """The policy a (possibly suffixed) name runs: ``"jsq (no preemption)"`` is ``"jsq"``."""
    return (
        name.removesuffix(PLAN_ADMISSION).removesuffix(NO_STEP_BATCHING).removesuffix(NO_PREEMPTION)
    )


def with_preemption(policies: tuple[str, ...], mode: str) -> tuple[tuple[str, ...], bool]:
    """``--preempt on|off|both``: the policies to run and whether preemption is on for the
    names without :data:`NO_PREEMPTION` (with ``both`` each policy also runs as
    ``"NAME (no preemption)"``)."""
    if mode == "both":
        return (*policies, *(p + NO_PREEMPTION for p in policies)), True
    return policies, mode == "on"


def with_learned_admission(policies: tuple[str, ...], mode: str) -> tuple[tuple[str, ...], str]:
    """``--learned-admission on|off|both``: the policies to run and the admission of the names
    without :data:`PLAN_ADMISSION` (with ``both`` each policy also runs as
    ``"NAME (plan admission)"``)."""
    if mode == "both":
        return (*policies, *(p + PLAN_ADMISSION for p in policies)), "learned"
    return policies, "learned" if mode == "on" else "plan"


def with_step_batching(policies: tuple[str, ...], mode: str) -> tuple[str, ...]:
    """``--step-batch on|off|both``: the policies to run, those without step batching named
    ``"NAME (no step batching)"`` (with ``both``, each policy runs both ways)."""
    if mode == "on":
        return policies
    off = tuple(p + NO_STEP_BATCHING for p in policies)
    return (*policies, *off) if mode == "both" else off


@dataclass(frozen=True, slots=True)
class SimSettings:
    """One simulation: ``workers`` simulated workers (``w0`` .. ``w{n-1}``, as a LocalCluster
    names them) under ``policy``; see :func:`~compass.sim.engine.simulate`.

    ``heartbeat_s``: how often peers' state reaches a mesh view; ``staleness_s`` (default
    ``heartbeat_s``) how old the peers' state in a view is at least; ``cache_bytes`` (default
    the spec's GPU memory) is each worker's cache, in slabs of ``slab_bytes``; ``seed`` seeds
    the ``random`` policy and a bounded view's sampling. ``prefetch=False`` turns off every
    speculative load; ``warm=False`` only the warming of idle caches. ``host_lanes`` > 0 runs
    model-less tasks on that many host lanes per worker, off the GPU lanes (``compass worker
    start --host-lanes``). ``prefetch_evicts=False`` prefetches into free slabs only (the
    paper's rule); ``policy_options`` changes compass's settings
    (:func:`~compass.sched.make_policy`'s ``options``). ``warm_start``: the first job arrives
    once the idle workers' warming has settled (as ``compass bench e2e`` waits for it on a
    real cluster), not at time 0 of a cold cluster.

    ``ingress`` says which worker a job enters at: ``"client"``, client ``i`` submits to
    ``w{i % workers}``; ``"spread"``, the ``k``-th job enters at ``w{k % workers}``, as a load
    balancer would deal them; ``"auto"``, spread from
    :data:`~compass.sim.modes.SPREAD_FROM` workers on. ``view`` says what a planner sees:
    ``"mesh"``, every worker; ``"bounded"``, for each job, its candidates: ``candidates``
    sampled workers and at most ``holders`` holders per model the job needs (None: all).
    ``preempt``: scheduling at step boundaries (:mod:`compass.core.preempt`).
    ``step_batch``: step-wise tasks that declare a batch batch their steps (continuous
    batching, :mod:`compass.core.lanes`); off, each runs one job. ``admission``: how an
    ingress admits a job with a deadline (:attr:`~compass.config.SchedConfig.admission`).
    ``replicate``: hot models warmed ahead of need (:mod:`compass.sim.replicas`; None: off).
    """

    workers: int
    policy: str
    heartbeat_s: float = SIM_WORKER.sched.heartbeat_ms / 1000.0
    staleness_s: float | None = None
    lanes: int = SIM_WORKER.lanes
    host_lanes: int = SIM_WORKER.host_lanes
    prefetch: bool = True
    prefetch_evicts: bool = SIM_WORKER.cache.prefetch_evicts
    warm: bool = SIM_WORKER.sched.warm
    cache_bytes: int | None = SIM_WORKER.cache.capacity_bytes
    slab_bytes: int = SIM_WORKER.cache.slab_bytes
    seed: int = 0
    policy_options: Mapping[str, Any] | None = None
    warm_start: bool = False
    ingress: str = "auto"
    view: str = SIM_WORKER.sched.view
    candidates: int = SIM_WORKER.sched.candidates
    holders: int | None = SIM_WORKER.sched.holders
    preempt: bool = SIM_WORKER.sched.preempt
    step_batch: bool = True
    admission: str = SIM_WORKER.sched.admission
    replicate: ReplicaConfig | None = SIM_WORKER.replicate

    def __post_init__(self) -> None:
        policy = self.policy
        if policy.endswith(PLAN_ADMISSION):  # that policy, admitting by its plan alone
            policy = policy.removesuffix(PLAN_ADMISSION)
            object.__setattr__(self, "admission", "plan")
        if policy.endswith(NO_STEP_BATCHING):  # that policy, step batching off
            policy = policy.removesuffix(NO_STEP_BATCHING)
            object.__setattr__(self, "step_batch", False)
        if policy.endswith(NO_PREEMPTION):  # that policy, preemption off
            policy = policy.removesuffix(NO_PREEMPTION)
            object.__setattr__(self, "preempt", False)
        object.__setattr__(self, "policy", policy)

    def worker_config(self, workload: Workload) -> WorkerConfig:
        """Each simulated worker's configuration: :data:`SIM_WORKER` with these settings (a
        ConfigError for what a worker would refuse, e.g. a cache smaller than a slab)."""
        capacity = workload.cluster.gpu_memory_bytes if self.cache_bytes is None else None
        cache = replace(
            SIM_WORKER.cache,
            capacity_bytes=capacity if capacity is not None else self.cache_bytes,
            slab_bytes=self.slab_bytes,
            prefetch_depth=SIM_WORKER.cache.prefetch_depth if self.prefetch else 0,
            prefetch_evicts=self.prefetch_evicts,
        )
        # warming is a speculative load: no prefetching, no warming
        sched = replace(
            SIM_WORKER.sched,
            warm=self.warm and self.prefetch,
            preempt=self.preempt,
            admission=self.admission,
        )
        return replace(
            SIM_WORKER, lanes=self.lanes, host_lanes=self.host_lanes, cache=cache, sched=sched,
            replicate=self.replicate,
        )  # fmt: skip
