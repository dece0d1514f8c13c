"""What caused an instruction, named only when read.

Every instruction carries the id of the event that caused it (dask's stimulus ids). An event
with an id of its own (``cause``, a client's request, say) passes it on as it is; an anonymous
one is named ``kind:subject#n``, the ``n``-th event the core handled
(:func:`compass.core.events.stimulus_id`, through the event's own
:meth:`~compass.core.events.Named.stimulus_id`). Formatting that name for every event cost a
chain task more than any other part of the bookkeeping, and only traces, the logs of faults
and tests read it. So an instruction keeps a :data:`Cause`: the id itself, or the anonymous
event and its number, and :func:`cause_text` makes the name when it is read: the same text
every time, the same for the same events.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias

__all__ = ["Cause", "Caused", "cause_text"]


class _Nameable(Protocol):
    """An event: it names itself (:class:`compass.core.events.Named`; that module cannot be
    imported here: it imports the lanes, whose instructions read their causes through this
    one)."""

    def stimulus_id(self, n: int) -> str: ...


#: an event's own id, or an anonymous event and its number (named by :func:`cause_text`)
Cause: TypeAlias = "str | tuple[_Nameable, int]"


def cause_text(cause: Cause) -> str:
    """The id ``cause`` stands for: itself, or the name of the anonymous event it holds."""
    if isinstance(cause, str):
        return cause
    event, n = cause
    return event.stimulus_id(n)


class Caused:
    """What every instruction shares: the event that caused it (``stimulus``, a dataclass
    field of each) and its id, named when read (:attr:`cause`)."""

    __slots__ = ()
    stimulus: Cause

    @property
    def cause(self) -> str:
        """The id of the event that caused it."""
        return cause_text(self.stimulus)
