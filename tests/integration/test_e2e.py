"""The end-to-end benchmark's machinery on a real cluster, briefly: a smoke test, and the
simulator's placements against the real cluster's when jobs do not overlap."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from compass._bench import e2e
from compass.errors import ConfigError
from compass.sim.arrivals import Arrival
from compass.sim.engine import simulate
from compass.sim.goodput import priorities
from compass.sim.settings import SimSettings
from compass.workflow.spec import load_workload

from .conftest import PAPER, compass_argv

FLOWS = ["translation", "question_answer", "img_to_sound", "object_detection"]


@pytest.mark.asyncio
@pytest.mark.parametrize("policy", ["compass", "hash"])
async def test_short_e2e_run_completes_every_job(policy: str) -> None:
    config = e2e.E2EConfig(workload=PAPER, workers=3, jobs=16, time_scale=0.02, policies=(policy,))
    workload = load_workload(PAPER)
    arrivals = e2e.arrivals_for(config, workload)
    summary = await e2e.run_policy(config, workload, policy, arrivals)
    assert summary["completed"] == 16
    assert summary["failed"] == 0
    assert summary["p50_ms"] is not None and summary["p50_ms"] > 0
    assert summary["median_slowdown"] >= 0.9  # latency cannot beat the critical path by much
    assert 0.0 <= summary["cache_hit_rate"] <= 1.0
    assert summary["model_gb_loaded"] > 0  # cold caches: the first tasks load their models
    assert set(summary["breakdown_ms"]) == {"queue", "fetch", "transfer", "exec"}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("policy", "host_lanes"), [("compass", 0), ("jsq", 0), ("hash", 0), ("compass", 1)]
)
async def test_simulator_and_real_cluster_place_spaced_jobs_alike(
    policy: str, host_lanes: int
) -> None:
    workload = load_workload(PAPER)
    # every job alone on the cluster, given twice the longest it takes here: 6 s after a
    # translation (up to 3 s: its first run on a worker loads its big models), 3 s after the
    # others (up to 1.5 s)
    gaps = [6.0 if FLOWS[i % 4] == "translation" else 3.0 for i in range(7)]
    starts = itertools.accumulate(gaps, initial=0.0)
    arrivals = [Arrival(t, FLOWS[i % 4], i % 4) for i, t in enumerate(starts)]
    # idle-cache warming off on both sides: it starts when the workers do, before the first job
    # in a real cluster and at its arrival in the simulator; and hot-model replication, whose
    # rounds run on a timer: a loaded machine's slower real runs can show it waits that warm
    # a copy the simulator never sees, and move a later job's placement
    config = e2e.E2EConfig(
        workload=PAPER,
        workers=3,
        jobs=8,
        # not faster: the emulation's fixed cost per hop is divided by the time scale, and at
        # 0.05 it turned near-ties between two workers the other way now and then
        time_scale=0.2,
        host_lanes=host_lanes,
        extra_args=("--no-warm", "--no-replicate"),
    )
    real_plans = await e2e.run_policy(config, workload, policy, arrivals, keep_plans=True)
    settings = SimSettings(
        workers=3, policy=policy, warm=False, host_lanes=host_lanes, replicate=None
    )
    simulated = simulate(workload, settings, arrivals)
    sim_plans = [dict(job.plan) for job in sorted(simulated.jobs, key=lambda j: j.arrival)]
    assert real_plans["plans"] == sim_plans


@pytest.mark.asyncio
async def test_any_workload_in_the_spec_format_runs(tmp_path) -> None:
    import json

    spec = {
        "name": "tiny",
        "cluster": {"workers": 2, "gpu_memory_mb": 1000, "h2d_gbps": 2.0, "d2h_gbps": 2.0,
                    "net_gbps": 1.0, "net_fixed_us": 5},
        "models": {"a": {"size_mb": 600}, "b": {"size_mb": 300}},
        "workflows": {
            "pair": {"best_ms": 30, "tasks": {
                "first": {"model": "a", "exec_ms": 20, "input_kb": 10, "output_kb": 5,
                          "after": []},
                "second": {"model": "b", "exec_ms": 10, "output_kb": 1, "after": ["first"]},
            }},
        },
        "arrivals": {"mean_interval_ms_per_client": 100, "jobs": 10},
    }  # fmt: skip
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    config = e2e.E2EConfig(workload=str(path), workers=2, jobs=12, time_scale=0.2)
    workload = load_workload(path)
    arrivals = e2e.arrivals_for(config, workload)
    real = await e2e.run_policy(config, workload, "compass", arrivals)
    simulated = simulate(workload, SimSettings(workers=2, policy="compass"), arrivals).summary()
    for summary in (real, simulated):
        assert summary["completed"] == 12
        assert summary["failed"] == 0
        assert summary["median_slowdown"] >= 0.9
    # 600 + 300 MB models in a 1000 MB cache: both fit on one worker at once
    assert real["cache_hit_rate"] > 0.5


def test_compare_real_reports_the_relative_difference_of_both_runs(tmp_path) -> None:
    """On the paper's workload with steps, whose generations batch their steps, on workers
    that preempt at step boundaries (``--preempt``), as the simulator does."""
    import json

    from compass._bench import fidelity

    config = e2e.E2EConfig(
        workload=str(Path(PAPER).with_name("paper-steps.json")), workers=2, jobs=12,
        time_scale=0.05, policies=("compass", "hash"), preempt=True,
    )  # fmt: skip
    out = fidelity.run(config, str(tmp_path / "fidelity.json"))
    assert json.loads((tmp_path / "fidelity.json").read_text())["results"].keys() == {
        "compass",
        "hash",
    }
    for policy, result in out["results"].items():
        real, sim = result["real"], result["sim"]
        assert real["completed"] == sim["completed"] == 12, policy
        for key in ("p50_ms", "p99_ms", "median_slowdown"):
            expected = (sim[key] - real[key]) / real[key]
            assert result["relative_difference"][key] == pytest.approx(expected), (policy, key)
        # each side's share of jobs within each SLO's slowdown, from its own jobs
        within = sum(1 for s in real["slowdowns"] if s is not None and s <= 3) / 12
        assert result["within"]["real"]["p95x3"] == within
        for side in ("real", "sim"):
            shares = result["within"][side]
            assert shares.keys() == {"median2", "p95x3", "p99x5"}
            assert shares["median2"] <= shares["p95x3"] <= shares["p99x5"] <= 1.0


def test_e2e_capacity_searches_real_clusters_and_writes_the_capacity_layout(tmp_path) -> None:
    """``compass bench e2e --capacity`` end to end, on real worker processes: an SLO met at
    every load on the grid has the grid's top as capacity, an impossible one (a median
    slowdown below 1) none, and the JSON has the issue's layout."""
    import json

    from compass.sim.capacity import parse_slo

    spec = {
        "name": "one-step",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 2.0, "d2h_gbps": 2.0,
                    "net_gbps": 1.0, "net_fixed_us": 5},
        "models": {"a": {"size_mb": 100}},
        "workflows": {"one": {"tasks": {
            "step": {"model": "a", "exec_ms": 20, "input_kb": 1, "output_kb": 1, "after": []},
        }}},
        "arrivals": {"mean_interval_ms_per_client": 400, "jobs": 6},
    }  # fmt: skip
    path = tmp_path / "one.json"
    path.write_text(json.dumps(spec))
    config = e2e.E2EConfig(
        workload=str(path), workers=1, jobs=6, time_scale=0.2, policies=("compass", "hash")
    )
    out_path = tmp_path / "capacity.json"
    out = e2e.run_capacity(
        config,
        seeds=(0,),
        slos=[parse_slo("median100"), parse_slo("median0.5")],
        max_load=1.0,
        steps=0,
        json_path=str(out_path),
    )
    written = json.loads(out_path.read_text())
    assert written["config"]["mode"] == "real" and written["config"]["seeds"] == [0]
    for policy in ("compass", "hash"):
        easy = written["capacity"]["median100"][policy]
        assert easy == {"mean": 1.0, "min": 1.0, "max": 1.0, "seeds": [1.0]}
        assert written["capacity"]["median0.5"][policy] is None
    assert written["ratios"]["median100"]["hash"] == [1.0]
    # every run was a real cluster: the loads of the grid, each policy once per load
    assert out["runs"] == 2 * len(written["config"]["grid"])


