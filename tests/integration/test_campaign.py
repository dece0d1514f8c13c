"""A short fault campaign (``compass bench restarts --scenario campaign``): every fault kind
forced once, then random ones, on real worker processes under a stream of jobs; no job hung or
answered twice, and every view whole at the end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compass._bench import netns
from compass._bench.campaign import KINDS, Campaign, Settings, run_campaign


def _held(result: Campaign, kinds: tuple[str, ...]) -> None:
    assert result.jobs.jobs > 0
    assert (result.jobs.hung, result.jobs.twice) == (0, 0), result
    assert result.views_whole, result
    assert result.passed
    assert {k: n for k, n in result.applied.items() if n}.keys() == set(kinds), result.applied
    # a graceful restart drained and exited by itself, a kill killed
    exits = {(f.kind, f.exit_code) for f in result.faults if f.kind in ("kill", "restart")}
    assert exits <= {("kill", -9), ("restart", 0)}, result.faults
    # every worker ended when the campaign did, each on its SIGTERM (a drain: exit code 0)
    assert result.exit_codes == [0] * result.workers, result.exit_codes


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_campaign_of_kills_pauses_restarts_and_cut_links_loses_no_job(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    reason = netns.unavailable()
    if reason is not None:
        pytest.skip(f"cut links need network namespaces: {reason}")
    settings = Settings(
        duration_s=20.0, workers=3, seed=1, netns="on", forced=KINDS, gap_s=(0.5, 2.0),
        env=worker_env, log_dir=tmp_path,
    )  # fmt: skip
    result = await run_campaign(settings)
    _held(result, KINDS)
    assert result.hosts == "network namespaces" and result.cut_skipped is None
    cuts = [f for f in result.faults if f.kind == "cut"]
    assert all(len(set(f.targets)) == 2 for f in cuts), cuts
    # the namespaces went with the campaign
    left = [name for name in os.listdir("/run/netns") if name.endswith(f"-{os.getpid()}")]
    assert not left, left


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_campaign_on_loopback_has_no_cut_links_and_says_why(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    kinds = ("kill", "pause", "restart")
    settings = Settings(
        duration_s=8.0, workers=3, seed=2, netns="off", forced=kinds, gap_s=(0.5, 1.5),
        env=worker_env, log_dir=tmp_path,
    )  # fmt: skip
    result = await run_campaign(settings)
    _held(result, kinds)
    assert result.hosts == "loopback" and "cut" not in result.applied
    assert result.cut_skipped and "loopback" in result.cut_skipped
