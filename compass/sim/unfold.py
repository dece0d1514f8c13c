"""The simulator's share of workflows decided at run time: a job's best time is that of the
tasks it actually ran (a job that looped twice is not measured against one that looped six
times)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from compass.workflow.best import best_time_s
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles
from compass.workflow.unfold import ran_workflow

__all__ = ["RanBest"]


class RanBest:
    """Best times of the sub-workflows jobs ran, computed as :func:`best_time_s` computes a
    workflow's, and kept per set of tasks (a workload's jobs run few distinct ones)."""

    def __init__(self, profiles: Profiles, *, lanes: int, host_lanes: int) -> None:
        self._profiles = profiles
        self._lanes, self._host_lanes = lanes, host_lanes
        self._known: dict[tuple[str, frozenset[str]], float] = {}

    def __call__(self, workflow: Workflow, ran: Iterable[str]) -> float:
        key = (workflow.name, frozenset(ran))
        best = self._known.get(key)
        if best is None:
            sub = ran_workflow(workflow, key[1])
            best = best_time_s(sub, self._profiles, lanes=self._lanes, host_lanes=self._host_lanes)
            best = self._known[key] = best or math.inf
        return best
