"""Learned task times spread with the view (issue 39, item 2), on real worker processes: a task
that runs slower than declared on one worker is estimated the same by every ingress within a
gossip round, so admission agrees across the cluster."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from cli.format import status_lines
from compass import Client
from compass.cluster import LocalCluster
from compass.errors import DeadlineUnreachable

from .conftest import app_environment

SLOW_APP = """
import time

import compass

app = compass.App("slow")
slow = app.workflow("slow", inputs=["ms"])

@slow.task(expected_ms=50)
def nap(model, ms):
    time.sleep(ms / 1000)
    return ms
"""

RUNS = 5  # 400 ms runs of a 50 ms task: the EMA (alpha 0.2) reaches about 285 ms


def learned(status: Any, worker: str) -> dict[str, Any] | None:
    """What ``status``'s worker believes ``worker`` learned of ``slow/nap`` (None: nothing)."""
    for row in status.cluster:
        if row["name"] == worker:
            return next((e for e in row.get("learned", []) if e["task"] == "nap"), None)
    return None


async def refusal(client: Client, deadline_ms: float) -> DeadlineUnreachable:
    with pytest.raises(DeadlineUnreachable) as info:
        await client.submit("slow", ms=400, deadline_ms=deadline_ms, timeout=20)
    return info.value


@pytest.mark.asyncio
async def test_a_time_learned_on_one_worker_reaches_every_ingress_and_admission_agrees(
    tmp_path: Path,
) -> None:
    env = app_environment(tmp_path, "slow_app", SLOW_APP)
    async with LocalCluster(3, args=["--app", "slow_app"], env=env) as cluster:
        clients = [cluster.client(i) for i in range(3)]
        try:
            first = clients[0]
            for _ in range(RUNS):  # submitted to w0, planned there: nothing is queued anywhere
                assert await first.submit("slow", ms=400, timeout=20) == 400
            status = await first.status()
            mine = learned(status, "w0")
            assert mine is not None and mine["runs"] == RUNS and mine["ms"] > 200
            shown = f"learned slow/nap {mine['ms']:.1f} ms ({RUNS} runs)"
            assert any(shown in line for line in status_lines(status.to_json()))
            # within a gossip round (a rumor every 100 ms) the others hold what w0 learned; a
            # worker that missed the rumor (a busy machine) has it from the anti-entropy sync,
            # every 5 s to one peer (bounded: 600 looks, 30 s at most)
            heard: list[dict[str, Any] | None] = []
            give_up = time.monotonic() + 30
            for _ in range(600):
                heard = [learned(await c.status(), "w0") for c in clients[1:]]
                if all(h == mine for h in heard) or time.monotonic() > give_up:
                    break
                await asyncio.sleep(0.05)
            assert heard == [mine, mine]
            # every ingress refuses a job it cannot finish in time, with one estimate: the
            # others would have planned it on themselves at the declared 50 ms and admitted it
            refusals = [await refusal(c, deadline_ms=200) for c in clients]
            estimates = [r.detail["estimate_ms"] for r in refusals]
            assert all(e > 200 for e in estimates), estimates
            assert max(estimates) - min(estimates) < 0.1 * min(estimates), estimates
            # and admits one it can finish, wherever it is submitted
            for client in clients:
                assert await client.submit("slow", ms=10, deadline_ms=5000, timeout=20) == 10
        finally:
            for client in clients:
                await client.aclose()
