"""``compass bench elastic``: a day of traffic on a cluster that sizes itself, in the simulator.

Per workload (the paper's and generated ones) and seed: a daily curve with bursts
(:func:`~compass.elastic.curve.daily_curve`, mean rate = the workload's own), compressed so a
trace minute lasts ``minute_s`` simulated seconds, run on the same planner (compass) by:

- ``autoscale``: :class:`~compass.elastic.rule.ScaleRule` sized by the workload's
  utilization-by-size table (:func:`~compass.elastic.capacity.utilization_by_size`,
  calibrated once per workload) times a margin chosen on one calibration day of the
  workload (:func:`~compass.elastic.capacity.day_margin`: a curve of seed ``margin_seed``,
  never a judged seed; the largest margin whose day meets 99% and whose burst 95%), a start
  not yet done called off once the rate leaves a surplus, a scale-in band of a tenth;
- ``autoscale-table``: the same rule with the table as calibrated (margin 1): the rule
  before the margin, in the same run;
- ``autoscale-no-call-off``: ``autoscale`` with no start called off (run only when named in
  ``clusters``);
- ``autoscale-one-util``: the rule as it was before the table (one utilization, bisected on
  the spec's own cluster less a tenth, for every size; a band of a quarter; starts never
  called off): the before side, in the same run;
- ``peak`` and ``mean``: fixed at the size the table (as calibrated, no margin) gives for
  the curve's highest minute and for its mean;
- ``ray-serve-rule``: Ray Serve's default policy (2 ongoing requests per replica, 30 s up and
  600 s down delays), then ``ray-serve-rule-target-T`` for T in 1, 0.5, 0.25, run in that
  order until one reaches ``autoscale``'s mean attainment on the same seeds (the
  equal-attainment point; the rest are skipped unless named in ``clusters``).

``burst_attainment`` (the four clusters the issue names; None for the others): a separate run
in real time (60 s minutes): ``burst_before`` steady
minutes, one minute at 3x the rate, ``burst_after`` steady minutes; the attainment of the jobs
that arrive in the burst minute. Attainment is the share of jobs within ``max_slowdown``
(p95x3: 3x their best time).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from compass.elastic.capacity import Calibration, DayCheck, day_margin, utilization_by_size
from compass.elastic.curve import (
    burst_curve,
    curve_arrivals,
    daily_curve,
    read_counts,
    workload_rate,
)
from compass.elastic.rule import RayServeConfig, ScaleConfig, workers_at, workers_for
from compass.elastic.sim import ElasticOptions, lane_s_per_job, simulate_elastic
from compass.elastic.table import TABLE_BAND, read_capacity, table_rule
from compass.errors import ConfigError
from compass.sim.arrivals import workload_arrivals
from compass.sim.engine import simulate
from compass.sim.settings import SimSettings
from compass.workflow.generate import expected_utilization, generate_workload
from compass.workflow.spec import Workload, load_workload

from .report import machine, print_table, write_json

__all__ = ["CONTROLLERS", "RAY_TARGETS", "ElasticConfig", "TrafficConfig", "run", "run_traffic"]

#: Ray Serve's rule at each target (ongoing requests per replica), in the order swept
RAY_TARGETS = {
    "ray-serve-rule": 2.0,
    "ray-serve-rule-target-1": 1.0,
    "ray-serve-rule-target-0.5": 0.5,
    "ray-serve-rule-target-0.25": 0.25,
}
#: result keys: the controller each runs
CONTROLLERS = {
    "autoscale": "autoscale",
    "autoscale-table": "autoscale",
    "autoscale-no-call-off": "autoscale",
    "autoscale-one-util": "autoscale",
    "peak": "fixed",
    "mean": "fixed",
    **dict.fromkeys(RAY_TARGETS, "ray-serve"),
}
#: the clusters whose burst is run too (the issue's keys; the others' burst_attainment is None)
BURST_KEYS = ("autoscale", "peak", "mean", "ray-serve-rule")
#: the clusters run only when named in ``clusters``
NAMED_ONLY = ("autoscale-no-call-off",)
#: the sizes the utilization table is calibrated at
TABLE_SIZES = (3, 6, 12, 24)


@dataclass(frozen=True, slots=True)
class ElasticConfig:
    paper: str = str(Path(__file__).parent / "workloads" / "paper.json")
    generated: tuple[int, ...] = (1, 2)
    seeds: tuple[int, ...] = (0, 1, 2)
    minute_s: float = 1.0
    minutes: int = 1440
    start_s: float = 30.0
    rate_scale: float = 1.0
    max_slowdown: float = 3.0
    burst_before: int = 8
    burst_after: int = 3
    #: workload names to run (``paper``, ``generated-N``); empty: every one
    workloads: tuple[str, ...] = ()
    #: result keys to run (of :data:`CONTROLLERS`); empty: all but the Ray targets past
    #: the equal-attainment point
    clusters: tuple[str, ...] = ()
    table_sizes: tuple[int, ...] = TABLE_SIZES
    #: a JSON an earlier run wrote: the workloads it holds reuse its ``capacity`` (both
    #: calibrations are deterministic, once per workload), the others are calibrated
    calibration: str = ""
    #: the calibration day's curve seed (:func:`~compass.elastic.capacity.day_margin`) and
    #: the margins it tries, largest first
    margin_seed: int = 100
    margins: tuple[float, ...] = DayCheck().margins

    def __post_init__(self) -> None:
        unknown = sorted(set(self.clusters) - set(CONTROLLERS))
        if unknown:
            raise ConfigError(
                f"unknown cluster {', '.join(unknown)}; known: {', '.join(CONTROLLERS)}"
            )


def _workloads(config: ElasticConfig) -> list[Workload]:
    loaded = [load_workload(config.paper)] if config.paper else []
    every = loaded + [generate_workload(seed) for seed in config.generated]
    if not config.workloads:
        return every
    names = {w.name for w in every}
    unknown = sorted(set(config.workloads) - names)
    if unknown:
        raise ConfigError(
            f"unknown workload {', '.join(unknown)}; known: {', '.join(sorted(names))}"
        )
    return [w for w in every if w.name in config.workloads]


def calibrate_util(workload: Workload, max_slowdown: float, seed: int = 0) -> float:
    """One utilization for every size (the capacity model before the table): the GPU-lane
    utilization at which the workload's own cluster still gets 99% of its jobs within
    ``max_slowdown`` (Poisson arrivals, bisected over the load), less a tenth for margin; at
    most the rule's default."""
    workers = workload.cluster.workers
    jobs = 600

    def met(load: float) -> bool:
        arrivals = workload_arrivals(workload, jobs, process="poisson", load=load, seed=seed)
        result = simulate(workload, SimSettings(workers=workers, policy="compass"), arrivals)
        ok = sum(1 for j in result.jobs if j.slowdown is not None and j.slowdown <= max_slowdown)
        return ok >= 0.99 * len(result.jobs)

    low, high = 0.05, 2.0
    if not met(low):
        return 0.1
    for _ in range(6):
        mid = (low + high) / 2
        low, high = (mid, high) if met(mid) else (low, mid)
    util = expected_utilization(workload, load=low, workers=workers)
    return min(ScaleConfig().target_util, max(0.1, 0.9 * util))


