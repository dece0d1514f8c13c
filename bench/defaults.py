"""``compass bench defaults``: is each of Compass's departures from the paper worth keeping?

Every knob where compass departs from the paper (the keep-the-plan threshold, the queue order,
sibling counting, join re-placement, cache warming, prefetch that evicts) is set, one at a time,
to each of its other values, and the simulated capacity of that variant at each SLO is searched
beside compass as it ships (:func:`compass.sim.capacity.search_capacity`), on the paper's
workload and on generated workloads (seeds 0..N-1, each on its own worker count). A ``paper``
variant sets every knob to the paper's value at once. Reported per variant and SLO: the ratio
of its capacity to the shipped compass's (mean over arrival seeds of each) on the paper
workload, and the median and minimum of that ratio over the generated workloads; a ratio above
1 means the variant sustains more load. ``noise`` is the median over workloads of the standard
error of the per-seed ratio.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from compass.errors import ConfigError
from compass.sched.planner import CompassOptions
from compass.sched.policies import VARIANT_OPTIONS
from compass.sim import capacity as cap
from compass.sim.settings import SimSettings
from compass.workflow.spec import Workload, load_workload

from .report import machine, print_table, write_json

__all__ = [
    "KNOBS",
    "PAPER_VARIANT",
    "Knob",
    "current_settings",
    "main",
    "run",
    "summarize",
    "variants",
]

PAPER_WORKLOAD = Path(__file__).resolve().parent / "workloads" / "paper.json"

#: the variant with every knob at the paper's value
PAPER_VARIANT = "paper"


@dataclass(frozen=True, slots=True)
class Knob:
    """One departure from the paper: the setting it is (a :class:`CompassOptions` field or
    ``prefetch_evicts``), the paper's value, and every value tried."""

    name: str
    setting: str
    paper: Any
    values: tuple[Any, ...]


KNOBS: tuple[Knob, ...] = (
    Knob("threshold", "adjust_threshold", 1.5, (0.1, 0.25, 0.5, 1.5)),
    Knob("queue order", "oldest_job_first", False, (True, False)),
    Knob("siblings", "counts_siblings", False, (True, False)),
    Knob("joins", "moves_joins", False, (True, False)),
    Knob("warming", "warms_cache", False, (True, False)),
    Knob("prefetch", "prefetch_evicts", False, (True, False)),
)

_SIM_SETTINGS = frozenset({"prefetch_evicts"})

_COLUMNS = ("paper", "generated_median", "generated_min", "noise")


def current_settings(knobs: Sequence[Knob] = KNOBS) -> dict[str, Any]:
    """What compass ships with for each knob's setting (read from the code, not repeated)."""
    options = CompassOptions()
    sim_defaults = SimSettings(workers=1, policy="compass")
    out: dict[str, Any] = {}
    for knob in knobs:
        if knob.setting in _SIM_SETTINGS:
            out[knob.setting] = getattr(sim_defaults, knob.setting)
        elif knob.setting in VARIANT_OPTIONS:
            out[knob.setting] = getattr(options, knob.setting)
        else:
            raise ConfigError(f"knob {knob.name!r}: {knob.setting!r} is not a compass setting")
    return out


