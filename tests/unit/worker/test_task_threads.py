"""The task threads hand a task's result to the runner as it arrives on the loop: ``then`` is
called when the future settles, before any done callback (which waits for the loop's next
turn); a task given up on (timed out) or cancelled (the worker stops) gets its ``then`` on the
next turn, as a done callback would, and never a second time. ``then`` is told the call's own
time in its thread (where it returned)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from compass.worker.executor import TaskThreads


@pytest.mark.asyncio
async def test_then_sees_the_result_before_any_done_callback() -> None:
    threads = TaskThreads()
    order: list[object] = []
    work = threads.run(
        asyncio.get_running_loop(), lambda x: x * 2, 21, then=lambda f, _: order.append(f.result())
    )
    work.add_done_callback(lambda f: order.append("done callback"))
    assert await work == 42
    await asyncio.sleep(0)
    assert order == [42, "done callback"]
    failed = threads.run(
        asyncio.get_running_loop(), lambda: 1 / 0, then=lambda f, _: order.append(f)
    )
    with pytest.raises(ZeroDivisionError):
        await failed
    assert order[-1] is failed


@pytest.mark.asyncio
async def test_abandoned_or_cancelled_work_gets_then_once_on_the_next_turn() -> None:
    loop = asyncio.get_running_loop()
    threads = TaskThreads()
    release = threading.Event()
    seen: list[tuple[asyncio.Future[object], float | None]] = []
    returned: list[bool] = []
    stuck = threads.run(loop, release.wait, 5.0, then=lambda f, took: seen.append((f, took)))
    threads.abandon(stuck, lambda: returned.append(True))
    assert seen == []  # not from inside the call that gave up on it
    await asyncio.sleep(0)
    assert seen == [(stuck, None)] and isinstance(stuck.exception(), TimeoutError)
    cancelled = threads.run(loop, release.wait, 5.0, then=lambda f, took: seen.append((f, took)))
    threads.cancel(cancelled)
    await asyncio.sleep(0)
    assert seen == [(stuck, None), (cancelled, None)] and cancelled.cancelled()
    release.set()  # both threads return: the abandoned one says so, neither calls then again
    for _ in range(200):
        if returned:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert returned == [True] and seen == [(stuck, None), (cancelled, None)]


@pytest.mark.asyncio
async def test_then_is_told_the_calls_own_time_in_its_thread() -> None:
    now = [10.0]
    threads = TaskThreads(clock=lambda: now[0])

    def runs_for(seconds: float) -> float:
        now[0] += seconds  # its time, on the threads' clock
        return seconds

    told: list[float | None] = []
    work = threads.run(
        asyncio.get_running_loop(), runs_for, 2.5, then=lambda f, took: told.append(took)
    )
    assert await work == 2.5
    assert told == [2.5]