def calibrate_table(
    workload: Workload, max_slowdown: float, sizes: tuple[int, ...] = TABLE_SIZES
) -> tuple[tuple[int, float], ...]:
    """The workload's utilization-by-size table at the objective (99% within
    ``max_slowdown``), two seeds pooled, no margin (the day's bursts are the rule's to see)."""
    config = Calibration(margin=1.0, jobs_per_worker=150, max_jobs=6000, seeds=(0, 1), warmup=0.2)
    return utilization_by_size(workload, sizes, max_slowdown=max_slowdown, config=config)


def calibrate_margin(
    workload: Workload, config: ElasticConfig, util: float, table: Any
) -> tuple[float, list[dict[str, Any]]]:
    """The margin on ``table`` for this workload (:func:`~compass.elastic.capacity.
    day_margin`): one calibration day of seed ``config.margin_seed``, the bench's own
    settings (minute, start, objective, burst), starting at the sizes ``autoscale`` would."""
    seed = config.margin_seed
    check = DayCheck(
        seed=seed,
        minutes=config.minutes,
        minute_s=config.minute_s,
        start_s=config.start_s,
        max_slowdown=config.max_slowdown,
        burst_before=config.burst_before,
        burst_after=config.burst_after,
        margins=config.margins,
    )

    def sized(margin: float) -> _Plan:
        return _plan(workload, config, seed, util, table, margin)

    def starts(margin: float) -> tuple[int, int]:
        plan = sized(margin)
        return plan.first, plan.mean

    return day_margin(workload, _rule(sized(1.0), min(config.margins), workload, config),
                      starts, check)  # fmt: skip


