"""Workload files: the paper's, other valid ones, and malformed ones with clear errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from compass.errors import ModelTooLarge, WorkflowError
from compass.workflow import load_workload, parse_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"


def small() -> dict[str, Any]:
    return {
        "name": "tiny",
        "cluster": {
            "workers": 3,
            "gpu_memory_mb": 1000,
            "h2d_gbps": 5,
            "d2h_gbps": 4,
            "net_gbps": 1.25,
            "net_fixed_us": 50,
        },
        "models": {"enc": {"size_mb": 300}, "dec": {"size_mb": 500.5}},
        "workflows": {
            "w": {
                "tasks": {
                    "t": {"model": "enc", "exec_ms": 5, "input_kb": 2, "output_kb": 1},
                    "u": {"model": "dec", "exec_ms": 7.5, "output_kb": 0.5, "after": ["t"]},
                }
            }
        },
    }


def write(tmp_path: Path, data: Any, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_paper_workload() -> None:
    wl = load_workload(PAPER)
    assert wl.name == "paper"
    assert set(wl.workflows) == {
        "translation",
        "question_answer",
        "img_to_sound",
        "object_detection",
    }
    assert len(wl.models) == 8
    assert wl.models["opt"] == 5_720_000_000
    assert sum(wl.models.values()) == 20_760_000_000
    c = wl.cluster
    assert c.workers == 5
    assert c.gpu_memory_bytes == 14_000_000_000
    assert c.h2d_bytes_per_s == pytest.approx(9.7e9)
    assert c.d2h_bytes_per_s == pytest.approx(9.7e9)
    assert c.net_bytes_per_s == pytest.approx(12e9)
    assert c.net_fixed_s == pytest.approx(2e-6)
    tr = wl.workflows["translation"]
    assert tr.best_ms == 1365
    assert tr.order == ("generate", "marian", "mt5_a", "mt5_b", "aggregate")
    assert tr.preds("aggregate") == ("marian", "mt5_a", "mt5_b")
    gen = tr.tasks["generate"]
    assert gen.model == "opt"
    assert gen.fn is None
    assert gen.profile.exec_ms == 561
    assert gen.profile.input_bytes == 1_000
    assert gen.profile.output_bytes == 2_000
    assert tr.tasks["aggregate"].model is None
    caption = wl.workflows["img_to_sound"].tasks["caption"]
    assert caption.profile.input_bytes == 3_000_000
    assert wl.workflows["img_to_sound"].best_ms == pytest.approx(359.2)
    assert wl.arrivals.mean_interval_ms_per_client == 2000
    assert wl.arrivals.jobs == 1000
    assert wl.arrivals.processes == ("uniform", "poisson", "gamma")
    assert wl.arrivals.gamma_cv == 10


def test_another_valid_file(tmp_path: Path) -> None:
    wl = load_workload(write(tmp_path, small(), "tiny.json"))
    assert wl.models == {"enc": 300_000_000, "dec": 500_500_000}
    assert wl.cluster.net_bytes_per_s == pytest.approx(1.25e9)
    assert wl.cluster.net_fixed_s == pytest.approx(50e-6)
    assert wl.cluster.d2h_bytes_per_s == pytest.approx(4e9)
    wf = wl.workflows["w"]
    assert wf.best_ms is None
    assert wf.order == ("t", "u")
    assert wf.tasks["u"].profile.output_bytes == 500
    assert wf.tasks["t"].profile.input_bytes == 2_000
    assert wl.arrivals.processes == ("uniform", "poisson", "gamma")  # defaults


def error_for(tmp_path: Path, data: Any) -> str:
    with pytest.raises(WorkflowError) as info:
        load_workload(write(tmp_path, data))
    return str(info.value)


def test_missing_field_names_file_and_key_path(tmp_path: Path) -> None:
    data = small()
    del data["workflows"]["w"]["tasks"]["u"]["exec_ms"]
    assert error_for(tmp_path, data) == "bad.json: workflows.w.tasks.u.exec_ms: missing"


def test_mistyped_field(tmp_path: Path) -> None:
    data = small()
    data["workflows"]["w"]["tasks"]["t"]["exec_ms"] = "fast"
    text = error_for(tmp_path, data)
    assert "bad.json: workflows.w.tasks.t.exec_ms" in text
    assert "expected a number" in text
    data = small()
    data["cluster"]["workers"] = 2.5
    assert "cluster.workers: expected an integer" in error_for(tmp_path, data)
    data = small()
    data["models"]["enc"]["size_mb"] = -3
    assert "models.enc.size_mb: must be >= 0" in error_for(tmp_path, data)
    data = small()
    data["cluster"]["h2d_gbps"] = 0
    assert "cluster.h2d_gbps: must be > 0" in error_for(tmp_path, data)


def test_unknown_model(tmp_path: Path) -> None:
    data = small()
    data["workflows"]["w"]["tasks"]["u"]["model"] = "gpt"
    text = error_for(tmp_path, data)
    assert "workflows.w.tasks.u.model" in text
    assert "unknown model 'gpt'" in text


def test_misspelt_task_key(tmp_path: Path) -> None:
    data = small()
    data["workflows"]["w"]["tasks"]["u"]["exec_sm"] = 3
    assert "workflows.w.tasks.u.exec_sm: unknown key" in error_for(tmp_path, data)


def test_graph_errors_carry_the_workflow_path(tmp_path: Path) -> None:
    data = small()
    data["workflows"]["w"]["tasks"]["t"]["after"] = ["u"]
    data["workflows"]["w"]["tasks"]["t"].pop("input_kb")
    text = error_for(tmp_path, data)
    assert text.startswith("bad.json: workflows.w:")
    assert "cycle" in text
    data = small()
    data["workflows"]["w"]["tasks"]["u"]["after"] = ["nope"]
    assert "task 'u' waits for unknown task 'nope'" in error_for(tmp_path, data)
    data = small()
    data["workflows"]["w"]["tasks"]["u"]["input_kb"] = 4
    assert "tasks.u.input_kb: only a root task" in error_for(tmp_path, data)


def test_structural_errors(tmp_path: Path) -> None:
    data = small()
    del data["cluster"]
    assert error_for(tmp_path, data) == "bad.json: cluster: missing"
    data = small()
    data["workflows"] = {}
    assert "workflows: no workflows" in error_for(tmp_path, data)
    data = small()
    data["workflows"]["w"]["tasks"] = ["t", "u"]
    assert "workflows.w.tasks: expected an object, got a list" in error_for(tmp_path, data)
    data = small()
    data["arrivals"] = {"mean_interval_ms_per_client": 10, "jobs": 5, "processes": ["burst"]}
    assert "arrivals.processes[0]: unknown arrival process 'burst'" in error_for(tmp_path, data)


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x",\n  "cluster": }')
    with pytest.raises(WorkflowError, match=r"broken.json: not valid JSON: .* line 2"):
        load_workload(path)
    with pytest.raises(WorkflowError, match="cannot read workload file"):
        load_workload(tmp_path / "absent.json")


def test_model_larger_than_gpu_memory(tmp_path: Path) -> None:
    data = copy.deepcopy(small())
    data["models"]["dec"]["size_mb"] = 1500
    with pytest.raises(ModelTooLarge, match=r"bad\.json: workflows\.w: .*'dec'"):
        load_workload(write(tmp_path, data))


def test_parse_workload_names_its_source() -> None:
    data = small()
    data["models"] = []
    with pytest.raises(WorkflowError, match=r"^mem: models: expected an object, got a list$"):
        parse_workload(data, source="mem")


def test_a_task_timeout_is_read_and_checked(tmp_path: Path) -> None:
    data = small()
    data["workflows"]["w"]["tasks"]["t"]["timeout_ms"] = 250
    wl = load_workload(write(tmp_path, data, "tiny.json"))
    assert wl.workflows["w"].tasks["t"].timeout_ms == 250
    assert wl.workflows["w"].tasks["u"].timeout_ms is None
    data["workflows"]["w"]["tasks"]["t"]["timeout_ms"] = 0
    assert "workflows.w.tasks.t.timeout_ms: must be > 0" in error_for(tmp_path, data)