def test_short_workloads_are_emulated_at_a_slower_time_scale() -> None:
    """A hop costs real milliseconds whatever the time scale: a workload whose shortest
    workflow would take a few real ms at 0.25 runs slower, so the hop stays a small share."""
    root = Path(__file__).resolve().parents[2] / "bench" / "workloads"
    assert e2e.auto_time_scale(load_workload(root / "paper.json")) == 0.25
    short = load_workload(root / "short.json")
    shortest = min(e2e.best_ms(short).values())
    assert shortest < 10  # 7 ms: 1.8 ms of real time at 0.25
    assert e2e.auto_time_scale(short) == pytest.approx(e2e.SHORTEST_REAL_MS / shortest, abs=0.01)


@pytest.mark.asyncio
async def test_a_real_run_with_deadlines_reports_goodput_refusals_and_drops() -> None:
    # 8x the paper's rate on 2 workers with deadlines of 1.5x the best time: far past capacity
    config = e2e.E2EConfig(
        workload=PAPER, workers=2, jobs=24, time_scale=0.02, policies=("compass",), load=8.0,
        deadline_x=1.5, priority_mix=0.5,
    )  # fmt: skip
    workload = load_workload(PAPER)
    arrivals = e2e.arrivals_for(config, workload)
    summary = await e2e.run_policy(config, workload, "compass", arrivals)
    assert summary["completed"] + summary["failed"] == 24
    # no other failure: refused at the door, dropped on the way, or answered late (a result
    # past its deadline is DeadlineExceeded)
    assert summary["failed"] == summary["refused"] + summary["dropped"] + summary["late"]
    assert summary["refused"] + summary["dropped"] >= 1  # shed, not queued for ever
    assert summary["goodput"] == pytest.approx(8.0 * summary["attainment"])
    assert 0.0 <= summary["attainment"] <= summary["completed"] / 24
    by_level = summary["attainment_by_priority"]
    levels = priorities(24, 0.5, config.seed)
    assert set(by_level) == {str(level) for level in levels}
    shares = [by_level[str(level)] for level in levels]
    assert summary["attainment"] == pytest.approx(sum(shares) / 24)  # each job counted once


