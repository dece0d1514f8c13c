"""A nested loop on a real cluster (examples/nested_app.py): rounds of drafts, each round a
loop stopped by its own check, stopped by a judge; the answers equal the same task functions
run in this process, and each ingress recorded what its jobs ran and skipped."""

from __future__ import annotations

import asyncio

import pytest

from compass.cluster import LocalCluster
from examples.nested_app import app, reference


@pytest.mark.asyncio
async def test_the_nested_app_answers_as_its_functions_do_locally(
    worker_env: dict[str, str],
) -> None:
    targets = list(range(6))
    async with (
        LocalCluster(2, args=["--app", "examples.nested_app"], env=worker_env) as cluster,
        cluster.client(0) as c0,
        cluster.client(1) as c1,
    ):
        await cluster.wait_joined(timeout=20)
        answers = await asyncio.gather(
            *((c0 if t % 2 else c1).submit("revise", target=t, timeout=60) for t in targets)
        )
        records = [*(await c0.records()), *(await c1.records())]
    assert answers == [reference(t) for t in targets]
    # rounds and drafts of several lengths ran: both loops stopped early and at their bounds
    assert {len(a["log"]) for a in answers} == {1, 2, 3}
    assert {int(step.split(":")[1]) for a in answers for step in a["log"]} == {1, 2, 3, 4}
    # each ingress recorded, in words, how many drafts each round took, and skipped the rest
    assert sorted(r.taken for r in records) == sorted(_taken(a["log"]) for a in answers)
    order = app.get_workflow("revise").order
    for record in records:
        ran = [t for t in order if t not in record.skipped]
        rounds = [t for t in ran if t.startswith("judge@")]
        drafts = [sum(t.startswith(f"draft@{r}.") for t in ran) for r in range(len(rounds))]
        assert record.taken == _taken([f"{r}:{d}" for r, d in enumerate(drafts)])
        assert record.choices[f"judge@{len(rounds) - 1}"] == "stop"


def _taken(log: list[str]) -> str:
    """What a job's record says of its choices, from its log of ``round:drafts``."""
    drafts = [int(step.split(":")[1]) for step in log]
    checks = ", ".join(map(str, drafts))
    plural = "" if sum(drafts) == 1 else "s"
    return f"check: {checks} iteration{plural}; judge: {len(log)} iteration" + (
        "" if len(log) == 1 else "s"
    )