def _sizes(workload: Workload, peak_rel: float, rate_scale: float, util: float) -> tuple[int, int]:
    rate = workload_rate(workload) * rate_scale
    e = lane_s_per_job(workload)
    return workers_for(rate * peak_rel, e, 1, util), workers_for(rate, e, 1, util)


def _table_size(
    workload: Workload, rel: float, rate_scale: float, table: Any, margin: float = 1.0
) -> int:
    load = workload_rate(workload) * rate_scale * rel * lane_s_per_job(workload)
    return workers_at(load, table, margin)


@dataclass(frozen=True, slots=True)
class _Plan:
    """One seed's sizes: the table's (peak, mean, first minute), the one utilization's (peak,
    first minute), the cap every dynamic cluster shares (``autoscale``'s: at least the
    table's peak times its margin), and both capacity models with ``autoscale``'s margin."""

    peak: int
    mean: int
    first: int
    old_peak: int
    old_first: int
    cap: int
    util: float
    table: tuple[tuple[int, float], ...]
    margin: float = 1.0
    seed: int = 0


def _rule(plan: _Plan, margin: float, workload: Workload, config: ElasticConfig) -> ScaleConfig:
    """``autoscale``'s rule: the table times ``margin``, a band of a tenth (of 0.6), capped
    at the larger of the shared cap and the table's peak size at that margin."""
    curve = daily_curve(plan.seed, minutes=config.minutes)
    top = _table_size(workload, float(curve.max()), config.rate_scale, plan.table, margin)
    return ScaleConfig(
        maximum=max(plan.cap, top), band=TABLE_BAND, by_size=plan.table, margin=margin
    )


def _one(
    workload: Workload, config: ElasticConfig, seed: int, key: str, plan: _Plan
) -> dict[str, Any]:
    if key == "autoscale-one-util":
        util = plan.util
        rule = ScaleConfig(maximum=plan.old_peak, target_util=util, band=min(0.15, util / 4),
                           call_off=False)  # fmt: skip
        initial, maximum = plan.old_first, plan.old_peak
    else:
        rule = _rule(plan, 1.0 if key == "autoscale-table" else plan.margin, workload, config)
        rule = replace(rule, call_off=key != "autoscale-no-call-off")
        initial = {"peak": plan.peak, "mean": plan.mean}.get(key, plan.first)
        maximum = rule.maximum if key.startswith("autoscale") else plan.cap
    ray = RayServeConfig(maximum=maximum, target_ongoing=RAY_TARGETS.get(key, 2.0))
    controller = CONTROLLERS[key]
    curve = daily_curve(seed, minutes=config.minutes)
    opts = ElasticOptions(
        controller=controller,
        initial=initial,
        maximum=max(maximum, initial),
        start_s=config.start_s,
        max_slowdown=config.max_slowdown,
        rule=rule,
        ray=ray,
    )
    day = simulate_elastic(
        workload,
        curve_arrivals(workload, curve, minute_s=config.minute_s, rate_scale=config.rate_scale,
                       seed=seed),
        opts,
        seed=seed,
    )  # fmt: skip
    burst_attainment = None
    if key in BURST_KEYS:
        burst = burst_curve(config.burst_before, config.burst_after)
        burst_first = {"peak": plan.peak}.get(key, plan.mean)
        burst_opts = replace(opts, initial=burst_first, maximum=max(maximum, burst_first))
        arrivals = curve_arrivals(workload, burst, minute_s=60.0, rate_scale=config.rate_scale,
                                  seed=seed)  # fmt: skip
        spike = simulate_elastic(workload, arrivals, burst_opts, seed=seed)
        at = config.burst_before * 60.0
        burst_attainment = spike.attainment(config.max_slowdown, at, at + 60.0)
    return {
        "gpu_hours": day.gpu_hours,
        "attainment": day.attainment(config.max_slowdown),
        "burst_attainment": burst_attainment,
        "jobs": len(day.jobs),
        "starts": day.starts,
        "drains": day.drains,
        "holds": day.holds,
        "mean_workers": day.gpu_hours * 3600.0 / day.horizon_s if day.horizon_s else 0.0,
    }


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("gpu_hours", "attainment", "mean_workers")
    out: dict[str, Any] = {k: statistics.fmean(r[k] for r in runs) for k in keys}
    out["min_attainment"] = min(r["attainment"] for r in runs)
    bursts = [r["burst_attainment"] for r in runs if r["burst_attainment"] is not None]
    out["burst_attainment"] = statistics.fmean(bursts) if bursts else None
    out["min_burst_attainment"] = min(bursts) if bursts else None
    out["seeds"] = runs
    return out


