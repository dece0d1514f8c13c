"""The task threads hand a task's result to the runner as it arrives on the loop: ``then`` is
called when the future settles, before any done callback (which waits for the loop's next
turn); a task given up on (timed out) or cancelled (the worker stops) gets its ``then`` on the
next turn, as a done callback would, and never a second time."""

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
        asyncio.get_running_loop(), lambda x: x * 2, 21, then=lambda f: order.append(f.result())
    )
    work.add_done_callback(lambda f: order.append("done callback"))
    assert await work == 42
    await asyncio.sleep(0)
    assert order == [42, "done callback"]
    failed = threads.run(asyncio.get_running_loop(), lambda: 1 / 0, then=order.append)
    with pytest.raises(ZeroDivisionError):
        await failed
    assert order[-1] is failed


@pytest.mark.asyncio
async def test_abandoned_or_cancelled_work_gets_then_once_on_the_next_turn() -> None:
    loop = asyncio.get_running_loop()
    threads = TaskThreads()
    release = threading.Event()
    seen: list[asyncio.Future[object]] = []
    returned: list[bool] = []
    stuck = threads.run(loop, release.wait, 5.0, then=seen.append)
    threads.abandon(stuck, lambda: returned.append(True))
    assert seen == []  # not from inside the call that gave up on it
    await asyncio.sleep(0)
    assert seen == [stuck] and isinstance(stuck.exception(), TimeoutError)
    cancelled = threads.run(loop, release.wait, 5.0, then=seen.append)
    threads.cancel(cancelled)
    await asyncio.sleep(0)
    assert seen == [stuck, cancelled] and cancelled.cancelled()
    release.set()  # both threads return: the abandoned one says so, neither calls then again
    for _ in range(200):
        if returned:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert returned == [True] and seen == [stuck, cancelled]