def test_a_priority_mix_needs_deadlines() -> None:
    with pytest.raises(ConfigError, match="--priority-mix needs --deadline-x"):
        e2e.E2EConfig(priority_mix=0.3)
    with pytest.raises(ConfigError, match="fraction"):
        priorities(3, 1.5, 0)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(180)
def test_ctrl_c_during_bench_e2e_stops_the_workers_it_started(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    log = (tmp_path / "bench.err").open("w")
    bench = subprocess.Popen(
        compass_argv("bench", "e2e", "--policies", "compass", "--workers", "2", "--jobs", "400",
                     "--load", "0.05", "--time-scale", "1"),
        stdout=subprocess.DEVNULL, stderr=log, env={**worker_env, "PYTHONFAULTHANDLER": "1"},
        # Ctrl-C as at a terminal: a test run started in the background (a shell's `&`)
        # ignores SIGINT, and a child would inherit that and never see the signal
        preexec_fn=_default_sigint,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _children(bench.pid)
        assert len(workers) >= 2, "the benchmark did not start its workers"
        time.sleep(2.0)  # jobs under way
        bench.send_signal(signal.SIGINT)
        try:
            bench.wait(60)
        except subprocess.TimeoutExpired:
            bench.send_signal(signal.SIGABRT)  # its threads' stacks, by faulthandler
            bench.wait(10)
            log.flush()
            pytest.fail(
                "bench e2e did not exit on Ctrl-C:\n" + (tmp_path / "bench.err").read_text()[-6000:]
            )
        deadline = time.monotonic() + 40
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], "workers left behind"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in workers:  # a failing run must not leave them behind either
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()
