"""The step gate a step-wise task's thread waits at between two steps when its worker preempts
(compass/worker/stepgate.py): on, parked until resumed, or woken to stop."""

from __future__ import annotations

import threading

from compass.worker.stepgate import StepGate


def waiting(gate: StepGate) -> tuple[threading.Thread, list[bool]]:
    """A thread that asks at the gate and records what it was told."""
    told: list[bool] = []

    def task() -> None:
        gate.ask()
        told.append(gate.wait())

    thread = threading.Thread(target=task)
    thread.start()
    return thread, told


def test_the_thread_waits_for_the_word_and_goes_on() -> None:
    gate = StepGate()
    thread, told = waiting(gate)
    thread.join(0.05)
    assert thread.is_alive() and told == []  # it waits for the core
    gate.go()
    thread.join(5)
    assert told == [True]


def test_a_suspended_task_waits_past_go_until_resumed() -> None:
    gate = StepGate()
    thread, told = waiting(gate)
    gate.suspend()
    gate.go()  # the loop's go after the core suspended it changes nothing
    thread.join(0.05)
    assert thread.is_alive() and gate.suspended
    gate.resume()
    thread.join(5)
    assert told == [True] and not gate.suspended


def test_a_suspended_task_wakes_to_stop() -> None:
    gate = StepGate()
    thread, told = waiting(gate)
    gate.suspend()
    gate.stop()
    thread.join(5)
    assert told == [False]
    gate.resume()  # too late: stopped stays stopped
    assert not gate.wait()
