"""Cache warming: which models an idle worker should bring into its free cache space.

A worker whose lanes are idle and whose cache has free slabs loads, one at a time, the model the
cluster holds least in proportion to its demand, so the first tasks of each model find it
resident somewhere instead of all missing at once (on a cold start, after a worker joins, after
models were dropped). Only free space is used: warming never evicts (see
:meth:`compass.cache.policy.CacheCore.warm_candidate`).

Demand is GPU-seconds per job: the expected execution time of every task using the model,
summed over the workflows, each workflow counted as equally frequent. Idle peers looking at the
same view would all pick the same model; a per-worker hash breaks the ties so they spread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["model_demand", "warm_order"]


def model_demand(workflows: Iterable[Workflow], profiles: Profiles) -> dict[str, float]:
    """Expected seconds of use of each model per job of every workflow (current estimates)."""
    demand: dict[str, float] = {}
    for wf in workflows:
        profiles.add_workflow(wf)
        for task in wf.order:
            model = wf.tasks[task].model
            if model is not None:
                demand[model] = demand.get(model, 0.0) + profiles.exec_s(wf.name, task)
    return demand


def warm_order(view: ViewSnapshot, worker: str, demand: Mapping[str, float]) -> list[str]:
    """Models ``worker`` neither holds nor is loading (per ``view``), most wanted first.

    Wanted means few workers hold (or are loading) the model for its demand; a model with no
    demand is never wanted. Ties go by a hash of the worker's and the model's names, different
    on every worker.
    """
    i = view.positions.get(worker, -1)
    ranked: list[tuple[float, int, str]] = []
    for model, seconds in demand.items():
        if not seconds > 0:
            continue
        held = view.holds(model)
        if i >= 0 and bool(held[i]):
            continue
        # a real hash: crc32 is linear, so close names would order alike on every worker
        key = f"{worker}\x00{model}".encode()
        tie = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        ranked.append((float(held.sum()) / seconds, tie, model))
    ranked.sort()
    return [model for _, _, model in ranked]
