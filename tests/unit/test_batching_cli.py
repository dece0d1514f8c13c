"""The batching flags of ``compass sim`` and ``compass bench e2e``, and ``compass bench
batching``: the flags reach the simulated workload and every JSON config, bad values are one
line, the benchmark writes its documented layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compass._cli.main import main
from compass._cli.options import BatchGain
from compass.workflow.batching import BATCH_GAINS

SLOS = {"median2", "p95x3", "p99x5"}


def tiny_spec(**task: Any) -> dict[str, Any]:
    """One 100 ms model task on one worker, a job a second at load 1: its physical bound is
    10x the rate, past which only batches keep up."""
    return {
        "name": "tiny",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10},
        "models": {"m": {"size_mb": 10}},
        "workflows": {"f": {"tasks": {
            "t": {"model": "m", "exec_ms": 100, "output_kb": 1, "after": [], **task},
        }}},
        "arrivals": {"mean_interval_ms_per_client": 1000, "jobs": 100},
    }  # fmt: skip


def write_spec(folder: Path, **task: Any) -> str:
    path = folder / "tiny.json"
    path.write_text(json.dumps(tiny_spec(**task)))
    return str(path)


def compass(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``compass ARGS`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 0), out, err


def sim_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, spec: str, *flags: str
) -> dict[str, Any]:
    out = tmp_path / "out.json"
    code, _, err = compass(
        capsys, "sim", "--workload", spec, "--policies", "jsq", "--jobs", "40",
        "--load", "20", "--arrival", "uniform", "--json", str(out), *flags,
    )  # fmt: skip
    assert code == 0, err
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_the_cli_curves_are_the_library_curves() -> None:
    assert [g.value for g in BatchGain] == list(BATCH_GAINS)


@pytest.mark.parametrize(
    ("declared", "flags", "batched", "config"),
    [
        ({}, ("--batch-gain", "mild"), True, (True, "mild")),
        ({}, ("--batching", "off", "--batch-gain", "mild"), False, (False, "mild")),
        ({}, (), False, (True, None)),  # no gain: only tasks that declare a curve batch
        ({}, ("--batch-gain", "none"), False, (True, "none")),  # an extra item costs a run
        ({"batch_item": 0.1}, (), True, (True, None)),
        ({"batch_item": 0.1}, ("--batching", "OFF"), False, (False, None)),
    ],
)
def test_sim_flags_reach_the_workload_and_the_json(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    declared: dict[str, Any],
    flags: tuple[str, ...],
    batched: bool,
    config: tuple[bool, str | None],
) -> None:
    data = sim_json(capsys, tmp_path, write_spec(tmp_path, **declared), *flags)
    assert (data["config"]["batching"], data["config"]["batch_gain"]) == config
    sizes = {int(size): runs for size, runs in data["runs"]["jsq"]["batch_sizes"].items()}
    # jobs arrive twice as fast as one worker runs them alone: a batching worker batches
    assert (max(sizes) > 1) == batched, sizes
    assert sum(size * runs for size, runs in sizes.items()) == 40
    assert data["results"]["jsq"]["completed"] == 40


def test_sim_capacity_searches_the_batched_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    found = {}
    for state in ("on", "off"):
        out = tmp_path / f"{state}.json"
        code, _, err = compass(
            capsys, "sim", "--capacity", "--workload", spec, "--policies", "compass,jsq",
            "--jobs", "40", "--seeds", "0", "--arrival", "uniform", "--max-load", "32",
            "--batching", state, "--batch-gain", "mild", "--json", str(out),
        )  # fmt: skip
        assert code == 0, err
        found[state] = json.loads(out.read_text())
        assert set(found[state]) >= {"config", "capacity"}
        assert set(found[state]["capacity"]) == SLOS
        config = found[state]["config"]
        assert (config["batching"], config["batch_gain"]) == (state == "on", "mild")
    bound = found["off"]["config"]["physical_bound"]
    for slo in SLOS:
        on = found["on"]["capacity"][slo]["compass"]["mean"]
        off = found["off"]["capacity"][slo]["compass"]["mean"]
        # a task a run keeps the rate near the physical bound (10x: 40 jobs may queue a bit
        # past it within the SLO); batches of up to 8 for 2.05 runs take it far beyond
        assert off < 1.5 * bound < 2 * off < on, (slo, off, on)


@pytest.mark.parametrize(
    ("command", "flag", "value", "says"),
    [
        (("sim",), "--batching", "yes", "'yes' is not one of 'on', 'off'"),
        (("sim",), "--batch-gain", "huge", "'huge' is not one of 'none', 'mild', 'strong'"),
        (("sim", "--capacity"), "--batch-gain", "5%", "'5%' is not one of"),
        (("bench", "e2e"), "--batching", "1", "'1' is not one of 'on', 'off'"),
        (("bench", "e2e", "--capacity"), "--batch-gain", "", "'' is not one of"),
        (("bench", "batching"), "--curves", "mild,wild", "expected distinct names among"),
        (("bench", "batching"), "--policies", "jsq", "compares 'compass' with"),
    ],
)
def test_a_bad_batching_value_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: tuple[str, ...],
    flag: str,
    value: str,
    says: str,
) -> None:
    json_path = str(tmp_path / "never.json")
    code, _, err = compass(capsys, *command, flag, value, "--jobs", "5", "--json", json_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], err
    assert flag in lines[0] or "compass:" in lines[0]
    assert not Path(json_path).exists()


def test_bench_batching_writes_the_documented_layout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "batching.json"
    code, stdout, err = compass(
        capsys, "bench", "batching", "--workload", write_spec(tmp_path), "--workloads", "1",
        "--seeds", "0", "--jobs", "20", "--policies", "compass,jsq", "--curves", "none,mild",
        "--max-load", "1", "--json", str(out),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out.read_text())
    config = data["config"]
    assert config["curves"] == ["none", "mild"]
    assert config["policies"] == ["compass", "jsq"]
    assert (config["seeds"], config["jobs"], config["workloads"]) == ([0], 20, 1)
    assert set(config["slos"]) == SLOS and config["p99_load"] == 1.5
    assert set(data["curves"]) == {"none", "mild"}
    for curve, entries in data["curves"].items():
        # the given workload first, then generated workload 0
        assert entries[0]["workload"] == "tiny"
        assert [e["generator_seed"] for e in entries] == [None, 0]
        for entry in entries:
            for state in ("off", "on"):
                layout = entry[state]
                assert set(layout["capacity"]) == SLOS
                for by_policy in layout["capacity"].values():
                    assert set(by_policy) == {"compass", "jsq"}
                on = state == "on"
                assert (layout["config"]["batching"], layout["config"]["batch_gain"]) == (
                    on,
                    curve if on else None,
                )
            assert set(entry["p99_at_1.5"]) == set(entry["p99_at_1.5_off"]) == {"compass", "jsq"}
            assert all(v > 0 for v in entry["p99_at_1.5"].values())
            assert set(entry["compass_on_off"]) == set(entry["compass_vs_best"]) == SLOS
            assert entry["p99_vs_best"]["baseline"] in (None, "jsq")
        # batching off does not depend on the curve
        assert entries[0]["off"] == data["curves"]["none"][0]["off"]
    assert "tiny (1 workers), mild curve" in stdout
    assert "compass capacity, batching on / off" in stdout
