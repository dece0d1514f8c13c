"""Workflows (DAGs of tasks), workload files and the online profiles the planner reads."""

from __future__ import annotations

from compass.workflow.dag import Task, TaskProfile, Workflow
from compass.workflow.profile import Profiles
from compass.workflow.spec import (
    ArrivalSpec,
    ClusterSpec,
    Workload,
    load_workload,
    parse_workload,
)

__all__ = [
    "ArrivalSpec",
    "ClusterSpec",
    "Profiles",
    "Task",
    "TaskProfile",
    "Workflow",
    "Workload",
    "load_workload",
    "parse_workload",
]
