"""Generated workloads: reproducible by seed, within every documented range, every shape,
the utilization target, weighted popularity, simulated end to end, and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from compass.errors import ConfigError, WorkflowError
from compass.sim import job_arrivals, simulate
from compass.sim.settings import SimSettings
from compass.workflow import Workflow, Workload, parse_workload
from compass.workflow.generate import (
    SHAPES,
    GeneratorParams,
    expected_utilization,
    generate_spec,
    generate_workload,
    summary_line,
)

SEEDS = range(50)
SCRIPT = Path(sys.executable).with_name("compass")


@pytest.fixture(scope="module")
def specs() -> dict[int, dict[str, Any]]:
    return {seed: generate_spec(seed) for seed in SEEDS}


def test_a_seed_always_gives_the_same_spec() -> None:
    assert generate_spec(7) == generate_spec(7)
    assert json.dumps(generate_spec(7)) == json.dumps(generate_spec(7))


def test_different_seeds_give_different_specs(specs: dict[int, dict[str, Any]]) -> None:
    texts = {json.dumps(spec, sort_keys=True) for spec in specs.values()}
    assert len(texts) == len(specs)


def _depth(wf: Workflow) -> int:
    level: dict[str, int] = {}
    for t in wf.order:
        level[t] = 1 + max((level[p] for p in wf.preds(t)), default=0)
    return max(level.values())


def test_every_spec_parses_within_every_documented_range(
    specs: dict[int, dict[str, Any]],
) -> None:
    p = GeneratorParams()
    exec_model: list[float] = []
    exec_host: list[float] = []
    for seed, spec in specs.items():
        w = parse_workload(spec, source=f"seed {seed}")
        assert p.workflows[0] <= len(w.workflows) <= p.workflows[1]
        assert p.models[0] <= len(w.models) <= p.models[1]
        sizes = list(w.models.values())
        assert all(p.model_gb[0] * 1e9 <= s <= p.model_gb[1] * 1e9 for s in sizes)
        cache = w.cluster.gpu_memory_bytes
        assert p.cache_ratio[0] <= sum(sizes) / cache <= p.cache_ratio[1]
        assert max(sizes) + p.cache_headroom_mb * 1e6 <= cache
        assert p.workers[0] <= w.cluster.workers <= p.workers[1]
        used = {t.model for wf in w.workflows.values() for t in wf.tasks.values()}
        assert set(w.models) <= used  # every model is needed by some task
        weights = w.weight_list()
        assert weights[0] == 1.0
        assert weights == pytest.approx([1 / (k + 1) for k in range(len(weights))], abs=1e-4)
        for wf in w.workflows.values():
            assert wf.best_ms is None  # computed, never declared
            for name, t in wf.tasks.items():
                kb = t.profile.output_bytes / 1e3
                assert p.output_kb[0] <= kb <= p.output_kb[1]
                if wf.preds(name):
                    assert t.profile.input_bytes == 0
                else:
                    assert p.input_kb[0] <= t.profile.input_bytes / 1e3 <= p.input_kb[1]
                if t.model is None:
                    exec_host.append(t.profile.exec_ms)
                else:
                    exec_model.append(t.profile.exec_ms)
    assert p.exec_ms[0] <= min(exec_model) and max(exec_model) <= p.exec_ms[1]
    assert p.host_exec_ms[0] <= min(exec_host) and max(exec_host) <= p.host_exec_ms[1]
    # log-uniform over 5 ms .. 2 s: every decade is populated
    for low, high in ((5, 20), (20, 200), (200, 2000)):
        assert sum(low <= e < high for e in exec_model) >= 10
    assert len(exec_host) >= 20  # some model-less tasks


def test_every_shape_appears_and_has_its_structure(specs: dict[int, dict[str, Any]]) -> None:
    seen: Counter[str] = Counter()
    for seed, spec in specs.items():
        w = parse_workload(spec)
        for name, entry in spec["workflows"].items():
            shape = entry["shape"]
            seen[shape] += 1
            wf = w.workflows[name]
            joins = [t for t in wf.order if wf.is_join(t)]
            assert len(wf.roots) == 1, (seed, name)
            if shape == "chain":
                assert not joins and len(wf.sinks) == 1
                assert 2 <= len(wf) <= 5 and _depth(wf) == len(wf)
            elif shape == "fan":
                assert len(joins) == 1 and wf.sinks == (joins[0],)
                assert 3 <= len(wf.preds(joins[0])) <= 5 and _depth(wf) == 3
            elif shape == "diamond":
                assert len(joins) == 1 and wf.sinks == (joins[0],)
                assert len(wf.preds(joins[0])) == 2 and 3 <= _depth(wf) <= 5
            else:
                assert shape == "mix"
                assert len(joins) == 1 and len(wf.sinks) in (1, 2)
                assert 2 <= len(wf.preds(joins[0])) <= 3 and _depth(wf) >= 5
    assert set(seen) == set(SHAPES)
    assert min(seen.values()) >= 10


def _utilization_by_hand(spec: dict[str, Any]) -> float:
    """Lane-seconds per second at load 1 over the workers, from the spec's own numbers."""
    interval_s = spec["arrivals"]["mean_interval_ms_per_client"] / 1000.0
    busy = 0.0
    for entry in spec["workflows"].values():
        seconds = sum(t["exec_ms"] for t in entry["tasks"].values()) / 1000.0
        busy += entry["weight"] / interval_s * seconds
    workers: int = spec["cluster"]["workers"]
    return busy / workers