def variants(
    knobs: Sequence[Knob], current: Mapping[str, Any]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Variant name -> (knob name, settings changed from ``current``): each knob's other
    values one at a time, then :data:`PAPER_VARIANT` (every knob at the paper's value) when
    that differs from each single variant and from ``current``."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for knob in knobs:
        for value in knob.values:
            if value != current[knob.setting]:
                out[f"{knob.setting}={value}"] = (knob.name, {knob.setting: value})
    paper = {k.setting: k.paper for k in knobs if k.paper != current[k.setting]}
    if len(paper) > 1:
        out[PAPER_VARIANT] = (PAPER_VARIANT, paper)
    return out


def _sim_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {k: v for k, v in settings.items() if k in _SIM_SETTINGS}
    policy = {k: v for k, v in settings.items() if k not in _SIM_SETTINGS}
    if policy:
        options["policy_options"] = policy
    return options


def _runner(
    workload: Workload, workers: int, jobs: int, chosen: Mapping[str, Mapping[str, Any]]
) -> cap.RunFn:
    """A run function over variant names: each simulates ``compass`` with its settings."""
    by_name = {
        name: cap.simulator_run(
            workload, cap.SimRuns(workers=workers, jobs=jobs, options=_sim_options(s))
        )
        for name, s in chosen.items()
    }

    def run(variant: str, seed: int, load: float) -> Sequence[float | None]:
        return by_name[variant]("compass", seed, load)

    return run


def _ratio(ours: float | None, current: float | None) -> float | None:
    """Variant capacity over the shipped compass's; a variant with none counts as 0; None when
    the shipped compass has none (nothing to divide by)."""
    if current is None or current <= 0:
        return None
    return 0.0 if ours is None else ours / current


def _seed_se(ours: Sequence[float | None], current: Sequence[float | None]) -> float | None:
    """Standard error of the mean of the per-seed ratios (None under two known seeds)."""
    known = [r for r in map(_ratio, ours, current) if r is not None]
    if len(known) < 2:
        return None
    return float(np.std(known, ddof=1) / math.sqrt(len(known)))


def summarize(
    rows: Sequence[Mapping[str, Any]], names: Sequence[str], slos: Sequence[str]
) -> dict[str, dict[str, dict[str, float | None]]]:
    """{variant: {SLO: {paper, generated_median, generated_min, noise}}} over ``rows``
    (each ``{"group": "paper" | "generated", "ratio": {SLO: {variant: x}}, "se": same}``):
    the paper row's ratio, the median and minimum of the generated rows' known ratios, and the
    median over all rows of the seed standard error."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in names:
        out[name] = {}
        for slo in slos:
            paper = [r["ratio"][slo].get(name) for r in rows if r["group"] == "paper"]
            known = [
                r["ratio"][slo][name]
                for r in rows
                if r["group"] == "generated" and r["ratio"][slo].get(name) is not None
            ]
            errors = [r["se"][slo][name] for r in rows if r["se"][slo].get(name) is not None]
            out[name][slo] = {
                "paper": paper[0] if paper else None,
                "generated_median": float(np.median(known)) if known else None,
                "generated_min": min(known) if known else None,
                "noise": float(np.median(errors)) if errors else None,
            }
    return out


#: the search each variant's capacity is found by: coarser than ``compass sim --capacity``'s
#: (5% and 4 bisections), for many variants on many workloads
SEARCH = cap.CapacitySearch(seeds=(0, 1, 2), max_load=8.0, rel_tol=0.05, max_steps=4)


def run(
    search: cap.CapacitySearch = SEARCH,
    *,
    workloads: int = 8,
    knobs: Sequence[Knob] = KNOBS,
    jobs: int = 400,
    paper_workload: str | None = str(PAPER_WORKLOAD),
    json_path: str | None = None,
) -> dict[str, Any]:
    """Search every variant's capacity as ``search`` says, beside the shipped compass's, on the
    paper workload (5 workers; ``paper_workload=None`` leaves it out) and ``workloads``
    generated ones; print a table per knob and write JSON: ``{"config", "current",
    "variants", "workloads": [row], "summary": {variant: {SLO: {paper, generated_median,
    generated_min, noise}}}}``."""
    from compass.workflow.generate import generate_workload

    seeds, slos, max_load = search.seeds, search.slos, search.max_load
    rel_tol, max_steps = search.rel_tol, search.max_steps
    if workloads < 0:
        raise ConfigError(f"--workloads must be >= 0, got {workloads}")
    if workloads == 0 and paper_workload is None:
        raise ConfigError("nothing to measure: no generated workloads and no paper workload")
    current = current_settings(knobs)
    found_variants = variants(knobs, current)
    if not found_variants:
        raise ConfigError("every knob is at its only value: no variant to compare")
    chosen: dict[str, dict[str, Any]] = {cap.REFERENCE: {}}
    chosen.update({name: settings for name, (_, settings) in found_variants.items()})
    names = [s.name for s in slos]
    cases: list[tuple[str, str, Workload, int]] = []
    if paper_workload is not None:
        cases.append(("paper", "paper", load_workload(paper_workload), 5))
    for seed in range(workloads):
        generated = generate_workload(seed)
        cases.append((f"generated-{seed}", "generated", generated, generated.cluster.workers))
    started_all = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for label, group, workload, workers in cases:
        started = time.perf_counter()
        found = cap.search_capacity(
            _runner(workload, workers, jobs, chosen),
            policies=list(chosen),
            seeds=seeds,
            slos=slos,
            grid=cap.load_grid(max_load),
            rel_tol=rel_tol,
            max_steps=max_steps,
        )
        row = _row(label, group, workers, found, list(found_variants), names)
        row["physical_bound"] = cap.physical_bound(workload, workers)
        row["wall_s"] = time.perf_counter() - started
        rows.append(row)
        print(
            f"{label} ({workers} workers, {row['runs']} runs, {row['wall_s']:.0f} s): compass "
            + ", ".join(f"{s} {_fmt(row['capacity'][s][cap.REFERENCE])}" for s in names),
            flush=True,
        )
    summary = summarize(rows, list(found_variants), names)
    for knob in [*(k.name for k in knobs), PAPER_VARIANT]:
        of_knob = [n for n, (k, _) in found_variants.items() if k == knob]
        if not of_knob:
            continue
        print_table(
            f"{knob}: capacity / shipped compass's",
            ["variant", "SLO", "paper", "generated median", "generated min", "noise"],
            [[n, s, *(summary[n][s][k] for k in _COLUMNS)] for n in of_knob for s in names],
        )
    out: dict[str, Any] = {
        "config": {
            "workloads": workloads,
            "paper_workload": paper_workload,
            "seeds": list(seeds),
            "slos": cap.slo_config(slos),
            "jobs": jobs,
            "max_load": max_load,
            "rel_tol": rel_tol,
            "max_steps": max_steps,
            "machine": machine(),
            "wall_s": time.perf_counter() - started_all,
        },
        "current": current,
        "variants": {n: {"knob": k, "settings": s} for n, (k, s) in found_variants.items()},
        "workloads": rows,
        "summary": summary,
    }
    write_json(json_path, out)
    return out


def _row(
    label: str,
    group: str,
    workers: int,
    found: Mapping[str, Any],
    variant_names: Sequence[str],
    slos: Sequence[str],
) -> dict[str, Any]:
    capacity: dict[str, dict[str, float | None]] = {}
    by_seed: dict[str, dict[str, list[float | None] | None]] = {}
    ratio: dict[str, dict[str, float | None]] = {}
    se: dict[str, dict[str, float | None]] = {}
    for slo in slos:
        entries = found["capacity"][slo]
        capacity[slo] = {p: (None if e is None else e["mean"]) for p, e in entries.items()}
        by_seed[slo] = {p: (None if e is None else e["seeds"]) for p, e in entries.items()}
        ours = capacity[slo][cap.REFERENCE]
        ratio[slo] = {n: _ratio(capacity[slo][n], ours) for n in variant_names}
        ref_seeds = by_seed[slo][cap.REFERENCE]
        se[slo] = {}
        for n in variant_names:
            theirs = by_seed[slo][n]
            if ref_seeds is not None:
                # a variant with no capacity on any seed: 0 on each
                filled = [None] * len(ref_seeds) if theirs is None else theirs
                se[slo][n] = _seed_se(filled, ref_seeds)
            else:
                se[slo][n] = None
    return {
        "name": label,
        "group": group,
        "workers": workers,
        "capacity": capacity,
        "capacity_by_seed": by_seed,
        "ratio": ratio,
        "se": se,
        "runs": found["runs"],
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _knob_list(text: str) -> list[Knob]:
    by_name = {k.setting: k for k in KNOBS} | {k.name: k for k in KNOBS}
    chosen: list[Knob] = []
    for part in (p.strip() for p in text.split(",")):
        if part not in by_name:
            raise ConfigError(
                f"unknown knob {part!r}; known: {', '.join(k.setting for k in KNOBS)}"
            )
        chosen.append(by_name[part])
    return chosen


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workloads", type=int, default=8, help="generated: seeds 0..N-1")
    parser.add_argument("--seeds", default="0-2", help="arrival seeds, 0-2 or 0,1,2")
    parser.add_argument("--jobs", type=int, default=400, help="jobs per run")
    parser.add_argument("--max-load", type=float, default=8.0)
    parser.add_argument("--knobs", default=None, help="comma-separated settings; default all")
    parser.add_argument("--no-paper", action="store_true", help="leave the paper workload out")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    try:
        run(
            replace(SEARCH, seeds=cap.parse_seeds(args.seeds), max_load=args.max_load),
            workloads=args.workloads,
            knobs=KNOBS if args.knobs is None else _knob_list(args.knobs),
            jobs=args.jobs,
            paper_workload=None if args.no_paper else str(PAPER_WORKLOAD),
            json_path=args.json_path,
        )
    except ConfigError as e:
        parser.error(str(e))


if __name__ == "__main__":
    main()
