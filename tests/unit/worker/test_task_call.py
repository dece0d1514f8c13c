"""How a task thread calls a task: under torch's inference mode where torch is imported, and
without importing torch where the app never did (a worker of torch-free tasks, routers and
tools, never pays its import: seconds, and hundreds of MB)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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


def test_a_model_less_task_of_a_torch_free_app_runs_without_importing_torch() -> None:
    code = """
        import sys
        from contextlib import nullcontext
        import compass
        from compass.worker.executor import _call

        app = compass.App("plain")
        wf = app.workflow("w", inputs=["x"])

        @wf.task(expected_ms=0.01)
        def double(model, x):
            return 2 * x

        task = app.workflows["w"].tasks["double"]
        assert _call(task, task.call, None, {"x": 21}, nullcontext()) == 42
        assert "torch" not in sys.modules, "torch was imported"
    """
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