def _plan(
    workload: Workload,
    config: ElasticConfig,
    seed: int,
    util: float,
    table: Any,
    margin: float = 1.0,
) -> _Plan:
    curve = daily_curve(seed, minutes=config.minutes)
    top, first = float(curve.max()), float(curve[0])
    old_peak = _sizes(workload, top, config.rate_scale, util)[0]
    peak = _table_size(workload, top, config.rate_scale, table)
    return _Plan(
        peak=peak,
        mean=_table_size(workload, 1.0, config.rate_scale, table),
        first=_table_size(workload, first, config.rate_scale, table),
        old_peak=old_peak,
        old_first=_sizes(workload, first, config.rate_scale, util)[0],
        cap=max(peak, old_peak),
        util=util,
        table=table,
        margin=margin,
        seed=seed,
    )


def _known_capacity(
    path: str,
) -> dict[str, tuple[float, tuple[tuple[int, float], ...], float | None]]:
    """Each workload's capacity from an earlier run's JSON (``path``; empty: none): the one
    utilization, the table, and the day's margin (None where that run chose none)."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {
            name: (
                float(w["capacity"]["target_util"]),
                tuple((int(n), float(u)) for n, u in w["capacity"]["by_size"]),
                float(w["capacity"]["margin"]) if "margin" in w["capacity"] else None,
            )
            for name, w in data["workloads"].items()
        }
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot reuse the calibration in {path}: {error!r}") from None


def _reached(results: dict[str, Any]) -> bool:
    """Whether a Ray target already run reaches ``autoscale``'s attainment."""
    if "autoscale" not in results:
        return False
    ours = results["autoscale"]["attainment"]
    return any(results[k]["attainment"] >= ours for k in RAY_TARGETS if k in results)


def equal_attainment(results: dict[str, Any], mine: str = "autoscale") -> dict[str, Any] | None:
    """Ray Serve's rule where it first reaches ``mine``'s mean attainment (targets in the
    order swept) and the ratio of GPU-hours there; beside it, Ray's GPU-hours interpolated
    (linear in attainment) between the two targets around ``mine``'s attainment. None: no
    target run reaches it."""
    ours = results[mine]
    ran = [k for k in RAY_TARGETS if k in results]
    for before, key in zip([None, *ran], ran, strict=False):
        ray = results[key]
        if ray["attainment"] < ours["attainment"]:
            continue
        out: dict[str, Any] = {
            "ray_key": key,
            "ray_target": RAY_TARGETS[key],
            "ray_gpu_hours": ray["gpu_hours"],
            "ray_attainment": ray["attainment"],
            "gpu_hours_ratio": ours["gpu_hours"] / ray["gpu_hours"],
            "attainment_minus_ray": ours["attainment"] - ray["attainment"],
        }
        if before is not None:
            lo = results[before]
            span = ray["attainment"] - lo["attainment"]
            share = (ours["attainment"] - lo["attainment"]) / span if span > 0 else 1.0
            gpu = lo["gpu_hours"] + share * (ray["gpu_hours"] - lo["gpu_hours"])
            out["ray_gpu_hours_interpolated"] = gpu
            out["gpu_hours_ratio_interpolated"] = ours["gpu_hours"] / gpu
        return out
    return None


