"""Background tasks with an owner: nothing a service starts runs unsupervised.

A service that runs work in the background (a worker, its membership, a channel's handlers, a
local cluster's worker processes) starts it through one :class:`Supervisor`. The supervisor
keeps a reference to every task it started (the loop keeps only weak ones), and when a task
ends with an exception it did not expect, logs it at ERROR with its traceback and the task's
name, counts it, and calls the service's ``on_failure`` (the worker counts it in
``internal_errors``; where a task must not end, the service stops). On :meth:`Supervisor.aclose`
it cancels what is left, waits for it, and logs, never drops, what ended in an error other
than a cancellation. :func:`log_failures` does the same for the results of an
``asyncio.gather(..., return_exceptions=True)``.

Why not :class:`asyncio.TaskGroup`: a task group cancels every task in it when one fails and
raises the failure at the end of its ``async with``. That is right for work that stands or
falls together (a client's ``submit_many``), and wrong here: a server's tasks are per job and
per peer, one job's failed plan request must not cancel another job's, and the service lives
from ``start`` to ``aclose`` rather than inside one block. So a failure here is contained,
reported and counted; the service decides whether it escalates.

This module imports no other module of compass: the wire, the worker and the cluster all use it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["Supervisor", "log_failures"]

T = TypeVar("T")

#: what a service is told of a task that failed: the task, and its error
OnFailure = Callable[[asyncio.Task[Any], BaseException], None]


class Supervisor:
    """The background tasks of one service, named ``owner`` in what is logged to ``log``.

    :meth:`spawn` starts a task it owns. A task that ends in an exception (not a cancellation,
    and not one of its ``expected`` types) is logged at ERROR with its traceback, counted in
    :attr:`failures`, and passed to ``on_failure``. :meth:`aclose` cancels the tasks (those
    spawned with ``finish=True`` are waited for instead) and waits for them all; a task
    spawned after that is cancelled before it runs.
    """

    def __init__(
        self, owner: str, log: logging.Logger, *, on_failure: OnFailure | None = None
    ) -> None:
        self.owner = owner
        self.on_failure = on_failure
        #: tasks that ended in an unexpected exception since start
        self.failures = 0
        self._log = log
        self._tasks: dict[asyncio.Task[Any], tuple[type[BaseException], ...]] = {}
        self._finish: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self,
        coro: Coroutine[Any, Any, T],
        name: str,
        *,
        expected: tuple[type[BaseException], ...] = (),
        finish: bool = False,
    ) -> asyncio.Task[T]:
        """Run ``coro`` as a task named ``name``, owned by this supervisor.

        ``expected``: exceptions that are the task's answer for whoever awaits it (a dial that
        fails with a connection error), not failures. ``finish``: on :meth:`aclose`, wait for
        the task instead of cancelling it (closing work, bounded on its own).
        """
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks[task] = expected
        if finish:
            self._finish.add(task)
        if self._closed or (self._closing and not finish):
            task.cancel()  # the service is closing: it does not run
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        expected = self._tasks.pop(task, ())
        self._finish.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is None or isinstance(error, expected):
            return
        self._failed(task, error)

    def _failed(self, task: asyncio.Task[Any], error: BaseException) -> None:
        self.failures += 1
        self._log.error("%s: %s failed: %r", self.owner, task.get_name(), error, exc_info=error)
        if self.on_failure is not None:
            try:
                self.on_failure(task, error)
            except Exception:
                self._log.exception("%s: reporting the failure of %s failed", self.owner,
                                    task.get_name())  # fmt: skip

    def cancel(self) -> None:
        """Start closing: cancel every task but those to finish (see :meth:`aclose`)."""
        self._closing = True
        for task in self._tasks:
            if task not in self._finish:
                task.cancel()

    async def aclose(self) -> None:
        """Cancel the tasks (wait for those to finish), and wait until every one has ended,
        those started meanwhile included. Each one's failure is logged (by :meth:`spawn`'s
        callback); a cancellation is no failure. Idempotent."""
        self.cancel()
        while self._tasks:
            await asyncio.wait(list(self._tasks))
            await asyncio.sleep(0)  # their done callbacks run
        self._closed = True


def log_failures(
    results: Iterable[object], log: logging.Logger, what: str, names: Iterable[str] = ()
) -> int:
    """Log at ERROR, with its traceback, each exception among the ``results`` of an
    ``asyncio.gather(..., return_exceptions=True)`` (cancellations aside): ``what`` says what
    was gathered, ``names`` names each result, in order, where known. Returns how many."""
    failed = 0
    labels = iter(names)
    for result in results:
        label = next(labels, "")
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            failed += 1
            log.error("%s%s failed: %r", what, f" ({label})" if label else "", result,
                      exc_info=result)  # fmt: skip
    return failed
