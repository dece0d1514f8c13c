"""The streamed jobs a worker is the ingress of, while their callers read them: what the
dashboard and ``compass_streams_in_flight`` show.

Each stream counts the partial outputs that reached the ingress (``made``) and those its caller
took (``read``): a caller slower than the steps shows as ``made`` ahead of ``read``, by at most
the windows (compass/worker/windows.py). Sans-IO: the ingress's reader
(:func:`compass.worker.streaming.stream_job`) opens, counts and closes them. The table holds
one entry per stream being read, so it is bounded as the jobs in flight are.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

__all__ = ["StreamShown", "StreamsInFlight"]


@dataclass(slots=True)
class StreamShown:
    """One streamed job being read: its workflow, when it was submitted (wall clock), its job
    id (known from its first partial output), its partial outputs made and read, and its time
    to first output."""

    workflow: str
    started: float
    job: str = ""
    made: int = 0
    read: int = 0
    first_output_ms: float | None = None

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "job": self.job,
            "workflow": self.workflow,
            "age_s": round(now - self.started, 3),
            "made": self.made,
            "read": self.read,
            "first_output_ms": self.first_output_ms,
        }


class StreamsInFlight:
    """The streams being read at this ingress."""

    def __init__(self) -> None:
        self._open: dict[int, StreamShown] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._open)

    def open(self, workflow: str, started: float) -> tuple[int, StreamShown]:
        """A stream of ``workflow`` submitted at wall clock ``started``: its key and entry."""
        key = next(self._keys)
        shown = self._open[key] = StreamShown(workflow, started)
        return key, shown

    def close(self, key: int) -> None:
        self._open.pop(key, None)

    def rows(self, now: float, limit: int) -> list[dict[str, Any]]:
        """The oldest ``limit`` streams, as JSON (``now``: the wall clock)."""
        return [shown.to_json(now) for shown in itertools.islice(self._open.values(), limit)]
