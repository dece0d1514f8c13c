"""What caused an instruction, named only when read.

Every instruction carries the id of the event that caused it (dask's stimulus ids). An event
with an id of its own (``cause``, a client's request, say) passes it on as it is; an anonymous
one is named ``kind:subject#n``, the ``n``-th event the core handled
(:func:`compass.worker.events.stimulus_id`, through the event's own
:meth:`~compass.worker.events.Named.stimulus_id`). Formatting that name for every event cost a
chain task more than any other part of the bookkeeping, and only traces, the logs of faults
and tests read it. So an instruction keeps a :data:`Cause`: the id itself, or the anonymous
event and its number, and :func:`cause_text` makes the name when it is read: the same text
every time, the same for the same events.
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["Cause", "cause_text"]

#: an event's own id, or an anonymous event and its number (named by :func:`cause_text`)
Cause: TypeAlias = "str | tuple[Any, int]"


def cause_text(cause: Cause) -> str:
    """The id ``cause`` stands for: itself, or the name of the anonymous event it holds."""
    if isinstance(cause, str):
        return cause
    # the event names itself (compass.worker.events.Named): the events import the lanes,
    # whose instructions read their causes through this module, so it cannot import them
    event, n = cause
    named = getattr(event, "stimulus_id", None)
    if named is None:
        raise AssertionError(f"not an event: {type(event).__name__}")
    text: str = named(n)
    return text
