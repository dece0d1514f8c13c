"""Batched execution against real worker processes: a real torch model batched gives every job
what it gives unbatched; a failed item fails its own job, a raise or a timeout every job of its
batch, and the worker serves on; emulated tasks of one model batch too.

Batches are made deterministic, not left to timing: a ``gate`` job holds the worker's only GPU
lane until the test creates a file, so the jobs submitted meanwhile queue (``compass status``
shows them ready) and the lane takes them as one batch when the gate opens. That a batch really
formed is read from the worker (``batches`` in its status, ``compass_batch_size`` in its
metrics), never assumed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from compass import Client
from compass.cluster import LocalCluster
from compass.errors import CompassTimeout, JobFailed
from examples.batch_app import IN_FEATURES, OUT_FEATURES, reference

from .conftest import app_environment, status_when
from .test_metrics import free_port, scrape

BATCH_APP = """
import time
from pathlib import Path

from torch import nn

import compass
from examples.batch_app import build_mlp, embed

app = compass.App("batch_test")
app.model("mlp", build_mlp)
app.model("gate", lambda: nn.Linear(1, 1))


def wait_for(path, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.005)


gate = app.workflow("gate", inputs=["path"])


@gate.task(model="gate")
def hold(model, path):
    wait_for(path)  # holds the worker's only GPU lane until the test creates the file
    return path


# the example's own function, as a task of this app
app.workflow("embed", inputs=["x"]).task(embed, model="mlp", batch=8, batch_item=0.15)

raises = app.workflow("raises", inputs=["x"])


@raises.task(model="mlp", batch=8, batch_item=0.15)
def explode(model, x):
    if "boom" in x:
        raise RuntimeError("cannot take " + ",".join(x))
    return [v.upper() for v in x]


stalls = app.workflow("stalls", inputs=["x"])


@stalls.task(model="mlp", batch=8, batch_item=0.15, timeout_ms=300)
def stall(model, x):
    for path in x:  # runs on past its timeout until the test creates the file
        wait_for(path)
    return x
"""

#: generous: a first job stages and loads its model, on a machine other tests share
WAIT_TRIES = 3000
JOB_TIMEOUT_S = 60.0

#: a tight tolerance: only the reduction order of a batched matmul may differ
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture
def batch_env(tmp_path: Path) -> dict[str, str]:
    return app_environment(tmp_path, "batch_test_app", BATCH_APP)


def one_worker(env: dict[str, str], *extra: str) -> LocalCluster:
    return LocalCluster(1, args=["--app", "batch_test_app", *extra], env=env)


async def queued_behind_gate(
    client: Client, workflow: str, inputs: list[Mapping[str, Any]], gate: Path
) -> list[Any]:
    """Run one ``workflow`` job per inputs, all queued while a gate job holds the GPU lane,
    then open the gate; each job's output, or the error it raised."""
    held = asyncio.create_task(client.submit("gate", path=str(gate), timeout=JOB_TIMEOUT_S))
    running = await status_when(client, lambda s: s.queue["running"] == 1, WAIT_TRIES)
    assert running.queue["running"] == 1 and not held.done()
    jobs = [
        asyncio.create_task(client.submit(workflow, timeout=JOB_TIMEOUT_S, **kw)) for kw in inputs
    ]
    queued = await status_when(client, lambda s: s.queue["ready"] == len(inputs), WAIT_TRIES)
    assert queued.queue["ready"] == len(inputs) and not held.done()
    await asyncio.to_thread(gate.touch)
    assert await held == str(gate)
    return await asyncio.gather(*jobs, return_exceptions=True)


def features(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, IN_FEATURES, generator=torch.Generator().manual_seed(seed))


@pytest.mark.asyncio
async def test_a_batched_real_model_gives_every_job_its_unbatched_output(
    batch_env: dict[str, str], tmp_path: Path
) -> None:
    # jobs of different sizes: the function concatenates them and splits the output back
    xs = [features(rows, seed) for seed, rows in enumerate((1, 3, 2, 5))]
    async with one_worker(batch_env) as cluster, cluster.client() as client:
        outputs = await queued_behind_gate(client, "embed", [{"x": x} for x in xs], tmp_path / "go")
        status = await client.status()
        assert status.batches["mlp"] == {"4": 1}  # the four ran as one batch
        for x, out in zip(xs, outputs, strict=True):
            assert isinstance(out, torch.Tensor) and out.shape == (x.shape[0], OUT_FEATURES)
            # the same model run here, on this job alone
            assert torch.allclose(out, reference(x), rtol=RTOL, atol=ATOL)
        # a job that runs alone gets the same calling convention (a list of one)
        alone = await client.submit("embed", x=xs[3], timeout=JOB_TIMEOUT_S)
        assert torch.allclose(alone, reference(xs[3]), rtol=RTOL, atol=ATOL)
        assert torch.allclose(alone, outputs[3], rtol=RTOL, atol=ATOL)
        status = await client.status()
        assert status.batches["mlp"] == {"1": 1, "4": 1}


