"""A streamed sink's window (compass/worker/windows.py), without a worker: its step waits
while it is a whole window ahead of its caller's reads, goes on at a read or when stopped, and
fails its job with StreamOverrun after waiting too long."""

from __future__ import annotations

import threading

import pytest

from compass.errors import StreamOverrun
from compass.worker.windows import StepWindow


def test_a_step_within_the_window_does_not_wait() -> None:
    window = StepWindow("gen", size=2, stall_s=60.0)
    assert window.before_step(0) == 0.0 and window.before_step(1) == 0.0
    window.read(0)
    assert window.before_step(2) == 0.0  # one read: one more step
    window.read(0)  # a read told twice (or late) moves nothing back
    window.read(1)
    assert window.before_step(3) == 0.0


def test_a_step_a_window_ahead_waits_for_a_read() -> None:
    window = StepWindow("gen", size=2, stall_s=60.0)
    went_on = threading.Event()

    def step() -> None:
        window.before_step(2)  # two made, none read: it waits
        went_on.set()

    thread = threading.Thread(target=step)
    thread.start()
    assert not went_on.wait(0.05)
    window.read(0)
    thread.join(30)
    assert went_on.is_set()


def test_a_stopped_task_waits_no_more() -> None:
    window = StepWindow("gen", size=1, stall_s=60.0)
    done: list[float] = []
    thread = threading.Thread(target=lambda: done.append(window.before_step(5)))
    thread.start()
    window.wake()
    thread.join(30)
    assert len(done) == 1
    assert window.before_step(9) == 0.0  # stopped: it steps to its end at once


def test_waiting_too_long_for_a_read_fails_the_job_saying_why() -> None:
    window = StepWindow("gen", size=2, stall_s=0.01)
    window.read(0)
    with pytest.raises(StreamOverrun, match=r"'gen' made 3 partial outputs and its caller read 1"):
        window.before_step(3)
