"""Hot-model replication in a plain simulation (compass/sim/replicas.py): off by default, as on
a real worker, on with ``--replicate``, and the run still ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass._cli.main import main
from compass.elastic.replicate import REPLICATE_EVERY_S, ReplicaConfig
from compass.sim import SimSettings, simulate
from compass.sim.arrivals import Arrival
from compass.sim.compare import SimConfig
from compass.workflow.spec import Workload, parse_workload

PAPER = str(Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json")


def wave() -> Workload:
    """Model ``m`` (a load of 4 s) for a 200 ms task whose input (1 MB at 0.0001 Gbps: 10 s)
    keeps it where it came in: jobs entering at w0 and w1 queue there once they hold ``m``."""
    return parse_workload({
        "name": "wave",
        "cluster": {"workers": 3, "gpu_memory_mb": 1000, "h2d_gbps": 0.2, "d2h_gbps": 0.2,
                    "net_gbps": 0.0001, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 800}},
        "workflows": {"hot": {"tasks": {"t": {"model": "m", "exec_ms": 200, "input_kb": 1000,
                                              "output_kb": 1, "after": []}}}},
    })  # fmt: skip


def test_a_wave_on_two_holders_warms_a_copy_on_the_third_unless_off() -> None:
    # a job each at w0 and w1 loads m there; then 12 jobs a second into them for 10 s
    arrivals = [Arrival(0.0, "hot", 0), Arrival(0.0, "hot", 1)]
    arrivals += [Arrival(5.0 + i / 12, "hot", i % 2) for i in range(120)]
    workload = wave()
    on = simulate(
        workload,
        SimSettings(
            workers=3, policy="compass", ingress="client", warm=False, replicate=ReplicaConfig()
        ),
        arrivals,
    )
    off = simulate(
        workload, SimSettings(workers=3, policy="compass", ingress="client", warm=False), arrivals
    )
    assert on.replicas == 1 and off.replicas == 0
    assert on.loads == off.loads + 1  # w2's copy, where off never loads m
    assert all(j.latency_s is not None for j in on.jobs)  # every job answered
    # the rounds run in the background: the run ends with its last job, not at a round
    last = max(j.arrival + (j.latency_s or 0.0) for j in on.jobs)
    assert on.horizon_s == last == off.horizon_s
    assert last % REPLICATE_EVERY_S != 0.0  # (not on a round's time)


@pytest.mark.parametrize("mode", ["--goodput", "--compare-real", "--traffic=daily"])
def test_replicate_is_for_the_plain_simulation(
    mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["sim", mode, "--replicate"])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "compass: --replicate is for the plain simulation and --capacity"
    )


def test_compass_sim_replicates_only_with_replicate(tmp_path: Path) -> None:
    """The paper's workload, 300 jobs: a copy is warmed with --replicate; none on default
    settings, and the config says which."""
    runs = {}
    for flags in (["--replicate"], []):
        out = tmp_path / f"run{len(flags)}.json"
        with pytest.raises(SystemExit) as done:
            main(["sim", "--workload", PAPER, "--policies", "compass", "--jobs", "300", "--json",
                  str(out), *flags])  # fmt: skip
        assert done.value.code == 0
        runs[bool(flags)] = json.loads(out.read_text())
    assert runs[True]["runs"]["compass"]["replicas"] >= 1
    assert runs[False]["runs"]["compass"]["replicas"] == 0
    assert (runs[True]["config"]["replicate"], runs[False]["config"]["replicate"]) == (True, False)


def test_a_capacity_search_replicates_in_its_simulations_only_when_told() -> None:
    on = SimConfig(workload=PAPER, workers=5, policies=("compass",), replicate=True).runs()
    off = SimConfig(workload=PAPER, workers=5, policies=("compass",)).runs()
    assert on.options["replicate"] == ReplicaConfig() and off.options["replicate"] is None