def run(config: ElasticConfig, json_path: str | None = None) -> dict[str, Any]:
    """Every workload, seed and cluster (module doc); print a table and write JSON."""
    workloads: dict[str, Any] = {}
    rows: list[list[Any]] = []
    named = set(config.clusters)
    known = _known_capacity(config.calibration)
    for workload in _workloads(config):
        margin: float | None = None
        if workload.name in known:
            util, table, margin = known[workload.name]
        else:
            util = calibrate_util(workload, config.max_slowdown)
            table = calibrate_table(workload, config.max_slowdown, config.table_sizes)
        trials: list[dict[str, Any]] = []
        if margin is None:
            margin, trials = calibrate_margin(workload, config, util, table)
        plans = {seed: _plan(workload, config, seed, util, table, margin) for seed in config.seeds}
        results: dict[str, Any] = {}
        for key in CONTROLLERS:
            if named and key not in named:
                continue
            if key in RAY_TARGETS and not named and _reached(results):
                continue
            if key in NAMED_ONLY and not named:
                continue
            runs = [_one(workload, config, seed, key, plans[seed]) for seed in config.seeds]
            results[key] = _mean(runs)
        ratios: dict[str, Any] = {}
        auto = results.get("autoscale")
        if auto is not None:
            for other in ("peak", "autoscale-table", "autoscale-one-util", *RAY_TARGETS):
                if other in results:
                    name = other.replace("-", "_").replace(".", "_")
                    ratios[f"gpu_hours_vs_{name}"] = auto["gpu_hours"] / results[other]["gpu_hours"]
                    ratios[f"attainment_minus_{name}"] = (
                        auto["attainment"] - results[other]["attainment"]
                    )
        workloads[workload.name] = {
            "results": results,
            "ratios": ratios,
            "ray_serve_equal_attainment": equal_attainment(results) if auto else None,
            "capacity": {"target_util": util, "by_size": [list(p) for p in table],
                         "margin": margin, "margin_trials": trials},
            "sizes": {str(s): {"peak": p.peak, "mean": p.mean, "first": p.first,
                               "one_util_peak": p.old_peak, "cap": p.cap}
                      for s, p in plans.items()},
        }  # fmt: skip
        peak_h = results["peak"]["gpu_hours"] if "peak" in results else None
        for key, r in results.items():
            rows.append(
                [
                    workload.name,
                    key,
                    r["gpu_hours"],
                    r["gpu_hours"] / peak_h if peak_h else None,
                    r["mean_workers"],
                    r["attainment"],
                    r["min_attainment"],
                    r["burst_attainment"],
                ]
            )
    print_table(
        f"elastic: a day of {config.minutes} minutes, {config.minute_s:g} s each, "
        f"start {config.start_s:g} s, seeds {','.join(map(str, config.seeds))}; "
        f"attainment = share within {config.max_slowdown:g}x best",
        ["workload", "cluster", "GPU-h", "vs peak", "mean workers", "attainment",
         "worst seed", "burst attainment"],
        rows,
    )  # fmt: skip
    out = {"config": {**asdict(config), "machine": machine()}, "workloads": workloads}
    write_json(json_path, out)
    return out


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    """``compass sim --traffic``: one workload over one rate curve (``daily`` or a CSV)."""

    workload: str
    traffic: str
    seed: int = 0
    minute_s: float = 60.0
    rate_scale: float = 1.0
    bounds: tuple[int, int] | None = None
    start_s: float = 30.0
    max_slowdown: float = 3.0
    policy: str = "compass"
    #: a capacity table file (:func:`~compass.elastic.table.read_capacity`): autoscale sizes
    #: by it (:func:`~compass.elastic.table.table_rule`), and peak and mean by its table;
    #: "": one utilization, calibrated here
    capacity_table: str = ""


