"""Preemption at step boundaries on real worker processes (``--preempt``): a priority-1 job
takes the lane of a running generation between two of its steps, and the generation resumes
where it stopped, each step run once. Both ways a worker runs a step-wise task: real generator
code in its thread (parked at its step gate), and an emulated one (its timers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from compass.cluster import LocalCluster

from .conftest import app_environment

APP = """
import time

import compass

app = compass.App("preempt")
long = app.workflow("long", inputs=["log"])
short = app.workflow("short", inputs=["log"])


def note(log, line):
    with open(log, "a") as f:
        f.write(line + "\\n")


@long.task(steps=10, step_ms=40.0)
def gen(model, log):
    for i in range(10):
        time.sleep(0.04)
        note(log, f"g{i}")
        yield i
    return "generated"


@short.task(expected_ms=5.0)
def det(model, log):
    note(log, "d")
    return "detected"
"""

#: one lane for both tasks (model-less tasks on the GPU lane: no host lanes)
ARGS = ["--lanes", "1", "--host-lanes", "0", "--no-warm"]


def lines_of(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


async def lines_when(log: Path, count: int) -> list[str]:
    async with asyncio.timeout(30):
        while len(lines := lines_of(log)) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        return lines


@pytest.mark.asyncio
@pytest.mark.timeout(180)
@pytest.mark.parametrize("preempt", [True, False], ids=["preempt", "no-preempt"])
async def test_a_priority_job_runs_between_two_steps_of_a_generation(
    tmp_path: Path, preempt: bool
) -> None:
    env = app_environment(tmp_path, "preempt_app", APP)
    args = [*ARGS, "--app", "preempt_app", "--preempt" if preempt else "--no-preempt"]
    log = tmp_path / "steps.log"
    async with LocalCluster(1, args=args, env=env) as cluster, cluster.client() as client:
        long = asyncio.ensure_future(client.submit("long", log=str(log)))
        await lines_when(log, 2)  # the generation is under way
        assert await client.submit("short", log=str(log), priority=1) == "detected"
        assert await long == "generated"
    lines = lines_of(log)
    steps = [line for line in lines if line != "d"]
    assert steps == [f"g{i}" for i in range(10)]  # every step once, in order: resumed
    if preempt:
        assert lines.index("d") < lines.index("g9")  # it ran mid-generation
    else:
        assert lines[-1] == "d"  # it waited for the whole generation


def spec(tmp_path: Path) -> str:
    """``long``: a 10-step generation of 1 s; ``short``: a 20 ms task of the same model."""
    task = {"model": "m", "output_kb": 1, "after": []}
    workload = {
        "name": "preempt",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"m": {"size_mb": 10}},
        "workflows": {
            "long": {"tasks": {"gen": {**task, "exec_ms": 1000, "steps": 10, "state_kb": 64}}},
            "short": {"tasks": {"det": {**task, "exec_ms": 20}}},
        },
    }  # fmt: skip
    path = tmp_path / "preempt.json"
    path.write_text(json.dumps(workload))
    return str(path)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_an_emulated_generation_is_suspended_and_resumed(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["--workload", spec(tmp_path), *ARGS, "--preempt"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        await client.submit("short")  # the model is resident
        long = asyncio.ensure_future(client.submit("long"))
        await asyncio.sleep(0.25)  # a few of its steps
        short = asyncio.ensure_future(client.submit("short", priority=1))
        done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {short}  # it did not wait for the generation's 1 s
        await long  # and the generation still ends, answered once
        status = await client.status()
        assert status.stats["tasks_run"] == 3


def step_batched(spec_path: str) -> str:
    """The spec at ``spec_path`` (a ``long`` workflow whose ``gen`` is a generation), its
    generation a step batch: up to 8 jobs a step, each extra one +10%; written beside it."""
    path = Path(spec_path)
    workload = json.loads(path.read_text())
    workload["workflows"]["long"]["tasks"]["gen"].update(batch=8, batch_item=0.1)
    batched = path.with_name(f"{path.stem}-batch.json")
    batched.write_text(json.dumps(workload))
    return str(batched)


def batch_spec(tmp_path: Path) -> str:
    """:func:`spec`, its generation a step batch (:func:`step_batched`)."""
    return step_batched(spec(tmp_path))


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_an_emulated_step_batch_is_suspended_whole_and_each_member_answers_once(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    args = ["--workload", batch_spec(tmp_path), *ARGS, "--preempt"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        await client.submit("short")  # the model is resident
        longs = [asyncio.ensure_future(client.submit("long")) for _ in range(3)]
        await asyncio.sleep(0.3)  # one batch of three, a few steps in
        short = asyncio.ensure_future(client.submit("short", priority=1))
        done, _ = await asyncio.wait({*longs, short}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {short}  # it did not wait for the batch's 1.1 s
        await asyncio.gather(*longs)  # every member resumed and ended, answered once
        status = await client.status()
        assert status.queue["suspensions"] == 1  # the batch, whole, once
        assert status.stats["tasks_run"] == 5
        assert status.stats["jobs_completed"] == 5
