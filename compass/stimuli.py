"""What a sans-IO core handled lately, so that a cause id seen in a log line can be looked up:
a bounded stimulus log (dask's ``stimulus_log`` and ``story``, in our own terms).

Both cores (the worker core, :class:`~compass.core.state.WorkerCore`, and the member table,
:class:`~compass.membership.table.MemberTable`) give every event they handle an id, its
``cause``, which every instruction or decision it produced carries. Each keeps the last events
it handled in a :class:`StimulusLog`: per event a :class:`Stimulus` with its cause, its time,
the event in words, what it decided in words, and what it is about (the job ids, peers and
models it and its decisions name). :meth:`StimulusLog.story` returns the entries about a key,
or caused by it, oldest first. The log is a ring of ``keep`` entries: the oldest goes when a
new one comes, so its memory is bounded whatever runs; ``keep=0`` keeps nothing (the
simulator's choice: it handles millions of events, and a story is read on a live worker).

An entry holds text, never the event itself: an event may carry a task's inputs or outputs,
and a log that held a thousand of them would hold their bytes too. Nothing here imports a
core; each core says how its events read (:mod:`compass.core.story`,
:mod:`compass.membership.story`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from compass.errors import ConfigError
from compass.records import record

__all__ = ["KEEP_STIMULI", "Stimulus", "StimulusLog", "check_keep"]

#: events a core's log keeps by default (a few hundred bytes each)
KEEP_STIMULI = 2048


@record
class Stimulus:
    """One event a core handled: its id (``cause``), when (``now``, the core's clock), the
    event in words, what the core decided (``did``, in order, in words) and what it is about
    (``about``: job ids, peer names, models; a name may repeat). A record (made for every
    event a core logs: :mod:`compass.records`)."""

    cause: str
    now: float
    event: str
    did: tuple[str, ...]
    about: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        """The entry as a ``story`` request answers it."""
        return {
            "cause": self.cause,
            "now": self.now,
            "event": self.event,
            "did": list(self.did),
            "about": sorted(set(self.about)),
        }


def check_keep(keep: object, what: str) -> int:
    """``keep`` as a log's bound, or a :class:`ConfigError` naming ``what`` if it is not an
    integer >= 0."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ConfigError(f"{what} must be an integer >= 0 (0: keep none), got {keep!r}")
    return keep


class StimulusLog:
    """The last ``keep`` events a core handled (0: none), oldest first; see the module
    docstring."""

    __slots__ = ("_entries", "keep")  # a core's log appends to _entries itself (hot path)

    def __init__(self, keep: int = KEEP_STIMULI) -> None:
        self.keep = check_keep(keep, "a stimulus log's keep")
        self._entries: deque[Stimulus] = deque(maxlen=keep)

    def add(self, entry: Stimulus) -> None:
        """Keep ``entry``, dropping the oldest past :attr:`keep`."""
        if self.keep:
            self._entries.append(entry)

    def story(self, key: str) -> list[Stimulus]:
        """The entries about ``key`` (a job id, a peer, a model) or caused by it (a cause id),
        oldest first."""
        return [e for e in self._entries if key in e.about or e.cause == key]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Stimulus]:
        return iter(self._entries)
