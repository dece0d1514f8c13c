"""The supervisor of a service's background tasks (compass/supervisor.py): a failure is logged
with its traceback and the task's name, counted and reported; what it expects is not; on close
what is left is cancelled (or finished) and awaited, and a failure then is logged too."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from compass.errors import ConnectFailed
from compass.supervisor import Supervisor, log_failures

log = logging.getLogger("compass.test")


async def broken(after_s: float = 0.0) -> None:
    await asyncio.sleep(after_s)
    raise RuntimeError("injected")


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.asyncio
async def test_a_failed_task_is_logged_with_its_name_and_traceback_counted_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reported: list[tuple[str, BaseException]] = []
    tasks = Supervisor("w0", log, on_failure=lambda t, e: reported.append((t.get_name(), e)))
    task = tasks.spawn(broken(), "w0-plan-job-1")
    await asyncio.wait([task])
    await asyncio.sleep(0)
    (record,) = errors(caplog)
    assert "w0: w0-plan-job-1 failed" in record.getMessage()
    assert record.exc_info is not None and "injected" in str(record.exc_info[1])
    assert tasks.failures == 1 and len(tasks) == 0
    assert [(name, str(error)) for name, error in reported] == [("w0-plan-job-1", "injected")]


@pytest.mark.asyncio
async def test_what_a_task_expects_and_a_cancellation_are_no_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def unreachable() -> None:
        raise ConnectFailed("nobody listens")

    tasks = Supervisor("w0", log)
    dial = tasks.spawn(unreachable(), "dial", expected=(ConnectFailed,))
    with pytest.raises(ConnectFailed):
        await dial  # whoever awaits it gets the error
    sleeper = tasks.spawn(asyncio.sleep(10), "sleeper")
    await asyncio.sleep(0)
    sleeper.cancel()
    await asyncio.wait([sleeper])
    await asyncio.sleep(0)
    assert tasks.failures == 0 and not errors(caplog)


@pytest.mark.asyncio
async def test_a_failure_in_reporting_is_logged_and_does_not_stop_the_supervisor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def report(task: asyncio.Task[Any], error: BaseException) -> None:
        raise ValueError("the report failed")

    tasks = Supervisor("w0", log, on_failure=report)
    await asyncio.wait([tasks.spawn(broken(), "one")])
    await asyncio.sleep(0)
    assert [r.getMessage() for r in errors(caplog)][-1] == "w0: reporting the failure of one failed"
    await asyncio.wait([tasks.spawn(broken(), "two")])
    await asyncio.sleep(0)
    assert tasks.failures == 2


@pytest.mark.asyncio
async def test_close_cancels_and_awaits_finishes_what_must_and_logs_a_failure_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    finished: list[str] = []

    async def closing_work() -> None:
        await asyncio.sleep(0.05)
        finished.append("closed")

    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("injected: failed while cancelled") from None

    tasks = Supervisor("w0", log)
    waiting = tasks.spawn(asyncio.sleep(10), "waiting")
    closing = tasks.spawn(closing_work(), "closing", finish=True)
    bad = tasks.spawn(fails_when_cancelled(), "bad")
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await tasks.aclose()
    assert waiting.cancelled() and closing.done() and not closing.cancelled()
    assert finished == ["closed"] and bad.done() and len(tasks) == 0
    (record,) = errors(caplog)
    assert "w0: bad failed" in record.getMessage() and tasks.failures == 1
    late = tasks.spawn(asyncio.sleep(10), "late", finish=True)  # after close: never runs
    await asyncio.wait([late])
    assert late.cancelled()


def test_log_failures_logs_each_error_of_a_gather_and_skips_cancellations(
    caplog: pytest.LogCaptureFixture,
) -> None:
    results: list[object] = [None, RuntimeError("injected"), asyncio.CancelledError(), 3]
    assert log_failures(results, log, "closing", ["a", "b", "c", "d"]) == 1
    (record,) = errors(caplog)
    assert record.getMessage() == "closing (b) failed: RuntimeError('injected')"
    assert record.exc_info is not None
