"""``compass bench soak`` in small: a stream of jobs on real worker processes, one drained and
restarted on the way, every job accounted for; and the process and tables sections of a live
worker's status that the soak samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compass._bench import soak as soak_module
from compass._bench.soak import SoakConfig, soak
from compass._bench.soak_report import finish
from compass.cluster import LocalCluster

from .conftest import PAPER


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_short_soak_answers_every_job_once(
    worker_env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # drained at the start of the stream: a join's inputs were split between the draining
    # worker and its peer (each moved it on its own), which held a job until the drain gave up
    # (a drain's end is routine, logged at INFO: the workers log at INFO to show it)
    config = SoakConfig(
        workers=2, jobs=200, rate=0, sample_s=0.5,
        worker_args=("--drain-timeout", "30", "--log-level", "info"),
    )  # fmt: skip
    monkeypatch.setattr(soak_module, "PROGRESS_S", 0.0)  # a progress line at every sample
    so_far = tmp_path / "soak.json.partial"
    out = await soak(config, env=worker_env, log_dir=tmp_path / "logs", checkpoint=so_far)
    # the results so far were kept as it ran: the last sample's, not yet the whole JSON
    kept = json.loads(so_far.read_text())
    assert kept["complete"] is False and 0 < kept["jobs"]["submitted"] <= 200, kept["jobs"]
    assert set(kept["samples"]) >= {"w0", "driver"} and kept["t"] > 0
    progress = [line for line in capsys.readouterr().out.splitlines() if "submitted" in line]
    assert progress and "jobs/s" in progress[-1] and "RSS MB: w0" in progress[-1], progress
    log = (tmp_path / "logs" / "w1.log").read_text()
    assert "w1: drained: every job and task held here is done" in log
    assert "drain ended with" not in log
    jobs = out["jobs"]
    assert jobs["submitted"] == 200
    assert jobs["submitted"] == jobs["ok"] + jobs["failed"] + jobs["hung"], jobs
    assert (jobs["hung"], jobs["twice"], jobs["untyped"]) == (0, 0, 0), jobs
    assert jobs["big"] > 0 and jobs["with_deadline"] > 0
    assert out["restart"]["worker"] == "w1" and out["restart"]["view_s"] is not None
    assert set(out["rss_growth_mb_second_half"]) == {"w0", "w1"}
    assert isinstance(out["false_deaths"], int)
    assert set(out["checks"]) >= {"every_job_answered_once", "none_hung", "rss_flat"}
    samples = out["samples"]
    assert set(samples) == {"w0", "w1", "driver"}
    for name in ("w0", "w1"):
        assert len({s["instance"] for s in samples[name]}) == (2 if name == "w1" else 1)
        for sample in samples[name]:
            assert sample["rss_mb"] > 10 and sample["open_fds"] > 3, sample
            assert sample["asyncio_tasks"] >= 1 and sample["threads"] >= 1, sample
            assert "answered_keys" in sample["tables"], sample
    # its end: the whole JSON replaces the results so far, the table, the plot
    finish(out, str(tmp_path / "soak.json"), so_far, str(tmp_path / "rss.png"))
    assert not so_far.exists()
    assert json.loads((tmp_path / "soak.json").read_text())["jobs"] == jobs
    assert "jobs: submitted 200" in capsys.readouterr().out
    assert (tmp_path / "rss.png").stat().st_size > 10_000


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_live_workers_status_says_what_it_holds(worker_env: dict[str, str]) -> None:
    args = ["--workload", PAPER, "--time-scale", "0.02"]
    cluster = LocalCluster(1, args=args, env=worker_env)
    async with cluster, cluster.client() as client:
        for _ in range(3):
            await client.submit("question_answer", data=np.zeros(1 << 20, np.uint8))
        status = await client.status()
    process, tables = status.process, status.tables
    assert process["rss_mb"] > 10 and process["open_fds"] > 3
    assert process["asyncio_tasks"] >= 1 and process["threads"] >= 1
    assert (tables["jobs"], tables["answers"], tables["inbox"]) == (0, 0, 0)  # all answered
    assert tables["trace"] == 3  # the answer records of the three jobs
    assert tables["client_channels"] >= 1 and tables["members"] == 0
