"""Goodput past capacity: jobs answered within their deadline, at offered loads beyond what a
cluster carries, with and without shedding.

Every job of a run gets a deadline of ``deadline_x`` times its workflow's computed best time
(of a workflow with choices, its likely path's: the choices are made later), and a fraction
``priority_mix`` of them (drawn per job from the run's seed) priority 1. With shedding on, the
ingress refuses a job its plan cannot finish in time and a lane drops a task whose job can no
longer make it (:mod:`compass.sched.deadline`, the same for every policy);
off, every job runs to the end (``on_miss="finish"``). Goodput is the rate of jobs answered
within their deadline, in multiples of the workload's rate (offered load times attainment);
attainment, the fraction of submitted jobs so answered. Sans-IO, like the rest of the
simulator: the CLI prints and plots what it returns.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import numpy as np

from compass.errors import ConfigError
from compass.objective import Objective
from compass.sim.arrivals import PROCESSES, workload_arrivals
from compass.sim.engine import simulate
from compass.sim.result import JobRecord, TaskRecord
from compass.sim.settings import SimSettings
from compass.workflow.best import best_time_s
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload
from compass.workflow.unfold import likely_workflow

__all__ = ["GoodputRun", "goodput_for_workload", "priorities", "run_summary"]

#: (policy, shed, seed, load) -> the run's jobs and task runs, for tests and callers that
#: reuse runs
GoodputRun = Callable[[str, bool, int, float], tuple[Sequence[JobRecord], Sequence[TaskRecord]]]


def priorities(jobs: int, mix: float, seed: int) -> list[int]:
    """Each of ``jobs`` arrivals' priority: 1 for a fraction ``mix`` of them (drawn from
    ``seed``, the same whatever the policy, in the simulator and on a real cluster), else 0."""
    if not 0 <= mix <= 1:
        raise ConfigError(f"--priority-mix must be a fraction in [0, 1], got {mix!r}")
    draw = random.Random(seed * 1_000_003 + 17)
    return [1 if draw.random() < mix else 0 for _ in range(jobs)]


def run_summary(
    jobs: Sequence[JobRecord], load: float, tasks: Sequence[TaskRecord] = ()
) -> dict[str, Any]:
    """One run's goodput (multiples of the workload's rate), attainment (overall and per
    priority), counts of jobs refused and dropped, and ``wasted_share``: of the lane time its
    ``tasks`` took (their model's fetch and their run), the share spent on jobs admitted and
    then dropped (their deadline missed on the way)."""
    n = len(jobs)
    dropped = {j.id for j in jobs if j.outcome == "dropped"}
    lane_s = sum(t.fetch_s + t.exec_s for t in tasks)
    wasted_s = sum(t.fetch_s + t.exec_s for t in tasks if t.job_id in dropped)
    met = sum(1 for j in jobs if j.met)
    by_priority: dict[str, float] = {}
    ttfo_p99: dict[str, float | None] = {}
    for level in sorted({j.priority for j in jobs}):
        mine = [j for j in jobs if j.priority == level]
        by_priority[str(level)] = sum(1 for j in mine if j.met) / len(mine)
        firsts = [j.ttfo_s for j in mine if j.ttfo_s is not None]
        ttfo_p99[str(level)] = float(np.percentile(firsts, 99)) if firsts else None
    return {
        "goodput": load * met / n if n else 0.0,
        "attainment": met / n if n else 0.0,
        "attainment_by_priority": by_priority,
        "refused": sum(1 for j in jobs if j.outcome == "unreachable"),
        "dropped": len(dropped),
        "wasted_share": wasted_s / lane_s if lane_s > 0 else 0.0,
        # of the jobs answered, by priority: arrival to their first output (their answer for
        # a job of plain sinks), 99th percentile in seconds
        "ttfo_p99_by_priority": ttfo_p99,
    }


def simulator_goodput_run(
    workload: Workload,
    *,
    workers: int,
    jobs: int,
    deadline_x: float,
    priority_mix: float = 0.0,
    arrival: str = "poisson",
    cv: float = 1.0,
    sim: Mapping[str, Any] = MappingProxyType({}),
) -> GoodputRun:
    """A :data:`GoodputRun` that simulates ``jobs`` arrivals of ``workload`` on ``workers``,
    each with its deadline and priority; deterministic in its seed. ``sim``: fields of every
    run's :class:`~compass.sim.settings.SimSettings` (``host_lanes``, ``preempt``...)."""
    if not deadline_x >= 1:
        raise ConfigError(
            f"--deadline-x must be >= 1 (no job beats its best time), got {deadline_x!r}"
        )
    if not 0 <= priority_mix <= 1:
        raise ConfigError(f"--priority-mix must be a fraction in [0, 1], got {priority_mix!r}")
    if arrival not in PROCESSES:
        raise ConfigError(f"unknown arrival process {arrival!r}; known: {', '.join(PROCESSES)}")
    profiles = Profiles.from_workload(workload)
    # a workflow with choices: its typical job's best time (the choices are not yet made)
    best = {n: best_time_s(likely_workflow(wf), profiles) for n, wf in workload.workflows.items()}

    def run(
        policy: str, shed: bool, seed: int, load: float
    ) -> tuple[Sequence[JobRecord], Sequence[TaskRecord]]:
        arrivals = workload_arrivals(workload, jobs, process=arrival, load=load, cv=cv, seed=seed)
        levels = priorities(len(arrivals), priority_mix, seed)
        objective = [
            Objective(deadline_s=deadline_x * best[a.workflow], priority=level, finish=not shed)
            for a, level in zip(arrivals, levels, strict=True)
        ]
        arrivals = [replace(a, objective=o) for a, o in zip(arrivals, objective, strict=True)]
        result = simulate(
            workload,
            SimSettings(workers=workers, policy=policy, seed=seed, **sim),
            arrivals,
        )
        return result.jobs, result.tasks

    return run


def goodput_for_workload(
    run: GoodputRun,
    *,
    policies: Sequence[str],
    loads: Sequence[float],
    seeds: Sequence[int],
    shed: Sequence[bool] = (True,),
    config: Mapping[str, Any] | None = None,
    progress: Callable[[str, int, float], None] | None = None,
) -> dict[str, Any]:
    """Goodput, attainment, attainment by priority, refused and dropped per policy and load
    (mean, min and max over ``seeds`` where a number), for each of ``shed``. A policy run
    without shedding is named ``"<policy> (no shedding)"`` when both are asked for."""
    if not loads or not seeds or not policies:
        raise ConfigError("goodput needs at least one policy, load and seed")
    out: dict[str, Any] = {
        "config": {
            **(config or {}),
            "policies": list(policies),
            "loads": list(loads),
            "seeds": list(seeds),
            "shed": list(shed),
        },
        "goodput": {},
        "attainment": {},
        "attainment_by_priority": {},
        "refused": {},
        "dropped": {},
        "wasted_share": {},
        "ttfo_p99_by_priority": {},
    }
    for policy in policies:
        for shedding in shed:
            name = policy if shedding or len(shed) == 1 else f"{policy} (no shedding)"
            for key in ("goodput", "attainment", "attainment_by_priority", "refused", "dropped",
                        "wasted_share", "ttfo_p99_by_priority"):  # fmt: skip
                out[key][name] = {}
            for load in loads:
                runs = []
                for seed in seeds:
                    jobs, tasks = run(policy, shedding, seed, load)
                    runs.append(run_summary(jobs, load, tasks))
                    if progress is not None:
                        progress(name, seed, load)
                at = format(load, "g")
                for key in ("goodput", "attainment"):
                    values = [r[key] for r in runs]
                    out[key][name][at] = {
                        "mean": float(np.mean(values)), "min": min(values), "max": max(values),
                    }  # fmt: skip
                levels = sorted({p for r in runs for p in r["attainment_by_priority"]})
                out["attainment_by_priority"][name][at] = {
                    p: float(np.mean([r["attainment_by_priority"].get(p, 0.0) for r in runs]))
                    for p in levels
                }
                out["ttfo_p99_by_priority"][name][at] = {
                    p: _mean([r["ttfo_p99_by_priority"].get(p) for r in runs]) for p in levels
                }
                for key in ("refused", "dropped", "wasted_share"):
                    out[key][name][at] = float(np.mean([r[key] for r in runs]))
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the known ``values`` (None: none known)."""
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None
