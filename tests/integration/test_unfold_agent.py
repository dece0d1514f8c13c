"""An agent loop on a real cluster (examples/agent_app.py): a planner step picks a tool until
it answers or reaches its bound; at the bound the tool it asked for does not run. The answers
equal the same task functions run in this process, and each ingress recorded the tools
skipped."""

from __future__ import annotations

import asyncio

import pytest

from compass.cluster import LocalCluster
from examples.agent_app import MAX_STEPS, facts_needed, reference


@pytest.mark.asyncio
async def test_the_agent_app_answers_as_its_functions_do_locally(
    worker_env: dict[str, str],
) -> None:
    questions = list(range(12))  # 0-5 facts needed: 4 and 5 exceed the bound of 3 tool calls
    async with (
        LocalCluster(2, args=["--app", "examples.agent_app"], env=worker_env) as cluster,
        cluster.client(0) as c0,
        cluster.client(1) as c1,
    ):
        await cluster.wait_joined(timeout=20)
        answers = await asyncio.gather(
            *((c0 if q % 2 else c1).submit("agent", question=q, timeout=60) for q in questions)
        )
        records = [*(await c0.records()), *(await c1.records())]
    # one answer each, the exit's: no tool after the last step ran to add a sink's output
    assert answers == [reference(q) for q in questions]
    bounded = [a for a in answers if facts_needed(a["question"]) >= MAX_STEPS]
    assert bounded and all(a["steps"] == MAX_STEPS for a in bounded)
    assert all(len(a["facts"]) == MAX_STEPS - 1 for a in bounded)
    last = MAX_STEPS - 1
    at_bound = [r for r in records if r.choices.get(f"think@{last}") == "stop"]
    assert len(at_bound) >= len(bounded)
    for record in at_bound:
        assert {f"lookup@{last}", f"compute@{last}"} <= set(record.skipped)
