"""Placement: the cluster view, cost tables, the Compass planner and the baseline policies.

Everything here is synchronous and pure (numpy, no I/O): the worker calls it on its hot path
and the simulator reuses it unchanged.
"""

from __future__ import annotations

from compass.sched.cost import CostCache, TransferModel, WorkflowCosts, finish_row
from compass.sched.planner import (
    DEFAULT_ADJUST_THRESHOLD,
    DEFAULT_DEADLINE_SLACK,
    CompassPolicy,
    JobInfo,
    Policy,
    adjust_successors,
    plan_eft,
    record_plan,
)
from compass.sched.policies import (
    POLICY_NAMES,
    HashPolicy,
    JoinShortestQueuePolicy,
    ModelLocalityPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    hash_worker,
    make_policy,
)
from compass.sched.replicas import model_demand, warm_order
from compass.sched.view import ClusterView, ViewSnapshot, WorkerState

__all__ = [
    "DEFAULT_ADJUST_THRESHOLD",
    "DEFAULT_DEADLINE_SLACK",
    "POLICY_NAMES",
    "ClusterView",
    "CompassPolicy",
    "CostCache",
    "HashPolicy",
    "JobInfo",
    "JoinShortestQueuePolicy",
    "ModelLocalityPolicy",
    "Policy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "TransferModel",
    "ViewSnapshot",
    "WorkerState",
    "WorkflowCosts",
    "adjust_successors",
    "finish_row",
    "hash_worker",
    "make_policy",
    "model_demand",
    "plan_eft",
    "record_plan",
    "warm_order",
]