@pytest.mark.asyncio
async def test_an_item_returned_as_an_exception_fails_only_its_job(
    batch_env: dict[str, str], tmp_path: Path
) -> None:
    xs: list[Any] = [features(2, 1), torch.zeros(2, 5), features(1, 2)]
    async with one_worker(batch_env) as cluster, cluster.client() as client:
        outputs = await queued_behind_gate(client, "embed", [{"x": x} for x in xs], tmp_path / "go")
        assert (await client.status()).batches["mlp"] == {"3": 1}
    bad = outputs[1]
    assert isinstance(bad, JobFailed)
    assert bad.task == "embed" and bad.workflow == "embed"
    assert "ValueError: x must be a [rows, 16] tensor, got (2, 5)" in str(bad)
    assert "in a batch of 3" in str(bad)
    for i in (0, 2):
        assert torch.allclose(outputs[i], reference(xs[i]), rtol=RTOL, atol=ATOL)


@pytest.mark.asyncio
async def test_a_raise_fails_every_job_of_its_batch_and_the_worker_serves_on(
    batch_env: dict[str, str], tmp_path: Path
) -> None:
    async with one_worker(batch_env) as cluster, cluster.client() as client:
        outputs = await queued_behind_gate(
            client, "raises", [{"x": v} for v in ("a", "boom", "c")], tmp_path / "go"
        )
        for error in outputs:
            assert isinstance(error, JobFailed) and error.task == "explode"
            assert "RuntimeError: cannot take a,boom,c" in str(error)
            assert "in a batch of 3" in str(error)
            assert "RuntimeError" in (error.remote_traceback or "")
        # the next jobs run: the same task alone, and another batched task
        assert await client.submit("raises", x="z", timeout=JOB_TIMEOUT_S) == "Z"
        x = features(2, 3)
        out = await client.submit("embed", x=x, timeout=JOB_TIMEOUT_S)
        assert torch.allclose(out, reference(x), rtol=RTOL, atol=ATOL)
        status = await client.status()
        assert status.batches["mlp"] == {"1": 2, "3": 1}
        assert status.stats["tasks_failed"] == 3


@pytest.mark.asyncio
async def test_a_batch_past_its_timeout_fails_its_jobs_and_the_worker_serves_on(
    batch_env: dict[str, str], tmp_path: Path
) -> None:
    release = tmp_path / "release"
    async with one_worker(batch_env) as cluster, cluster.client() as client:
        outputs = await queued_behind_gate(
            client, "stalls", [{"x": str(release)}] * 3, tmp_path / "go"
        )
        for error in outputs:
            assert isinstance(error, CompassTimeout)
            assert "'stall' ran past its timeout of 0.3 s" in str(error)
            assert "in a batch of 3" in str(error)
        status = await client.status()
        # one run is stuck (its thread still waits), not three; the lane moved on
        assert status.queue["stuck"] == 1 and not status.queue["degraded"]
        x = features(3, 4)
        out = await client.submit("embed", x=x, timeout=JOB_TIMEOUT_S)
        assert torch.allclose(out, reference(x), rtol=RTOL, atol=ATOL)
        await asyncio.to_thread(release.touch)  # the stuck thread returns
        status = await status_when(client, lambda s: s.queue["stuck"] == 0, WAIT_TRIES)
        assert status.queue["stuck"] == 0
        assert await client.submit("stalls", x=str(release), timeout=JOB_TIMEOUT_S) == str(release)
        status = await client.status()
        assert status.batches["mlp"] == {"1": 2, "3": 1}


def batch_workload(tmp_path: Path) -> str:
    """A spec: a long ``gate`` task on model ``g``; ``embed`` on model ``m`` batches (at most
    8, each extra item +15% of a run)."""
    spec = {
        "name": "batching",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"g": {"size_mb": 10}, "m": {"size_mb": 10}},
        "workflows": {
            "gate": {"tasks": {"hold": {"model": "g", "exec_ms": 3000, "output_kb": 1,
                                        "after": []}}},
            "embed": {"tasks": {"t": {"model": "m", "exec_ms": 50, "output_kb": 1, "after": [],
                                      "batch": 8, "batch_item": 0.15}}},
        },
    }  # fmt: skip
    path = tmp_path / "batching.json"
    path.write_text(json.dumps(spec))
    return str(path)


@pytest.mark.asyncio
async def test_emulated_tasks_queued_behind_a_busy_lane_run_as_one_batch(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    args = ["--workload", batch_workload(tmp_path), "--metrics-port", str(port)]
    data = np.zeros(8, dtype=np.uint8)
    async with (
        LocalCluster(1, args=args, env=worker_env) as cluster,
        cluster.client() as client,
    ):
        # the gate (3 s of emulated work) holds the lane while the four jobs queue
        held = asyncio.create_task(client.submit("gate", data=data, timeout=JOB_TIMEOUT_S))
        await status_when(client, lambda s: s.queue["running"] == 1, WAIT_TRIES)
        jobs = [client.submit("embed", data=data, timeout=JOB_TIMEOUT_S) for _ in range(4)]
        queued_jobs = [asyncio.create_task(job) for job in jobs]
        queued = await status_when(client, lambda s: s.queue["ready"] == 4, WAIT_TRIES)
        assert queued.queue["ready"] == 4 and not held.done()
        outputs = await asyncio.gather(*queued_jobs)
        await held
        assert all(isinstance(out, np.ndarray) and out.nbytes == 1000 for out in outputs)
        status = await client.status()
        assert status.batches == {"g": {"1": 1}, "m": {"4": 1}}
        got = await scrape(f"127.0.0.1:{port}")
    m = frozenset({("model", "m")})
    assert got["compass_batch_size_count", m] == 1  # one run ...
    assert got["compass_batch_size_sum", m] == 4  # ... of four tasks
    assert got["compass_batch_size_bucket", m | {("le", "3.0")}] == 0
