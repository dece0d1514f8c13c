"""The answers an ingress keeps for job keys, sans-IO: a client names each job (a key), and a
resubmission of a key already answered gets the kept answer instead of a second run.

What is kept is bounded three ways, so that a long-running ingress stays flat whatever its
jobs return: the number of keys (``max_keys``, the oldest forgotten first), the bytes of the
values kept (``max_bytes``: past it the oldest values are shed, their keys kept), and time
(``keep_s`` on the core's clock: a key answered longer ago is forgotten, and a resubmission of it
runs again). A resubmission of a key whose value was shed is answered with
:class:`~compass.errors.AnswerNotKept`: the job ran, and it is not run twice.

A job's answer is its sinks' value, unless the last of them reached the ingress after the job's
deadline (:func:`final_answer`). A deadline promises "answer within this many ms, or not at all"
(Clockwork's rule: a miss is an error, not a slow success); shedding drops most such jobs on the
way, but a task that overruns its profile can still finish one late. With ``on_miss="drop"``
(the default) it is answered :class:`~compass.errors.DeadlineExceeded`, whose
``detail["late_ms"]`` tells "finished late" from "dropped on the way"
(:func:`~compass.objective.outcome_of`); with ``on_miss="finish"``, the value, however late.
Every caller reads this one answer, so the Python clients, ``compass submit`` and the HTTP
front door agree.

An error is kept as its wire form (code, message, detail) and rebuilt for each answer: an
exception object raised to a waiter takes a traceback, whose frames hold that waiter's locals
(the job's inputs among them), and a kept error would keep them alive with it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, NamedTuple

from compass.core.jobs import IngressJob
from compass.core.stats import payload_bytes
from compass.errors import AnswerNotKept, CompassError, DeadlineExceeded, error_from_wire

__all__ = ["KEEP_ANSWERS", "KEEP_ANSWER_BYTES", "KEEP_ANSWER_S", "KeptAnswers", "final_answer"]

#: job keys an ingress remembers at most
KEEP_ANSWERS = 4096
#: bytes of answered values it keeps at most (past them, the oldest values are shed)
KEEP_ANSWER_BYTES = 64 << 20
#: seconds it remembers a key after answering it
KEEP_ANSWER_S = 300.0

#: a value shed for room: the key is known, its answer is not
_SHED = object()


def final_answer(job: IngressJob, now: float) -> tuple[Any, DeadlineExceeded | None]:
    """``job``'s answer once its sinks' outputs are all in (the last arrived at ``now``): its
    value, or, past its deadline with ``on_miss="drop"``, :class:`DeadlineExceeded`."""
    sinks = job.workflow.sinks
    value = job.outputs[sinks[0]] if len(sinks) == 1 else dict(job.outputs)
    if job.deadline is None or now <= job.deadline or job.objective.finish:
        return value, None
    late_ms = (now - job.deadline) * 1000.0
    deadline_ms = (job.deadline - job.submitted_at) * 1000.0
    return None, DeadlineExceeded(
        f"job {job.job_id} finished {late_ms:.1f} ms past its deadline of {deadline_ms:.1f} ms; "
        'on_miss="drop" answers no late result (on_miss="finish" would give it)',
        detail={"job_id": job.job_id, "late_ms": late_ms, "deadline_ms": deadline_ms},
    )


class _Kept(NamedTuple):
    at: float
    value: Any
    #: the error's wire form (code, message, detail), or None
    error: tuple[str, str, Any] | None
    nbytes: int


class KeptAnswers:
    """Answers of answered job keys; see the module docstring."""

    def __init__(
        self,
        max_keys: int = KEEP_ANSWERS,
        max_bytes: int = KEEP_ANSWER_BYTES,
        keep_s: float = KEEP_ANSWER_S,
    ) -> None:
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self.keep_s = keep_s
        #: key -> what was answered, oldest first
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        #: keys whose value is still kept, oldest first (the order values are shed in)
        self._valued: OrderedDict[str, None] = OrderedDict()
        #: bytes of the values kept
        self.bytes = 0
        #: at most the time the oldest kept key was answered (inf: none kept), so that
        #: :meth:`expire`, twice per job, looks at nothing while no key is due
        self._oldest_at = math.inf

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def values(self) -> int:
        """How many keys still have their value."""
        return len(self._valued)

    def put(self, key: str, value: Any, error: CompassError | None, now: float) -> None:
        """Keep the answer to ``key``, given at ``now``."""
        self.expire(now)
        self._drop(key)
        if now < self._oldest_at:
            self._oldest_at = now
        wire = None if error is None else (error.code, error.message, error.detail)
        nbytes = 0 if error is not None or value is None else payload_bytes(value)
        if nbytes > self.max_bytes:
            value, nbytes = _SHED, 0
        self._kept[key] = _Kept(now, value, wire, nbytes)
        if nbytes:
            self._valued[key] = None
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self._shed(next(iter(self._valued)))
        while len(self._kept) > self.max_keys:
            self._drop(next(iter(self._kept)))

    def get(self, key: str, now: float) -> tuple[Any, CompassError | None] | None:
        """The answer kept for ``key`` as (value, error), or None if none is kept; an error is a
        new exception each time."""
        self.expire(now)
        kept = self._kept.get(key)
        if kept is None:
            return None
        if kept.value is _SHED:
            return None, AnswerNotKept(
                f"job key {key!r} was answered {now - kept.at:.1f} s ago and its answer is no "
                f"longer kept (an ingress keeps {self.max_bytes >> 20} MiB of answers): the job "
                "is not run again",
                detail={"key": key},
            )
        if kept.error is not None:
            return None, error_from_wire(*kept.error)
        return kept.value, None

    def expire(self, now: float) -> None:
        """Forget the keys answered more than ``keep_s`` before ``now``."""
        if now - self._oldest_at <= self.keep_s:
            return  # the oldest was answered no earlier: none is due
        kept = self._kept
        while kept:
            key, oldest = next(iter(kept.items()))
            if now - oldest.at <= self.keep_s:
                self._oldest_at = oldest.at
                return
            self._drop(key)
        self._oldest_at = math.inf

    def _shed(self, key: str) -> None:
        kept = self._kept[key]
        del self._valued[key]
        self.bytes -= kept.nbytes
        self._kept[key] = kept._replace(value=_SHED, nbytes=0)

    def _drop(self, key: str) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None and key in self._valued:
            del self._valued[key]
            self.bytes -= kept.nbytes