def test_the_arrival_rate_meets_the_utilization_target(
    specs: dict[int, dict[str, Any]],
) -> None:
    low, high = GeneratorParams().utilization
    for spec in specs.values():
        by_hand = _utilization_by_hand(spec)
        assert low - 1e-3 <= by_hand <= high + 1e-3
        assert expected_utilization(parse_workload(spec)) == pytest.approx(by_hand, rel=1e-12)
        assert by_hand == pytest.approx(spec["generator"]["utilization"], rel=1e-4)


@pytest.mark.parametrize(("process", "tolerance"), [("uniform", 0.02), ("poisson", 0.1)])
def test_the_arrivals_of_a_generated_workload_bring_that_much_work(
    process: str, tolerance: float
) -> None:
    """Weighted arrivals at load 1: the work they bring per second over the workers is the
    expected utilization, and the most popular workflow comes most often."""
    w = generate_workload(3)
    arrivals = job_arrivals(
        list(w.workflows),
        6000,
        process=process,
        mean_interval_s=w.arrivals.mean_interval_ms_per_client / 1000.0,
        weights=w.weight_list(),
        seed=2,
    )
    work = {
        name: sum(t.profile.exec_s for t in wf.tasks.values()) for name, wf in w.workflows.items()
    }
    span = arrivals[-1].t_s
    brought = sum(work[a.workflow] for a in arrivals) / (span * w.cluster.workers)
    assert brought == pytest.approx(expected_utilization(w), rel=tolerance)
    counts = Counter(a.workflow for a in arrivals)
    share = counts[next(iter(w.workflows))] / len(arrivals)
    assert share == pytest.approx(1.0 / sum(w.weight_list()), rel=tolerance)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_a_generated_workload_simulates_with_every_job_finishing(seed: int) -> None:
    w = generate_workload(seed)
    arrivals = job_arrivals(
        list(w.workflows),
        30,
        process="poisson",
        mean_interval_s=w.arrivals.mean_interval_ms_per_client / 1000.0,
        weights=w.weight_list(),
        seed=seed,
    )
    result = simulate(w, SimSettings(workers=w.cluster.workers, policy="compass"), arrivals)
    assert len(result.jobs) == 30
    assert all(j.latency_s is not None and not j.error for j in result.jobs)
    assert len(result.tasks) == sum(len(w.workflows[j.workflow]) for j in result.jobs)


