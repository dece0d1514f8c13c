"""Where a step-wise task's thread waits between two steps for its worker core's word.

With preemption on (``--preempt``), the core decides at every step boundary of a step-wise
task whether it goes on, gives its lane up (:class:`~compass.core.events.SuspendTask`) or
stops (:class:`~compass.core.events.StopTask`). The task's code runs in a thread; the core
runs on the event loop. A :class:`StepGate` joins them: after each step the thread reports the
step to the loop and waits at the gate; the loop lets it go on once the core has handled the
step without suspending it, or keeps it waiting (its generator, and so its state, parked in
the thread) until the task is resumed on a lane, or wakes it to stop. One loop hop per step:
the price of a decision taken exactly at the boundary, not a step later.
"""

from __future__ import annotations

import threading

__all__ = ["StepGate"]

_RUN, _ASKED, _SUSPENDED, _STOP = range(4)


class StepGate:
    """One step-wise task's gate; see the module docstring. The thread calls :meth:`ask`
    before it reports a step and :meth:`wait` after; the loop calls :meth:`go`,
    :meth:`suspend`, :meth:`resume` and :meth:`stop`."""

    __slots__ = ("_cond", "_state")

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state = _RUN

    def ask(self) -> None:
        """(The task's thread.) A step ended: wait for the word before the next one."""
        with self._cond:
            if self._state == _RUN:
                self._state = _ASKED

    def wait(self) -> bool:
        """(The task's thread.) Block until the task may go on (True) or must stop (False)."""
        with self._cond:
            while self._state in (_ASKED, _SUSPENDED):
                self._cond.wait()
            return self._state == _RUN

    def go(self) -> None:
        """(The loop.) The core handled the step and did not suspend the task: on."""
        with self._cond:
            if self._state == _ASKED:
                self._state = _RUN
                self._cond.notify()

    def suspend(self) -> None:
        """(The loop.) The task gave its lane up: it waits until :meth:`resume`."""
        with self._cond:
            if self._state != _STOP:
                self._state = _SUSPENDED

    @property
    def suspended(self) -> bool:
        return self._state == _SUSPENDED

    def resume(self) -> None:
        """(The loop.) A lane took the task again: its next step runs."""
        with self._cond:
            if self._state == _SUSPENDED:
                self._state = _RUN
                self._cond.notify()

    def stop(self) -> None:
        """(The loop.) The task ends at this boundary (its job ended, or the worker stops)."""
        with self._cond:
            self._state = _STOP
            self._cond.notify()
