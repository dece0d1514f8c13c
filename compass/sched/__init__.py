"""Placement: the cluster view, cost tables, the Compass planner and the baseline policies.

Everything here is synchronous and pure (numpy, no I/O): the worker calls it on its hot path
and the simulator reuses it unchanged.
"""

from __future__ import annotations

from compass.sched.adjust import adjust_successors, record_plan
from compass.sched.cost import CostCache, TransferModel, WorkflowCosts, finish_row
from compass.sched.eft import FinishTerms, plan_eft
from compass.sched.heartbeat import Heartbeat
from compass.sched.planner import (
    DEFAULT_ADJUST_THRESHOLD,
    DEFAULT_DEADLINE_SLACK,
    CompassOptions,
    CompassPolicy,
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
from compass.sched.policy import JobInfo, Policy
from compass.sched.replicas import model_demand, warm_order
from compass.sched.snapshot import ViewSnapshot
from compass.sched.view import ClusterView

__all__ = [
    "DEFAULT_ADJUST_THRESHOLD",
    "DEFAULT_DEADLINE_SLACK",
    "POLICY_NAMES",
    "ClusterView",
    "CompassOptions",
    "CompassPolicy",
    "CostCache",
    "FinishTerms",
    "HashPolicy",
    "Heartbeat",
    "JobInfo",
    "JoinShortestQueuePolicy",
    "ModelLocalityPolicy",
    "Policy",
    "RandomPolicy",
    "RoundRobinPolicy",
    "TransferModel",
    "ViewSnapshot",
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
