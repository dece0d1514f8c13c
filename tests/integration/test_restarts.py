"""Restarts lose nothing, on real worker processes: a worker restarted under its own name, a
crash loop, the seed restarted, a drain, and a rolling restart under a steady stream of jobs
(the scenarios of ``compass bench restarts``, each asserted against its target)."""

from __future__ import annotations

import asyncio
import time

import pytest

from compass._bench.restarts import Outcome, run_scenario
from compass.cluster import LocalCluster
from compass.config import SchedConfig

from .conftest import PAPER


def _lost_nothing(outcome: Outcome) -> None:
    assert outcome.jobs > 0
    assert (outcome.ok, outcome.hung, outcome.failed, outcome.twice) == (
        outcome.jobs, 0, 0, 0,
    ), outcome  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_worker_restarted_under_its_own_name_answers_every_job(
    worker_env: dict[str, str],
) -> None:
    # its job ids start again at 1: the peer that finished the last instance's must run them
    outcome = await run_scenario("same_name", worker_env)
    _lost_nothing(outcome)
    assert outcome.view_s is not None


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_crash_loop_loses_no_job_after_each_restart(worker_env: dict[str, str]) -> None:
    # killed and back within a second: the peer may still hold the old instance's connection
    outcome = await run_scenario("crash_loop", worker_env)
    _lost_nothing(outcome)
    assert outcome.view_s is not None


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_restarted_seed_is_taken_back_and_every_view_is_whole(
    worker_env: dict[str, str],
) -> None:
    # it left on purpose, and its only seed is itself: the others must find it again
    outcome = await run_scenario("seed_restart", worker_env)
    assert outcome.view_s is not None, "the cluster stayed split"
    _lost_nothing(outcome)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_draining_worker_finishes_its_queued_jobs_before_it_exits(
    worker_env: dict[str, str],
) -> None:
    outcome = await run_scenario("drain", worker_env)
    _lost_nothing(outcome)
    assert outcome.exit_s is not None and outcome.exit_s < 25.0  # within --drain-timeout


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_rolling_restart_under_a_job_stream_loses_nothing(
    worker_env: dict[str, str],
) -> None:
    outcome = await run_scenario("rolling", worker_env)
    _lost_nothing(outcome)
    assert outcome.view_s is not None and outcome.view_s <= 5.0, outcome


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_seed_restarted_gracefully_is_in_every_view_before_a_sync_would_bring_it(
    worker_env: dict[str, str],
) -> None:
    """In a bounded view a worker sends its state to a peer that takes it in as it answers the
    join, then nothing until it changes. Heard before the answer, that state was dropped,
    and the peer planned without the restarted seed until a sync (every 5 s) brought it: 2
    of 4 graceful restarts took 5.7 and 10.9 s. Kept until the peer joins, it is heard then:
    every view is whole within a second or so, each of four times."""
    args = ["--workload", PAPER, "--time-scale", "0.05"]
    async with LocalCluster(4, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        for _ in range(4):
            await cluster.restart(0)  # SIGTERM: it drains, leaves, and is started again
            since = time.monotonic()
            while not all(len(view) == 4 for view in await _views(cluster)):
                assert time.monotonic() - since < SYNC_S - 1.0, "a view waited for a sync"
                await asyncio.sleep(0.05)


#: a bounded view's whole-view sync period, in seconds
SYNC_S = SchedConfig().sync_ms / 1000.0


async def _views(cluster: LocalCluster) -> list[set[str]]:
    """The workers in each worker's view."""

    async def one(i: int) -> set[str]:
        async with cluster.client(i) as client:
            return {row["name"] for row in (await client.status()).cluster}

    return list(await asyncio.gather(*(one(i) for i in range(len(cluster.workers)))))
