"""Goodput on a workload small enough to compute by hand: one worker, one 100 ms task, a job
every 100 ms at load 1, deadlines of 1.6 times the best time (160 ms)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compass.errors import ConfigError
from compass.sim.goodput import goodput_for_workload, run_summary, simulator_goodput_run
from compass.workflow.spec import parse_workload

JOBS = 20


def tiny_cluster() -> dict[str, Any]:
    return {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
            "net_gbps": 10, "net_fixed_us": 0}  # fmt: skip


def tiny() -> Any:
    task: dict[str, Any] = {
        "model": None,
        "exec_ms": 100,
        "output_kb": 0,
        "input_kb": 0,
        "after": [],
    }
    cluster = {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
               "net_gbps": 10, "net_fixed_us": 0}  # fmt: skip
    spec = {
        "name": "tiny",
        "cluster": cluster,
        "models": {},
        "workflows": {"one": {"tasks": {"t": task}}},
        "arrivals": {"mean_interval_ms_per_client": 100, "jobs": JOBS},
    }
    return parse_workload(spec, source="tiny")


def run(shed: list[bool], priority_mix: float = 0.0) -> dict[str, Any]:
    sim = simulator_goodput_run(
        tiny(), workers=1, jobs=JOBS, deadline_x=1.6, priority_mix=priority_mix, arrival="uniform"
    )
    return goodput_for_workload(sim, policies=["compass"], loads=[1.0, 2.0], seeds=[0], shed=shed)


def test_goodput_holds_at_twice_capacity_with_shedding_and_collapses_without() -> None:
    out = run([True, False])
    on, off = out["goodput"]["compass"], out["goodput"]["compass (no shedding)"]
    # load 1: a job every 100 ms, each alone on the worker: every one within 160 ms
    assert on["1"]["mean"] == pytest.approx(1.0) and off["1"]["mean"] == pytest.approx(1.0)
    # load 2, a job every 50 ms. Shedding: job 0 runs at once and job 1 waits 50 ms behind it
    # (it ends at 200 ms, 150 after it came); from then on job 2k would wait 100 ms behind job
    # 2k - 1 and is refused, job 2k + 1 waits 50 ms and makes it: jobs 0, 1, 3, ..., 19, 11 of
    # 20 at twice the rate: goodput 1.1
    assert on["2"]["mean"] == pytest.approx(2.0 * 11 / JOBS)
    assert out["attainment"]["compass"]["2"]["mean"] == pytest.approx(11 / JOBS)
    assert out["refused"]["compass"]["2"] == 9 and out["dropped"]["compass"]["2"] == 0
    # no shedding: job k ends at 100 k + 100 ms, 50 k + 100 ms after it came: only jobs 0 and 1
    # make 160 ms; the rest queue ever longer, every one late
    assert off["2"]["mean"] == pytest.approx(2.0 * 2 / JOBS)
    assert out["refused"]["compass (no shedding)"]["2"] == 0


def test_priorities_are_drawn_per_job_and_reported_per_level() -> None:
    out = run([True], priority_mix=0.5)
    levels = out["attainment_by_priority"]["compass"]["1"]
    assert set(levels) == {"0", "1"} and levels["0"] == levels["1"] == pytest.approx(1.0)
    assert out["config"]["shed"] == [True] and out["config"]["loads"] == [1.0, 2.0]


def test_a_run_summary_counts_what_it_says() -> None:
    assert run_summary([], 3.0)["goodput"] == 0.0
    with pytest.raises(ConfigError, match="deadline-x"):
        simulator_goodput_run(tiny(), workers=1, jobs=1, deadline_x=0.5)
    with pytest.raises(ConfigError, match="priority-mix"):
        simulator_goodput_run(tiny(), workers=1, jobs=1, deadline_x=2, priority_mix=1.5)


def test_compass_sim_goodput_writes_the_documented_layout_and_a_plot(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from compass._cli.main import main

    spec = tmp_path / "tiny.json"
    workload = tiny()
    from compass.workflow.spec import workload_to_dict

    spec.write_text(json.dumps(workload_to_dict(workload)))
    out, plot = tmp_path / "g.json", tmp_path / "g.png"
    with pytest.raises(SystemExit) as done:
        main(["sim", "--goodput", "--workload", str(spec), "--policies", "compass,hash",
              "--loads", "1,2", "--seeds", "0-1", "--jobs", "20", "--deadline-x", "1.6",
              "--arrival", "uniform", "--priority-mix", "0.5", "--json", str(out),
              "--plot", str(plot)])  # fmt: skip
    assert done.value.code in (0, None)
    data = json.loads(out.read_text())
    assert set(data) == {"config", "goodput", "attainment", "attainment_by_priority",
                         "refused", "dropped", "wasted_share", "bound", "bound_batched",
                         "ttfo_p99_by_priority"}  # fmt: skip
    # one 100 ms task a job, a job every 100 ms at load 1: the lane is full at load 1 (nothing
    # batches, so full batches reach no further)
    assert data["bound"] == pytest.approx(1.0) == data["bound_batched"]
    assert data["wasted_share"]["compass"]["2"] == 0.0  # shed at the door: nothing dropped
    assert set(data["goodput"]) == {"compass", "compass (no shedding)", "hash",
                                    "hash (no shedding)"}  # fmt: skip
    assert data["goodput"]["compass"]["2"]["mean"] == pytest.approx(1.1)
    assert set(data["goodput"]["compass"]["1"]) == {"mean", "min", "max"}
    assert set(data["attainment_by_priority"]["hash"]["1"]) == {"0", "1"}
    # a job of plain tasks has its first output with its answer: at load 1, alone, 100 ms
    assert data["ttfo_p99_by_priority"]["compass"]["1"]["1"] == pytest.approx(0.1)
    assert data["config"]["deadline_x"] == 1.6 and plot.stat().st_size > 0
    assert "goodput" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        main(["sim", "--goodput", "--workload", str(spec), "--loads", "1,x"])
    assert bad.value.code == 2


def test_a_job_s_deadline_reaches_its_later_tasks_in_the_simulator() -> None:
    from compass.objective import Objective
    from compass.sim.arrivals import Arrival
    from compass.sim.engine import simulate
    from compass.sim.settings import SimSettings

    step: dict[str, Any] = {"model": None, "exec_ms": 100, "output_kb": 0, "input_kb": 0}
    spec = {
        "name": "chain",
        "cluster": tiny_cluster(),
        "models": {},
        "workflows": {
            "chain": {"tasks": {"a": {**step, "after": []}, "b": {**step, "after": ["a"]}}}
        },
        "arrivals": {"mean_interval_ms_per_client": 100, "jobs": 2},
    }
    # job 0 (250 ms to go) runs a from 0 to 100 ms; job 1, priority 1 and no deadline, comes at
    # 50 ms and takes the lane before job 0's b, which could then start only at 200 ms: too
    # late to end by 250, so it is dropped (with no deadline on b it would run, late)
    arrivals = [
        Arrival(0.0, "chain", 0, Objective(deadline_s=0.25)),
        Arrival(0.05, "chain", 0, Objective(priority=1)),
    ]
    result = simulate(
        parse_workload(spec, source="chain"), SimSettings(workers=1, policy="compass"), arrivals
    )
    first, second = sorted(result.jobs, key=lambda j: j.arrival)
    assert first.outcome == "dropped" and first.priority == 0 and first.deadline_s == 0.25
    # job 1 waits for job 0's a (to 100 ms), then runs a and b: 250 ms after it came
    assert second.outcome == "ok" and second.latency_s == pytest.approx(0.25)


def test_the_simulator_delivers_a_task_s_objective_across_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compass.core.messages import TaskMsg
    from compass.objective import Objective
    from compass.sim import engine
    from compass.sim.arrivals import Arrival
    from compass.sim.settings import SimSettings

    step: dict[str, Any] = {"model": None, "exec_ms": 100, "output_kb": 0, "input_kb": 0}
    spec = {
        "name": "chain",
        "cluster": {**tiny_cluster(), "workers": 2},
        "models": {},
        "workflows": {
            "chain": {"tasks": {"a": {**step, "after": []}, "b": {**step, "after": ["a"]}}}
        },
        "arrivals": {"mean_interval_ms_per_client": 100, "jobs": 1},
    }
    delivered: list[TaskMsg] = []
    deliver = engine.Simulation._deliver

    def record(self: Any, arg: Any) -> None:
        if isinstance(arg[2], TaskMsg):
            delivered.append(arg[2])
        deliver(self, arg)

    monkeypatch.setattr(engine.Simulation, "_deliver", record)
    arrival = Arrival(0.0, "chain", 0, Objective(deadline_s=5.0, priority=2))
    engine.simulate(
        parse_workload(spec, source="chain"),
        SimSettings(workers=2, policy="round_robin"),
        [arrival],
    )
    hops = [m for m in delivered if m.source == "a"]  # a's output, sent to the other worker
    assert hops, "round robin puts b on the other worker"
    assert all(m.priority == 2 and m.budget_s is not None and m.budget_s < 5.0 for m in hops)


def test_learned_admission_both_runs_each_policy_with_the_plan_s_admission_beside(
    tmp_path: Any,
) -> None:
    from compass._cli.main import main
    from compass.sim.settings import SimSettings, base_policy
    from compass.workflow.spec import workload_to_dict

    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(workload_to_dict(tiny())))
    out = tmp_path / "g.json"
    with pytest.raises(SystemExit) as done:
        main(["sim", "--goodput", "--workload", str(spec), "--policies", "compass",
              "--loads", "2", "--seeds", "0", "--jobs", "20", "--deadline-x", "1.6",
              "--shed", "on", "--learned-admission", "both", "--json", str(out)])  # fmt: skip
    assert done.value.code in (0, None)
    data = json.loads(out.read_text())
    assert set(data["goodput"]) == {"compass", "compass (plan admission)"}
    assert data["config"]["admission"] == "learned"
    plain = SimSettings(workers=1, policy="jsq (no preemption) (plan admission)", preempt=True,
                        admission="learned")  # fmt: skip
    assert (plain.policy, plain.admission, plain.preempt) == ("jsq", "plan", False)
    assert base_policy("jsq (no preemption) (plan admission)") == "jsq"
    assert (
        SimSettings(workers=1, policy="jsq", admission="learned")
        .worker_config(tiny())
        .sched.admission
        == "learned"
    )
    with pytest.raises(SystemExit) as bad:  # admission needs deadlines: --goodput only
        main(["sim", "--workload", str(spec), "--learned-admission", "on"])
    assert bad.value.code == 2