def _hourly(jobs: list[Any], minute_s: float, max_slowdown: float) -> list[float | None]:
    """Attainment per trace hour (None: no job arrived in that hour)."""
    hour_s = 60.0 * minute_s
    hours: dict[int, list[bool]] = {}
    for j in jobs:
        ok = j.slowdown is not None and j.slowdown <= max_slowdown
        hours.setdefault(int(j.arrival // hour_s), []).append(ok)
    last = max(hours, default=-1)
    return [sum(hours[h]) / len(hours[h]) if h in hours else None for h in range(last + 1)]


def run_traffic(config: TrafficConfig, json_path: str | None = None) -> dict[str, Any]:
    """Autoscaling (within ``bounds``; default 1 to the peak size, or to the table's peak at
    its margin), peak, mean and Ray Serve's rule on one curve: GPU-hours, attainment,
    attainment per trace hour, jobs not answered in time or at all. Prints a table and writes
    JSON."""
    workload = load_workload(config.workload)
    curve = daily_curve(config.seed) if config.traffic == "daily" else read_counts(config.traffic)
    capacity = (
        read_capacity(config.capacity_table, workload.name) if config.capacity_table else None
    )
    top, scale = float(curve.max()), config.rate_scale
    if capacity is None:
        util = calibrate_util(workload, config.max_slowdown)
        peak, mean = _sizes(workload, top, scale, util)
        first = _sizes(workload, float(curve[0]), scale, util)[0]
        widest = peak
    else:
        table = capacity.by_size
        peak, mean = (
            _table_size(workload, top, scale, table),
            _table_size(workload, 1.0, scale, table),
        )
        first = _table_size(workload, float(curve[0]), scale, table, capacity.margin)
        widest = max(peak, _table_size(workload, top, scale, table, capacity.margin))
    low, high = config.bounds or (1, widest)
    arrivals = curve_arrivals(
        workload, curve, minute_s=config.minute_s, rate_scale=config.rate_scale, seed=config.seed
    )
    first = min(max(first, low), high)
    runs = {
        "autoscale": ("autoscale", first, low, high),
        "peak": ("fixed", peak, peak, peak),
        "mean": ("fixed", mean, mean, mean),
        "ray-serve-rule": ("ray-serve", first, low, high),
    }
    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for key, (controller, initial, minimum, maximum) in runs.items():
        opts = ElasticOptions(
            controller=controller,
            initial=initial,
            minimum=minimum,
            maximum=maximum,
            start_s=config.start_s,
            max_slowdown=config.max_slowdown,
            rule=(table_rule(capacity, minimum, maximum) if capacity is not None else
                  ScaleConfig(minimum=minimum, maximum=maximum, target_util=util,
                              band=min(0.15, util / 4))),
            ray=RayServeConfig(minimum=minimum, maximum=maximum),
        )  # fmt: skip
        result = simulate_elastic(workload, arrivals, opts, policy=config.policy, seed=config.seed)
        unanswered = sum(1 for j in result.jobs if j.finish is None)
        results[key] = {
            "gpu_hours": result.gpu_hours,
            "attainment": result.attainment(config.max_slowdown),
            "attainment_per_hour": _hourly(result.jobs, config.minute_s, config.max_slowdown),
            "jobs": len(result.jobs),
            "not_answered": unanswered,
            "starts": result.starts,
            "drains": result.drains,
        }
        rows.append([key, result.gpu_hours, results[key]["attainment"], len(result.jobs),
                     unanswered, result.starts, result.drains])  # fmt: skip
    print_table(
        f"{workload.name} over {config.traffic} ({len(curve)} minutes of {config.minute_s:g} s, "
        f"rate x{config.rate_scale:g}); attainment = share within {config.max_slowdown:g}x best",
        ["cluster", "GPU-h", "attainment", "jobs", "not answered", "starts", "drains"],
        rows,
    )
    out = {"config": {**asdict(config), "machine": machine()}, "results": results,
           "sizes": {"peak": peak, "mean": mean,
                     **({"target_util": util} if capacity is None else
                        {"capacity": capacity.to_json()})}}  # fmt: skip
    write_json(json_path, out)
    return out
