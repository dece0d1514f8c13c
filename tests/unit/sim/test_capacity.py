"""Capacity at an SLO: parsing, attainment, the grid-plus-bisection search against
hand-computed answers, the cache of runs, ratios, the JSON layout and the command line."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from compass._bench.generalize import summarize, versus_best
from compass.errors import ConfigError
from compass.sim.capacity import (
    BUILTIN_SLOS,
    CapacitySearch,
    SimRuns,
    Slo,
    attainment,
    capacity_at,
    capacity_for_workload,
    load_grid,
    meets,
    parse_seeds,
    parse_slo,
    physical_bound,
    ratio,
    search_capacity,
)
from compass.workflow import Workload, parse_workload

MEDIAN2, P95X3, P99X5 = BUILTIN_SLOS
TOL = 0.02
ROOT = Path(__file__).resolve().parents[3]


def one_task_spec(exec_ms: float = 100.0, interval_ms: float = 1000.0) -> dict[str, Any]:
    """One workflow of one model-less task on one worker; one client, a job per interval."""
    return {
        "name": "one",
        "cluster": {
            "workers": 1,
            "gpu_memory_mb": 1000,
            "h2d_gbps": 10,
            "d2h_gbps": 10,
            "net_gbps": 10,
        },
        "models": {"m": {"size_mb": 10}},
        "workflows": {
            "f": {"tasks": {"t": {"model": None, "exec_ms": exec_ms, "output_kb": 1, "after": []}}}
        },
        "arrivals": {"mean_interval_ms_per_client": interval_ms, "jobs": 100},
    }


def one_task() -> Workload:
    return parse_workload(one_task_spec())


def breaking_load(slo: Slo, jobs: int, warmup: int = 0) -> float:
    """Jobs every 1/L s on a 0.1 s task: below L = 10 nobody waits; above it job k (from 0)
    waits k (0.1 - 1/L) s, so its slowdown is 1 + k (1 - 10/L). The SLO needs the first
    ceil(q n) jobs within S: L <= 10 / (1 - (S - 1) / (ceil(q n) - 1)). With the first
    ``warmup`` jobs not counted, the ceil(q (n - w)) counted ones from job w must be: job
    w + ceil(q (n - w)) - 1 is the last, and the load falls towards the bound, 10."""
    needed = math.ceil(slo.quantile * (jobs - warmup))
    return 10.0 / (1.0 - (slo.max_slowdown - 1.0) / (warmup + needed - 1))


# --- SLOs and attainment ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "quantile", "bound"),
    [
        ("p90x4", 0.9, 4.0),
        ("median1.5", 0.5, 1.5),
        ("medianx3", 0.5, 3.0),
        (" P99.9X10 ", 0.999, 10.0),
        ("p100x2", 1.0, 2.0),
    ],
)
def test_parse_slo_reads_percentile_and_median_forms(
    text: str, quantile: float, bound: float
) -> None:
    slo = parse_slo(text)
    assert slo.quantile == pytest.approx(quantile)
    assert slo.max_slowdown == bound
    assert slo.name == text.strip().lower()


def test_parse_slo_gives_the_builtins_back() -> None:
    assert [parse_slo(s.name) for s in BUILTIN_SLOS] == list(BUILTIN_SLOS)
    assert (MEDIAN2.quantile, MEDIAN2.max_slowdown) == (0.5, 2.0)
    assert (P95X3.quantile, P95X3.max_slowdown) == (0.95, 3.0)
    assert (P99X5.quantile, P99X5.max_slowdown) == (0.99, 5.0)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("p95", "expected pNNxS"),
        ("x3", "expected pNNxS"),
        ("median", "expected pNNxS"),
        ("p95x3x", "expected pNNxS"),
        ("", "expected pNNxS"),
        ("p0x3", "percentile must be in (0, 100]"),
        ("p101x2", "percentile must be in (0, 100]"),
        ("p95x0", "slowdown must be > 0"),
        ("median0", "slowdown must be > 0"),
    ],
)
def test_parse_slo_rejects_bad_text_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_slo(text)
    assert says in str(info.value) and repr(text) in str(info.value)
    assert "\n" not in str(info.value)


def test_slo_validates_its_fields() -> None:
    with pytest.raises(ConfigError, match="quantile"):
        Slo("bad", 1.5, 2.0)
    with pytest.raises(ConfigError, match="max slowdown"):
        Slo("bad", 0.5, math.inf)


def test_an_unfinished_job_misses_every_slo() -> None:
    slowdowns = [1.0, None, 2.5, 1.5]
    assert attainment(slowdowns, MEDIAN2) == 0.5
    assert meets(slowdowns, MEDIAN2)  # exactly half within 2
    assert attainment(slowdowns, P95X3) == 0.75
    assert not meets(slowdowns, P95X3)
    assert attainment([None, None], P99X5) == 0.0
    assert meets([1.0] * 95 + [9.0] * 5, P95X3)  # 95 of 100 meets 0.95, no rounding slip
    assert not meets([1.0] * 94 + [9.0] * 6, P95X3)
    with pytest.raises(ConfigError, match="without jobs"):
        attainment([], MEDIAN2)


def test_parse_seeds_and_grid() -> None:
    assert parse_seeds("0-4") == (0, 1, 2, 3, 4)
    assert parse_seeds("0,2, 7") == (0, 2, 7)
    assert parse_seeds("3") == (3,)
    for bad in ("4-1", "a", "1,1", "-2", ""):
        with pytest.raises(ConfigError, match="seeds"):
            parse_seeds(bad)
    assert load_grid(5.0) == (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0)
    assert load_grid(0.1) == (0.1,)
    with pytest.raises(ConfigError, match="max load"):
        load_grid(0.0)


# --- the search ------------------------------------------------------------------------


def test_capacity_in_the_simulator_matches_the_hand_computed_breaking_load() -> None:
    from compass.sim.capacity import simulator_run

    jobs = 100
    workload = one_task()
    assert physical_bound(workload, 1) == pytest.approx(10.0)
    run = simulator_run(workload, SimRuns(workers=1, jobs=jobs, arrival="uniform"))
    out = search_capacity(
        run, policies=["compass"], seeds=[0], slos=BUILTIN_SLOS, grid=load_grid(16), rel_tol=TOL
    )
    for slo in BUILTIN_SLOS:
        found = out["capacity"][slo.name]["compass"]["seeds"][0]
        exact = breaking_load(slo, jobs)
        assert exact / (1 + TOL) <= found <= exact, (slo.name, found, exact)
    # below the physical bound every job runs alone
    assert out["attainment"]["compass"]["8"] == {s.name: 1.0 for s in BUILTIN_SLOS}
    assert out["attainment"]["compass"]["12"]["median2"] < 0.5


def test_a_warm_up_leaves_the_first_jobs_out_and_the_capacity_falls_to_the_bound() -> None:
    from compass.sim.capacity import simulator_run

    jobs, warmup = 100, 60
    fine = 0.002  # median2 moves 10.20 -> 10.13: finer than the default 2%
    workload = one_task()
    found = {}
    for left_out in (0, warmup):
        run = simulator_run(
            workload, SimRuns(workers=1, jobs=jobs, warmup=left_out, arrival="uniform")
        )
        assert len(run("compass", 0, 12.0)) == jobs - left_out
        out = search_capacity(
            run,
            policies=["compass"],
            seeds=[0],
            slos=BUILTIN_SLOS,
            grid=load_grid(16),
            rel_tol=fine,
            max_steps=12,
        )
        found[left_out] = {
            s.name: out["capacity"][s.name]["compass"]["seeds"][0] for s in BUILTIN_SLOS
        }
    for slo in BUILTIN_SLOS:
        exact = breaking_load(slo, jobs, warmup)
        assert exact / (1 + fine) <= found[warmup][slo.name] <= exact, (slo.name, exact)
        # the jobs that met a short queue are out: nearer the bound (10) than without
        assert 10.0 <= found[warmup][slo.name] <= found[0][slo.name]
    # the median's counted jobs are the later ones: 10.20 without, 10.13 with
    assert found[warmup]["median2"] < found[0]["median2"] / (1 + fine)
    with pytest.raises(ConfigError, match="fewer than the run's 100"):
        SimRuns(workers=1, jobs=jobs, warmup=jobs)
    with pytest.raises(ConfigError, match="warm-up"):
        SimRuns(workers=1, jobs=jobs, warmup=-1)


def fixed(value: float, jobs: int = 20) -> list[float | None]:
    return [value] * jobs


def test_capacity_at_stops_at_the_first_miss_going_up() -> None:
    # every job's slowdown equals the load: median2 holds up to exactly 2
    assert capacity_at(lambda load: fixed(load), MEDIAN2, load_grid(8)) == 2.0
    assert capacity_at(lambda load: fixed(load), P99X5, load_grid(8)) == 5.0
    # a run that misses at 1 but meets again at 1.5 and 2: the first miss bounds the answer
    bumpy = capacity_at(
        lambda load: fixed(9.0 if load == 1.0 or load >= 3 else 1.0), MEDIAN2, load_grid(8)
    )
    assert bumpy is not None and 0.98 <= bumpy < 1.0
    # misses at the lowest load: no capacity; meets everywhere: capped at the top
    assert capacity_at(lambda load: fixed(9.0), MEDIAN2, load_grid(8)) is None
    assert capacity_at(lambda load: fixed(1.0), MEDIAN2, load_grid(8)) == 8.0
    # no bisection steps: the last grid load that met
    assert capacity_at(lambda load: fixed(load / 2.2), MEDIAN2, load_grid(8), max_steps=0) == 4.0


def test_runs_are_cached_and_shared_by_every_slo() -> None:
    calls: Counter[tuple[str, int, float]] = Counter()

    def run(policy: str, seed: int, load: float) -> list[float | None]:
        calls[(policy, seed, load)] += 1
        return fixed(load * (1 + seed / 10))

    grid = load_grid(8)
    out = search_capacity(
        run, policies=["compass", "hash"], seeds=[0, 1], slos=BUILTIN_SLOS, grid=grid
    )
    assert set(calls.values()) == {1}  # no (policy, seed, load) ran twice
    assert out["runs"] == len(calls)
    # without the cache each SLO would redo its own walk up the grid
    uncached = 0

    def counted(load: float, seed: int) -> list[float | None]:
        nonlocal uncached
        uncached += 1
        return fixed(load * (1 + seed / 10))

    for slo in BUILTIN_SLOS:
        for seed in (0, 1):
            capacity_at(functools.partial(counted, seed=seed), slo, grid)
    per_policy = len(calls) / 2
    assert per_policy < uncached  # fewer runs than the SLOs' separate searches make
    per_seed = out["attainment_by_seed"]["hash"]
    assert set(per_seed) == {"0", "1"}
    assert per_seed["0"]["2"] == {"median2": 1.0, "p95x3": 1.0, "p99x5": 1.0}


def test_ratios_and_missing_capacity() -> None:
    def run(policy: str, seed: int, load: float) -> list[float | None]:
        if policy == "compass":
            return fixed(load / 2)  # twice the capacity of hash
        if policy == "random":
            return [None] * 20  # never finishes a job
        if policy == "jsq":
            return fixed(load if seed == 0 else 9.0)  # only seed 0 meets anything
        return fixed(load)

    out = search_capacity(
        run,
        policies=["compass", "hash", "random", "jsq"],
        seeds=[0, 1],
        slos=[MEDIAN2],
        grid=load_grid(8),
    )
    cap = out["capacity"]["median2"]
    assert cap["compass"] == {"mean": 4.0, "min": 4.0, "max": 4.0, "seeds": [4.0, 4.0]}
    assert cap["hash"]["seeds"] == [2.0, 2.0]
    assert cap["random"] is None
    # a seed without capacity counts as 0 in the spread
    assert cap["jsq"] == {"mean": 1.0, "min": 0.0, "max": 2.0, "seeds": [2.0, None]}
    assert out["ratios"] == {
        "median2": {"hash": [2.0, 2.0], "random": [None, None], "jsq": [2.0, None]}
    }
    assert ratio(None, 2.0) is None and ratio(2.0, None) is None and ratio(3.0, 1.5) == 2.0
    assert set(out["attainment"]["random"]["0.25"].values()) == {0.0}
    without_compass = search_capacity(
        run, policies=["hash"], seeds=[0], slos=[MEDIAN2], grid=load_grid(8)
    )
    assert without_compass["ratios"] == {}


def test_search_rejects_bad_arguments() -> None:
    def run(policy: str, seed: int, load: float) -> list[float | None]:
        return fixed(1.0)

    good: dict[str, Any] = {
        "policies": ["hash"],
        "seeds": [0],
        "slos": [MEDIAN2],
        "grid": [1.0, 2.0],
    }
    for key, value, says in [
        ("policies", [], "policies"),
        ("seeds", [1, 1], "seeds"),
        ("slos", [MEDIAN2, MEDIAN2], "SLOs"),
        ("grid", [2.0, 1.0], "increasing"),
        ("grid", [0.0, 1.0], "increasing"),
    ]:
        with pytest.raises(ConfigError, match=says):
            search_capacity(run, **{**good, key: value})
    with pytest.raises(ConfigError, match="ran no jobs"):
        search_capacity(lambda p, s, x: [], **good)


def test_capacity_for_workload_json_layout() -> None:
    out = capacity_for_workload(
        one_task(),
        ["compass", "hash"],
        SimRuns(workers=1, jobs=30, arrival="uniform"),
        CapacitySearch(seeds=(0, 1), max_load=16),
    )
    json.dumps(out, allow_nan=False)  # plain JSON: no NaN or infinity anywhere
    assert set(out) >= {"config", "capacity", "ratios", "attainment"}
    assert out["config"]["physical_bound"] == pytest.approx(10.0)
    assert out["config"]["seeds"] == [0, 1] and out["config"]["workers"] == 1
    assert set(out["capacity"]) == {"median2", "p95x3", "p99x5"}
    for by_policy in out["capacity"].values():
        assert set(by_policy) == {"compass", "hash"}
        for entry in by_policy.values():
            assert set(entry) == {"mean", "min", "max", "seeds"}
            assert len(entry["seeds"]) == 2
            assert 8 <= entry["min"] <= entry["mean"] <= entry["max"] <= 12
    assert set(out["ratios"]["median2"]) == {"hash"}
    for by_load in out["attainment"].values():
        for fractions in by_load.values():
            assert set(fractions) == {"median2", "p95x3", "p99x5"}
    with pytest.raises(ConfigError, match="unknown policy 'fastest'"):
        capacity_for_workload(
            one_task(), ["fastest"], SimRuns(workers=1), CapacitySearch(seeds=(0,))
        )


def test_busy_share_at_each_capacity_says_whether_the_lanes_saturated() -> None:
    jobs = 30
    out = capacity_for_workload(
        one_task(),
        ["compass"],
        SimRuns(workers=1, jobs=jobs, arrival="uniform"),
        CapacitySearch(seeds=(0, 1), max_load=16),
    )
    json.dumps(out, allow_nan=False)
    for seed in ("0", "1"):
        by_load = out["busy"]["compass"][seed]
        assert set(by_load) == set(out["attainment_by_seed"]["compass"][seed])
        for load, share in by_load.items():
            # a 0.1 s task every 1/L s: busy L/10 of the time, the drain's 0.1 s aside,
            # and always, from the bound on
            expected = min(1.0, float(load) / 10.0)
            assert expected * (jobs - 1) / jobs <= share <= expected * jobs / (jobs - 1), load
    # 30 jobs pass a load past the bound: the queue grows, but not enough to show in so
    # few jobs; the busy share at that capacity says the lanes never idled
    for slo in BUILTIN_SLOS:
        capacities = out["capacity"][slo.name]["compass"]["seeds"]
        assert all(c > 10.0 for c in capacities)
        at = out["busy_at_capacity"][slo.name]["compass"]
        assert at == {"mean": 1.0, "seeds": [1.0, 1.0]}


def test_physical_bound_counts_gpu_seconds_per_second() -> None:
    spec = one_task_spec(exec_ms=50.0, interval_ms=500.0)
    spec["workflows"]["g"] = {
        "weight": 2,
        "tasks": {
            "a": {"model": "m", "exec_ms": 150, "output_kb": 1, "after": []},
            "b": {"model": None, "exec_ms": 100, "output_kb": 1, "after": ["a"]},
        },
    }
    workload = parse_workload(spec)
    # per second at load 1: 2 jobs of f (0.05 s) + 4 of g (weight 2, 0.25 s) = 1.1 GPU s
    assert physical_bound(workload, 3) == pytest.approx(3 / 1.1)
    # model-less tasks on host lanes: 4 x 0.15 s of GPU work a second
    assert physical_bound(workload, 3, host_lanes=1) == pytest.approx(3 / 0.6)


# --- generalize's summary ----------------------------------------------------------------


def test_versus_best_baseline() -> None:
    assert versus_best({"compass": 3.0, "jsq": 1.5, "hash": 1.0}) == (2.0, "jsq")
    assert versus_best({"compass": None, "jsq": 1.5, "hash": None}) == (0.0, "jsq")
    assert versus_best({"compass": 2.0, "jsq": None, "hash": None}) == (None, None)
    with pytest.raises(ConfigError, match="compass"):
        versus_best({"jsq": 1.0})


def test_generalize_summary_median_and_min() -> None:
    rows = [
        {"seed": 0, "ratio": {"median2": 2.0, "p95x3": 1.0}},
        {"seed": 1, "ratio": {"median2": 1.0, "p95x3": None}},
        {"seed": 2, "ratio": {"median2": 4.0, "p95x3": 3.0}},
        {"seed": 3, "ratio": {"median2": 0.5, "p95x3": None}},
    ]
    out = summarize(rows, ["median2", "p95x3", "p99x5"])
    assert out["median"] == {"median2": 1.5, "p95x3": 2.0, "p99x5": None}
    assert out["min"] == {"median2": 0.5, "p95x3": 1.0, "p99x5": None}
    assert out["undefined"] == {"median2": 0, "p95x3": 2, "p99x5": 4}


# --- the command line --------------------------------------------------------------------


def compass(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compass", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_sim_capacity_writes_the_json_layout(tmp_path: Path) -> None:
    spec = tmp_path / "one.json"
    spec.write_text(json.dumps(one_task_spec()))
    out_json, out_png = tmp_path / "out" / "cap.json", tmp_path / "out" / "cap.png"
    done = compass(
        "sim", "--capacity", "--workload", str(spec), "--workers", "1",
        "--policies", "compass,hash", "--arrival", "uniform", "--jobs", "30",
        "--seeds", "0-1", "--max-load", "16", "--slo", "p90x4", "--slo", "median1.5,p90x4",
        "--json", str(out_json), "--plot", str(out_png),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(out_json.read_text())
    slos = {"median2", "p95x3", "p99x5", "p90x4", "median1.5"}
    assert set(written["config"]["slos"]) == slos
    assert written["config"]["physical_bound"] == pytest.approx(10.0)
    assert written["config"]["seeds"] == [0, 1]
    assert set(written["capacity"]) == slos
    for by_policy in written["capacity"].values():
        for entry in by_policy.values():
            assert set(entry) == {"mean", "min", "max", "seeds"}
    assert set(written["ratios"]) == slos
    assert set(written["attainment"]) == {"compass", "hash"}
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "physical bound 10.00" in done.stdout
    assert "compass / policy capacity" in done.stdout
    assert set(written["busy_at_capacity"]) == slos
    assert "lanes busy at each capacity" in done.stdout


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--slo", "p95", "'p95'"),
        ("--seeds", "3-1", "'3-1'"),
        ("--max-load", "0", "--max-load"),
        ("--warmup", "5", "--warmup 5 must be fewer than --jobs 5"),
    ],
)
def test_cli_sim_capacity_bad_flag_is_one_line(
    tmp_path: Path, flag: str, value: str, says: str
) -> None:
    done = compass("sim", "--capacity", "--jobs", "5", flag, value, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""


def test_cli_warmup_is_for_capacity_only(tmp_path: Path) -> None:
    done = compass("sim", "--jobs", "5", "--warmup", "2", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--warmup is for --capacity" in lines[0], done.stderr


def test_physical_bound_agrees_with_the_generator_utilization() -> None:
    from compass.workflow.generate import expected_utilization, generate_workload

    for seed in (0, 1):
        workload = generate_workload(seed)
        bound = physical_bound(workload, workload.cluster.workers)
        assert bound == pytest.approx(1.0 / expected_utilization(workload))
