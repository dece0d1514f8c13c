"""Restarts lose nothing, on real worker processes: a worker restarted under its own name, a
crash loop, the seed restarted, a drain, and a rolling restart under a steady stream of jobs
(the scenarios of ``compass bench restarts``, each asserted against its target)."""

from __future__ import annotations

import pytest

from compass._bench.restarts import Outcome, run_scenario


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
