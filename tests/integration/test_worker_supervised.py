"""Nothing a worker runs in the background fails unseen (compass/supervisor.py), in-process
workers over loopback: a plan request that fails in a way nobody foresaw is logged and counted,
and its job planned here and answered (not left to the client's timeout); a dial for held
messages that fails is logged and counted, and what waited given up as after any failed dial;
a local cluster's reader of a worker's output that fails is logged, not raised at stop."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from compass.cluster import LISTENING, WorkerProcess
from compass.config import SchedConfig, WorkerConfig
from compass.core.messages import DoneMsg
from compass.worker import outbox
from compass.worker.process import build_worker
from compass.worker.server import Worker

from .conftest import one_worker_workload


def failures(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    """The ERROR records, each with its traceback, that say ``text``."""
    return [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and text in r.getMessage() and r.exc_info
    ]


async def until(check: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
    async with asyncio.timeout(limit_s):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@asynccontextmanager
async def two_workers(tmp_path: Path, policy: str = "compass") -> AsyncIterator[list[Worker]]:
    """Workers w0 and w1 of a one-task workload, joined, each in the other's view."""
    spec = one_worker_workload(tmp_path, quick=(None, 2.0))
    sched = SchedConfig(policy=policy)
    w0 = build_worker(WorkerConfig(workload=spec, name="w0", sched=sched))
    async with w0:
        w1 = build_worker(WorkerConfig(workload=spec, name="w1", sched=sched, join=(w0.address,)))
        async with w1:
            await until(
                lambda: bool(w0.gossip.port.view.get("w1") and w1.gossip.port.view.get("w0")),
                "each worker has the other in its view",
            )
            yield [w0, w1]


@pytest.mark.asyncio
async def test_a_plan_request_that_fails_unexpectedly_is_logged_and_the_job_planned_here(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with two_workers(tmp_path, policy="central") as (_, w1):
        # central: w1's jobs are planned at w0 (the lowest name), asked for over a channel
        async def broken(name: str) -> Any:
            raise RuntimeError("injected: no channel for the plan request")

        assert w1.membership is not None
        monkeypatch.setattr(w1.membership.channels, "open_channel", broken)
        async with asyncio.timeout(10):  # answered, not left to the client's timeout
            await w1.submit("quick", {"x": 1})
        (record,) = failures(caplog, "asking w0 to plan job")
        assert record.exc_info is not None and "injected" in str(record.exc_info[1])
        assert w1.stats.internal_errors == 1
        assert w1.trace[-1]["plan"]  # planned (here), and run


@pytest.mark.asyncio
async def test_a_dial_for_held_messages_that_fails_is_logged_and_what_waits_given_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "HOLD_S", 0.2)
    async with two_workers(tmp_path) as (w0, _):
        assert w0.membership is not None
        # no channel open to w1 (closed idle, say): a message for it waits while it is dialed
        monkeypatch.setattr(w0.membership.channels, "channel", lambda name: None)

        async def broken(name: str) -> Any:
            raise RuntimeError("injected: dialing failed")

        monkeypatch.setattr(w0.membership.channels, "open_channel", broken)
        dropped = w0.stats.messages_dropped
        w0.outbox.send("w1", DoneMsg("w1-job-1"))
        assert "w1" in w0.outbox.held
        await until(lambda: "w1" not in w0.outbox.held, "what waited for w1 is given up")
        (record,) = failures(caplog, "w0-dial-w1 failed")
        assert record.exc_info is not None and "injected" in str(record.exc_info[1])
        assert w0.stats.internal_errors == 1
        assert w0.stats.messages_dropped == dropped + 1  # given up: its job is the core's
        assert not w0.outbox.dialing


@pytest.mark.asyncio
async def test_a_worker_processs_output_reader_that_fails_is_logged_not_raised_at_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: WorkerProcess) -> None:
        raise RuntimeError("injected: reading the output failed")

    monkeypatch.setattr(WorkerProcess, "_drain_stdout", broken)
    script = f"import time; print({LISTENING + '127.0.0.1:1'!r}, flush=True); time.sleep(30)"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE
    )
    worker = WorkerProcess("w0", process, tmp_path / "w0.log")
    try:
        assert await worker.read_address(10) == "127.0.0.1:1"
        await until(lambda: bool(failures(caplog, "w0-stdout failed")), "the failure is logged")
    finally:
        assert await worker.stop(timeout=10) != 0  # stopped, the reader's failure not raised
