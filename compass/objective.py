"""A job's objective: its deadline, its priority, and what to do when it would miss it.

A client states it with each submission (``deadline_ms``, ``priority``, ``on_miss``); the
ingress checks it here, turns the deadline into an absolute time on its own clock, and every
message of the job carries what is left of it (a budget, never a clock reading). Sans-IO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from compass.errors import DeadlineExceeded, DeadlineUnreachable, InvalidInputs

__all__ = [
    "MAX_PRIORITY",
    "NO_OBJECTIVE",
    "ON_MISS",
    "Objective",
    "OnMiss",
    "check_objective",
    "outcome_of",
]

#: priorities run from 0 (the default) to this; a higher one runs first
MAX_PRIORITY = 9
#: what a job may ask for when it would miss its deadline: be dropped, or finish regardless
OnMiss = Literal["drop", "finish"]
ON_MISS: tuple[OnMiss, ...] = get_args(OnMiss)


@dataclass(frozen=True, slots=True)
class Objective:
    """What a job asks for: to be answered within ``deadline_s`` seconds of its submission
    (None: no deadline), at ``priority`` (higher runs first; 0 by default), and, with
    ``finish``, to be run to the end even once it cannot make its deadline (otherwise it is
    refused or dropped as soon as that is known)."""

    deadline_s: float | None = None
    priority: int = 0
    finish: bool = False

    @classmethod
    def from_wire(cls, body: Mapping[str, Any], time_scale: float = 1.0) -> Objective:
        """A submission's ``deadline_ms``, ``priority`` and ``on_miss``, checked. An emulated
        worker's clock runs ``1 / time_scale`` times as fast as real time, and so does the
        deadline it keeps."""
        deadline_ms = body.get("deadline_ms")
        priority = body.get("priority", 0)
        on_miss = body.get("on_miss", "drop")
        if deadline_ms is None and type(priority) is int and priority == 0 and on_miss == "drop":
            return NO_OBJECTIVE  # nothing asked (nearly every job): nothing to check
        check_objective(deadline_ms, priority, on_miss)
        if deadline_ms is None and not priority and on_miss == "drop":
            return NO_OBJECTIVE
        return cls(
            deadline_s=None if deadline_ms is None else deadline_ms / 1000.0 / time_scale,
            priority=priority,
            finish=on_miss == "finish",
        )


#: a job that asks for nothing: today's behaviour
NO_OBJECTIVE = Objective()


def check_objective(deadline_ms: object, priority: object, on_miss: object) -> None:
    """:class:`~compass.errors.InvalidInputs` unless ``deadline_ms`` is None or a number of
    milliseconds > 0, ``priority`` an integer from 0 to :data:`MAX_PRIORITY` and ``on_miss``
    one of :data:`ON_MISS`."""
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool)
        or not isinstance(deadline_ms, (int, float))
        or not 0 < deadline_ms < math.inf
    ):
        raise InvalidInputs(
            f"deadline_ms must be a number of milliseconds > 0, got {deadline_ms!r}"
        )
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not 0 <= priority <= MAX_PRIORITY
    ):
        raise InvalidInputs(
            f"priority must be an integer from 0 to {MAX_PRIORITY}, got {priority!r}"
        )
    if on_miss not in ON_MISS:
        raise InvalidInputs(f'on_miss must be "drop" or "finish", got {on_miss!r}')


def outcome_of(error: BaseException | None) -> str:
    """What became of an answered job: ``"ok"``; ``"unreachable"`` (refused at once: no plan
    met its deadline); ``"late"`` (it finished, past its deadline, and was answered
    :class:`DeadlineExceeded` with ``detail["late_ms"]``); ``"dropped"`` (a task would have
    started too late for it); or ``"failed"`` (any other error)."""
    if error is None:
        return "ok"
    if isinstance(error, DeadlineUnreachable):
        return "unreachable"
    if isinstance(error, DeadlineExceeded):
        late = isinstance(error.detail, dict) and "late_ms" in error.detail
        return "late" if late else "dropped"
    return "failed"