def test_overrides_change_what_is_drawn() -> None:
    spec = generate_spec(5, workflows=(3, 3), shapes=("chain",), workers=(2, 2))
    assert len(spec["workflows"]) == 3
    assert {e["shape"] for e in spec["workflows"].values()} == {"chain"}
    assert spec["cluster"]["workers"] == 2
    params = GeneratorParams(utilization=(0.8, 0.8))
    assert _utilization_by_hand(generate_spec(5, params)) == pytest.approx(0.8, rel=1e-4)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"workflow": (2, 3)}, "workflow"),
        ({"workflows": (3, 2)}, "workflows"),
        ({"workflows": (0, 2)}, "workflows"),
        ({"model_gb": (0.0, 1.0)}, "model_gb"),
        ({"cache_ratio": (0.5, 2.0)}, "cache_ratio"),
        ({"utilization": (0.5, 1.5)}, "utilization"),
        ({"shapes": ("ring",)}, "shapes"),
        ({"join_no_model": 2.0}, "join_no_model"),
        ({"jobs": 0}, "jobs"),
    ],
)
def test_bad_parameters_are_one_line_config_errors(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as err:
        generate_spec(0, **overrides)
    assert "\n" not in str(err.value)


def test_a_seed_must_be_an_integer() -> None:
    with pytest.raises(ConfigError, match="seed"):
        generate_spec("7")  # type: ignore[arg-type]


def test_the_spec_weight_is_validated_and_defaults_to_one() -> None:
    spec = generate_spec(1)
    first = next(iter(spec["workflows"]))
    del spec["workflows"][first]["weight"]
    assert parse_workload(spec).weights[first] == 1.0
    for bad in (0, -1, "2", True):
        spec["workflows"][first]["weight"] = bad
        with pytest.raises(WorkflowError, match=rf"workflows\.{first}\.weight"):
            parse_workload(spec)


def test_arrival_weights_scale_each_client_and_none_keeps_the_old_arrivals() -> None:
    flows = ["a", "b"]
    plain = job_arrivals(flows, 300, process="poisson", mean_interval_s=1.0, seed=9)
    ones = job_arrivals(flows, 300, process="poisson", mean_interval_s=1.0, seed=9, weights=[1, 1])
    assert plain == ones
    skewed = job_arrivals(
        flows, 4000, process="uniform", mean_interval_s=1.0, seed=9, weights=[3.0, 1.0]
    )
    share = sum(a.workflow == "a" for a in skewed) / len(skewed)
    assert share == pytest.approx(0.75, abs=0.01)
    with pytest.raises(ConfigError, match="2 workflows"):
        job_arrivals(flows, 10, process="poisson", mean_interval_s=1.0, weights=[1.0])
    with pytest.raises(ConfigError, match="'b'"):
        job_arrivals(flows, 10, process="poisson", mean_interval_s=1.0, weights=[1.0, 0.0])


def test_the_summary_line_names_the_numbers() -> None:
    w: Workload = generate_workload(3)
    line = summary_line(w)
    assert "\n" not in line
    assert f"{len(w.workflows)} workflows" in line and f"{len(w.models)} models" in line
    assert f"{w.cluster.workers} workers" in line
    assert f"{expected_utilization(w):.2f}" in line


def _compass(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.exists():
        pytest.skip("the compass console script is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPASS_")}
    return subprocess.run(
        [str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_generates_a_spec_that_parses_and_sim_runs_on_its_workers(tmp_path: Path) -> None:
    done = _compass("workload", "generate", "--seed", "5", "--json", "gen/w5.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = json.loads((tmp_path / "gen" / "w5.json").read_text())
    assert written == generate_spec(5)
    (line,) = done.stdout.splitlines()
    assert "generated-5" in line and "expected utilization" in line and "w5.json" in line
    # the spec's cluster.workers is the default worker count of compass sim
    sim = _compass(
        "sim", "--workload", "gen/w5.json", "--jobs", "20", "--policies", "compass",
        "--json", "sim.json", cwd=tmp_path,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    config = json.loads((tmp_path / "sim.json").read_text())["config"]
    assert config["workers"] == written["cluster"]["workers"]


def test_cli_bad_json_path_is_one_line(tmp_path: Path) -> None:
    done = _compass("workload", "generate", "--json", "/proc/no/such.json", cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "/proc/no/such.json" in line
    assert "Traceback" not in done.stderr and done.stdout == ""
