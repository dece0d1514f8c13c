"""A workflow decided at run time on a real cluster (examples/router_app.py): a torch router
picks an expert, a refiner loops until its own output says stop; the answers equal the same
task functions run in this process, and a workload with choices runs emulated across
worker processes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from compass.cluster import LocalCluster
from examples.router_app import reference

from .conftest import ROOT

AGENT_LOOP = str(ROOT / "bench" / "workloads" / "agent-loop.json")


@pytest.mark.asyncio
async def test_the_router_app_answers_as_its_functions_do_locally(
    worker_env: dict[str, str],
) -> None:
    inputs = []
    for seed in range(8):
        generator = torch.Generator().manual_seed(seed)
        inputs.append(torch.randn(4, 8, generator=generator) * 3)
    async with (
        LocalCluster(2, args=["--app", "examples.router_app"], env=worker_env) as cluster,
        cluster.client(0) as c0,
        cluster.client(1) as c1,
    ):
        await cluster.wait_joined(timeout=20)
        answers = await asyncio.gather(
            *((c0 if i % 2 else c1).submit("route", x=x, timeout=60) for i, x in enumerate(inputs))
        )
    expected = [reference(x) for x in inputs]
    for got, want in zip(answers, expected, strict=True):
        assert (got["expert"], got["steps"]) == (want["expert"], want["steps"])
        assert torch.allclose(got["y"], want["y"], atol=1e-6)
    # the inputs took both experts and loops of more than one length: both branches ran
    assert {a["expert"] for a in answers} == {"expert_a", "expert_b"}
    assert len({a["steps"] for a in answers}) > 1


@pytest.mark.asyncio
async def test_an_emulated_workload_with_choices_runs_across_worker_processes(
    worker_env: dict[str, str],
) -> None:
    args = ["--workload", AGENT_LOOP, "--time-scale", "0.05"]
    async with (
        LocalCluster(3, args=args, env=worker_env) as cluster,
        cluster.client(0) as client,
    ):
        await cluster.wait_joined(timeout=20)
        flows = ["agent", "router", "retrieval"] * 3
        outputs = await asyncio.gather(*(client.submit(f, timeout=60) for f in flows))
    assert len(outputs) == len(flows)
