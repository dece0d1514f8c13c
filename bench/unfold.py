"""``compass bench unfold`` (or ``python -m bench.unfold``): what each lever of planning a
workflow decided at run time is worth, against each step run as a job of its own (issue 38).

For each workload (default: ``bench/workloads/agent-loop.json``, on which the levers were
built, and ``bench/workloads/triage-rag.json``, never used to tune them), the capacity at
median2 / p95x3 / p99x5 of each variant is searched in the simulator over the same seeds
(:func:`compass.sim.capacity.capacity_for_workload`): ``compass`` as it ships, ``compass``
without its queue rank by progress (``progress_rank``: a task ranks by the expected best
time of a job that reached it, not by its workflow's likely path's), ``compass`` counting a
job's load one step at a time rather than its likely path at admission
(``count_likely_path`` off, as ``compass-chained`` does), ``compass`` without prefetch on the
likely branch (``likely_prefetch``: a decision task's likely successors' models load while it
runs, :mod:`compass.core.likely`), ``compass`` and ``compass-chained`` weighing a task at step
boundaries against its workflow's likely path (``rank_yardstick`` off: "path yardstick"),
``compass-chained``, and ``jit``. A variant's name ending in ", preempt" runs it with
preemption at step boundaries (for the workloads whose tasks declare steps, e.g.
``agent-loop-steps.json``). The table gives each variant's mean capacity and the mean of the
per-seed ratios of ``compass`` (or ``compass, preempt`` where it comes first) over it; the
JSON keeps every seed's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compass.sim import capacity as cap
from compass.workflow.spec import load_workload

from .report import machine, print_table, write_json

__all__ = ["PREEMPT", "VARIANTS", "base_of", "run", "variant"]

_HERE = Path(__file__).resolve().parent
WORKLOADS = tuple(str(_HERE / "workloads" / n) for n in ("agent-loop.json", "triage-rag.json"))

#: variant name -> (policy, compass's options changed); a name ending in
#: :data:`PREEMPT` runs the same with preemption at step boundaries (``--preempt on``)
VARIANTS: Mapping[str, tuple[str, Mapping[str, bool]]] = {
    "compass": ("compass", {}),
    "compass, flat rank": ("compass", {"progress_rank": False}),
    "compass, one step counted": ("compass", {"count_likely_path": False}),
    "compass, no likely prefetch": ("compass", {"likely_prefetch": False}),
    "compass, path yardstick": ("compass", {"rank_yardstick": False}),
    "compass-chained": ("compass-chained", {}),
    "compass-chained, path yardstick": ("compass", {"chained": True, "rank_yardstick": False}),
    "jit": ("jit", {}),
}

#: the suffix of a variant run with preemption at step boundaries (the workload's step-wise
#: tasks give their lane up between steps: :mod:`compass.core.preempt`)
PREEMPT = ", preempt"


def variant(name: str) -> tuple[str, dict[str, Any]]:
    """The policy variant ``name`` runs and the simulator settings it changes."""
    preempt = name.endswith(PREEMPT)
    policy, options = VARIANTS[name.removesuffix(PREEMPT)]
    settings: dict[str, Any] = {"policy_options": dict(options)} if options else {}
    if preempt:
        settings["preempt"] = True
    return policy, settings


def base_of(variants: Sequence[str]) -> str | None:
    """The variant the others are compared with: the first of ``compass`` and ``compass,
    preempt`` among ``variants`` (None: neither)."""
    return next((v for v in variants if v in ("compass", "compass" + PREEMPT)), None)


def _seeds(found: Mapping[str, Any], policy: str, slo: str, n: int) -> list[float | None]:
    """Each of the ``n`` seeds' capacity (None: the SLO met at no load tried, as the whole
    entry is when no seed met it)."""
    spread = found["capacity"][slo][policy]
    seeds: list[float | None] = [None] * n if spread is None else spread["seeds"]
    return seeds


def run(
    workloads: Sequence[str],
    variants: Sequence[str],
    seeds: Sequence[int],
    jobs: int,
    json_path: str | None,
) -> dict[str, Any]:
    """Search every variant's capacity on every workload; print and write the results."""
    out: dict[str, Any] = {"machine": machine(), "seeds": list(seeds), "jobs": jobs}
    slos = [s.name for s in cap.BUILTIN_SLOS]
    for path in workloads:
        workload = load_workload(path)
        found: dict[str, dict[str, list[float | None]]] = {}
        for name in variants:
            policy, settings = variant(name)
            t0 = time.perf_counter()
            result = cap.capacity_for_workload(
                workload,
                [policy],
                cap.SimRuns(
                    workers=workload.cluster.workers,
                    jobs=jobs,
                    options=settings,
                ),
                cap.CapacitySearch(seeds=tuple(seeds)),
            )
            found[name] = {slo: _seeds(result, policy, slo, len(seeds)) for slo in slos}
            print(f"  {workload.name} {name}: {time.perf_counter() - t0:.0f} s", flush=True)
        rows = []
        base = base_of(variants) or variants[0]  # the ratios are of it over each
        ratios: dict[str, dict[str, float | None]] = {}
        for name in variants:
            row: list[Any] = [name]
            for slo in slos:
                values = [v for v in found[name][slo] if v is not None]
                row.append(statistics.fmean(values) if values else None)
            for slo in slos:
                per_seed = [
                    cap.ratio(ours, theirs)
                    for ours, theirs in zip(found[base][slo], found[name][slo], strict=True)
                ]
                kept = [r for r in per_seed if r is not None]
                ratio = statistics.fmean(kept) if kept else None
                ratios.setdefault(name, {})[slo] = ratio
                row.append(ratio)
            rows.append(row)
        print_table(
            f"{workload.name}: capacity (x the arrival rate), mean over seeds "
            f"{','.join(map(str, seeds))}, {jobs} jobs; {base} over each, mean of per-seed ratios",
            ["variant", *slos, *(f"{base} / it, {s}" for s in slos)],
            rows,
        )
        out[workload.name] = {"capacity_by_seed": found, "base": base, "compass_over": ratios}
    write_json(json_path, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--variants", default=";".join(VARIANTS), help="separated by ';'")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--json", default="results/unfold.json")
    args = parser.parse_args()
    run(
        args.workloads.split(","),
        args.variants.split(";"),
        cap.parse_seeds(args.seeds),
        args.jobs,
        args.json,
    )


if __name__ == "__main__":
    main()
