"""``compass bench preempt``: what preemption at step boundaries gives, in the simulator (the
same core as a worker), on workloads with steps: the paper's (``bench/workloads/paper-steps.json``)
and generated ones whose long model tasks run in steps (``compass workload generate
--stepwise``).

For each workload, each policy's capacity at median2 / p95x3 / p99x5 is searched with
preemption on and off (``compass sim --capacity --preempt both``); the table gives, per
workload and objective, the capacity with it over the capacity without (``on_over_off``) for
each policy, the tail capacities over the median's for compass with and without it
(``tail_over_median``), and compass's capacity over the best baseline's, both with preemption
(``compass_over_best``). The JSON keeps every capacity, and the medians over workloads.

``compass bench preempt --switch step-batch`` is the same benchmark for step batching:
each policy with step batching on and off (``compass sim --step-batch both``), preemption on
for both.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from compass.sim import capacity as cap
from compass.sim.settings import (
    NO_PREEMPTION,
    NO_STEP_BATCHING,
    with_preemption,
    with_step_batching,
)
from compass.workflow.spec import Workload, load_workload

from .report import machine, print_table, write_json

__all__ = ["PreemptBench", "run", "workload_row"]

#: the paper's workload with step profiles
PAPER_STEPS = "bench/workloads/paper-steps.json"
#: the objectives, median first (the tails are reported over it)
OBJECTIVES = ("median2", "p95x3", "p99x5")


@dataclass(frozen=True, slots=True)
class PreemptBench:
    """``generated`` workloads (seeds 0..N-1, ``stepwise`` of their long model tasks in
    steps) besides the paper's with steps; ``policies`` (compass first), arrival ``seeds``,
    ``jobs`` a run, loads up to ``max_load``; ``switch``: what is on and off, ``preempt`` or
    ``step-batch`` (then preemption is on for both); ``paper``: the paper's workload with
    steps too (first)."""

    generated: int = 4
    stepwise: float = 0.5
    policies: tuple[str, ...] = ("compass", "jsq", "jit")
    seeds: tuple[int, ...] = (0,)
    jobs: int = 500
    max_load: float = 6.0
    switch: str = "preempt"
    paper: bool = True

    @property
    def off(self) -> str:
        """The suffix of a policy's name with the switch off."""
        return NO_PREEMPTION if self.switch == "preempt" else NO_STEP_BATCHING


def workload_row(workload: Workload, bench: PreemptBench) -> dict[str, Any]:
    """Every policy's capacity with and without the switch on ``workload``, and the ratios."""
    if bench.switch == "preempt":
        names, _ = with_preemption(bench.policies, "both")
    else:
        names = with_step_batching(bench.policies, "both")
    off = bench.off
    started = time.perf_counter()
    found = cap.capacity_for_workload(
        workload,
        names,
        cap.SimRuns(workers=workload.cluster.workers, jobs=bench.jobs, options={"preempt": True}),
        cap.CapacitySearch(seeds=bench.seeds, max_load=bench.max_load),
    )
    capacity = {
        slo: {p: (None if e is None else e["mean"]) for p, e in by_policy.items()}
        for slo, by_policy in found["capacity"].items()
    }
    on_over_off = {
        slo: {p: _ratio(capacity[slo][p], capacity[slo][p + off]) for p in bench.policies}
        for slo in OBJECTIVES
    }
    tail = {
        side: {
            slo: _ratio(capacity[slo][name], capacity["median2"][name]) for slo in OBJECTIVES[1:]
        }
        for side, name in (("on", "compass"), ("off", "compass" + off))
    }
    best = {
        slo: _ratio(capacity[slo]["compass"],
                    max((capacity[slo][p] or 0.0) for p in bench.policies[1:]) or None)
        for slo in OBJECTIVES
    }  # fmt: skip
    return {
        "name": workload.name,
        "workers": workload.cluster.workers,
        "capacity": capacity,
        "on_over_off": on_over_off,
        "tail_over_median": tail,
        "compass_over_best": best,
        "wall_s": time.perf_counter() - started,
    }


def run(bench: PreemptBench, json_path: str | None = None) -> dict[str, Any]:
    """Run the benchmark on the paper's workload with steps and the generated ones; print the
    table, write the JSON."""
    from compass.workflow.generate import generate_workload

    workloads = [load_workload(PAPER_STEPS)] if bench.paper else []
    workloads += [generate_workload(s, stepwise=bench.stepwise) for s in range(bench.generated)]
    rows = []
    for workload in workloads:
        rows.append(workload_row(workload, bench))
        print(f"{workload.name}: {rows[-1]['wall_s']:.0f} s", flush=True)
    table = []
    for row in rows:
        for slo in OBJECTIVES:
            ratios = row["on_over_off"][slo]
            table.append([row["name"], slo,
                          *(_cell(ratios[p]) for p in bench.policies),
                          _cell(row["tail_over_median"]["on"].get(slo)),
                          _cell(row["tail_over_median"]["off"].get(slo)),
                          _cell(row["compass_over_best"][slo])])  # fmt: skip
    what = "preemption at step boundaries" if bench.switch == "preempt" else "step batching"
    print_table(
        f"{what}: capacity with it over without, per policy; compass's tail capacity over its "
        "median's with and without it; compass over the best baseline (both with it)",
        [
            "workload",
            "objective",
            *(f"{p} on/off" for p in bench.policies),
            "tail/median on",
            "tail/median off",
            "compass/best",
        ],
        table,
    )
    generated = rows[1:] if bench.paper else rows
    out = {
        "machine": machine(),
        "config": asdict(bench),
        "workloads": rows,
        "median_over_generated": {
            "on_over_off": {
                slo: {
                    p: _median([r["on_over_off"][slo][p] for r in generated])
                    for p in bench.policies
                }
                for slo in OBJECTIVES
            },
            "compass_over_best": {
                slo: _median([r["compass_over_best"][slo] for r in generated]) for slo in OBJECTIVES
            },
            "tail_over_median": {
                side: {
                    slo: _median([r["tail_over_median"][side][slo] for r in generated])
                    for slo in OBJECTIVES[1:]
                }
                for side in ("on", "off")
            },
        },
    }
    write_json(json_path, out)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
