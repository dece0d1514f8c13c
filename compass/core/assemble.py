"""The worker core assembled: :func:`build_core` makes a core and its lanes from
:class:`~compass.core.options.CoreOptions`, the one way the asyncio worker and the simulator
make theirs (so that they cannot drift apart).
"""

from __future__ import annotations

from collections.abc import Mapping

from compass.cache.policy import CacheCore
from compass.core.events import ViewPort
from compass.core.lanes import Lanes
from compass.core.options import CoreOptions
from compass.core.state import WorkerCore
from compass.core.stats import WorkerStats
from compass.errors import UnknownWorkflow
from compass.sched import Policy
from compass.sched.replicas import model_demand, warm_order
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["CoreOptions", "build_core"]


def build_core(
    name: str,
    *,
    workflows: Mapping[str, Workflow],
    policy: Policy,
    profiles: Profiles,
    view: ViewPort,
    cache: CacheCore,
    options: CoreOptions = CoreOptions(),
    stats: WorkerStats | None = None,
) -> WorkerCore:
    """A worker core and its lanes over ``cache``, for the worker and the simulator alike."""
    demand = (
        model_demand(workflows.values(), profiles) if options.warm and policy.warms_cache else None
    )

    def wanted(now: float) -> list[str]:
        """Models worth warming here, most wanted first (:func:`warm_order`)."""
        return warm_order(view.snapshot(now), name, lanes.demand)

    lanes = Lanes(
        lanes=options.lanes,
        host_lanes=options.host_lanes,
        cache=cache,
        prefetch_depth=options.prefetch_depth,
        prefetch_evicts=options.prefetch_evicts,
        demand=demand,
        max_stuck=options.max_stuck,
        wanted=wanted,
    )
    lanes.preempt = options.preempt

    def workflow(wanted_name: str) -> Workflow:
        try:
            return workflows[wanted_name]
        except KeyError:
            known = ", ".join(sorted(workflows)) or "none"
            raise UnknownWorkflow(f"unknown workflow {wanted_name!r} (known: {known})") from None

    return WorkerCore(
        name, workflow=workflow, policy=policy, profiles=profiles, view=view, lanes=lanes,
        options=options, stats=stats,
    )  # fmt: skip
