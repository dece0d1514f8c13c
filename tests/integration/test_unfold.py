"""A workflow decided at run time on a real cluster (examples/router_app.py): a torch router
picks an expert, a refiner loops until its own output says stop; the answers equal the same
task functions run in this process, and a workload with choices runs emulated across
worker processes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from cli.format import status_lines
from compass.cluster import LocalCluster
from examples.router_app import MAX_STEPS, reference

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
        records = [*(await c0.records()), *(await c1.records())]
        statuses = [(await c.status()).to_json() for c in (c0, c1)]
    # each ingress recorded the choices its jobs made (reported by the workers that made
    # them) and the tasks they skipped; `compass status` lists them
    ran = sorted((a["expert"], a["steps"]) for a in answers)
    assert sorted(_taken(r.taken) for r in records if r.workflow == "route") == ran
    for r in records:
        expert, steps = _taken(r.taken)
        other = "expert_b" if expert == "expert_a" else "expert_a"
        assert set(r.skipped) == {other} | {f"refine@{i}" for i in range(steps, MAX_STEPS)}
        assert r.choices["route"] == expert and r.choices[f"refine@{steps - 1}"] == "stop"
    shown = "\n".join(line for status in statuses for line in status_lines(status))
    assert all(
        f"{r.job} (route, ok): {r.taken}; {len(r.skipped)} tasks skipped" in shown for r in records
    )
    expected = [reference(x) for x in inputs]
    for got, want in zip(answers, expected, strict=True):
        assert (got["expert"], got["steps"]) == (want["expert"], want["steps"])
        assert torch.allclose(got["y"], want["y"], atol=1e-6)
    # the inputs took both experts and loops of more than one length: both branches ran
    assert {a["expert"] for a in answers} == {"expert_a", "expert_b"}
    assert len({a["steps"] for a in answers}) > 1


def _taken(words: str) -> tuple[str, int]:
    """``route: expert_a; refine: 3 iterations`` as (expert, iterations)."""
    route, refine = words.split("; ")
    return route.removeprefix("route: "), int(refine.removeprefix("refine: ").split()[0])


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
