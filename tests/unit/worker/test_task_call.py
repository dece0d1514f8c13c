"""How a task thread calls a task: under torch's inference mode where torch is imported (and
without importing torch where the app never did: tests/unit/cache/test_backend.py)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

import compass
from compass.worker.executor import TaskAborted, _call

app = compass.App("calls")
probe = app.workflow("probe", inputs=["x"])


@probe.task(expected_ms=0.01)
def modes(model: None, x: int) -> tuple[int, bool, bool]:
    return x + 1, torch.is_inference_mode_enabled(), torch.is_grad_enabled()


def test_a_task_runs_under_inference_mode_where_torch_is_imported() -> None:
    task = app.workflows["probe"].tasks["modes"]
    assert _call(task, task.call, None, {"x": 1}, nullcontext()) == (2, True, False)


def test_a_task_that_exits_fails_the_task_not_the_worker() -> None:
    crash = compass.App("crash")
    wf = crash.workflow("w", inputs=["x"])

    @wf.task(expected_ms=0.01)
    def bye(model: None, x: int) -> None:
        raise SystemExit(3)

    task = crash.workflows["w"].tasks["bye"]
    with pytest.raises(TaskAborted, match="raised SystemExit: 3"):
        _call(task, task.call, None, {"x": 1}, nullcontext())
