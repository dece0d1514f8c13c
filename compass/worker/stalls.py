"""This worker's own stalls (:class:`StallCheck`): a timer on its event loop, and how late it
fires is how long the loop was stuck. The membership tells its member table, so that its
peers' silence meanwhile does not count against them (Lifeguard's local health).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

__all__ = ["STALL_CHECK_S", "STALL_SLACK_S", "StallCheck"]

#: how often this worker checks its own loop for stalls: a timer this often, and how late it
#: fires is how long the loop was stuck (its peers' silence meanwhile does not count)
STALL_CHECK_S = 0.05
#: lateness below this is a loop's ordinary jitter, not a stall
STALL_SLACK_S = 0.01


class StallCheck:
    """Calls ``stalled(late_s)`` each time its timer, armed every :data:`STALL_CHECK_S` on the
    running loop from the first :meth:`check`, fires later than :data:`STALL_SLACK_S`."""

    def __init__(self, stalled: Callable[[float], None]) -> None:
        self._stalled = stalled
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf  # when the timer is due (the loop's clock)
        self._closed = False

    @property
    def armed(self) -> bool:
        """Whether its timer runs (from the first :meth:`check` until :meth:`close`)."""
        return self._timer is not None

    def overdue(self) -> bool:
        """Whether the timer is late now past the slack: the loop ran something else first
        after a stall (a check now tells it before that is judged)."""
        return asyncio.get_running_loop().time() > self._due + STALL_SLACK_S

    def check(self) -> None:
        """Tell how late the check ran, if late past :data:`STALL_SLACK_S`, and arm it again.
        Run by its timer, and by the membership before each tick whose turn came first after
        a stall: a late probe timeout is judged with the stall known."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        late = now - self._due
        if late > STALL_SLACK_S and not self._closed:
            self._stalled(late)
        if self._timer is not None:
            self._timer.cancel()
        self._due = now + STALL_CHECK_S
        self._timer = None if self._closed else loop.call_at(self._due, self.check)

    def close(self) -> None:
        """Stop the timer; it tells nothing more."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
