"""Step batching for real models: one step function over every job a batch holds now.

A generator task runs one job: each ``yield`` ends one of its steps. A model that generates
(an LLM writing tokens, a translator, a speech decoder) is far faster per job when one forward
pass advances many jobs at once, and the jobs of a busy worker start and end at different
times. So a task may instead be a *step function* over the jobs of a batch, marked with
:func:`step_batch`::

    @flow.task(model="lm", steps=64, step_ms=8, batch=16, batch_item=0.05)
    @compass.step_batch
    def generate(model, seats):
        for seat in seats:
            if seat.state is None:  # its first step: the job's inputs, as keywords
                seat.state = model.start(seat.inputs["prompt"])
        tokens = model.step([seat.state for seat in seats])  # one forward pass for all
        return [compass.Done(s.state.text) if s.state.ended else tok
                for s, tok in zip(seats, tokens)]

The worker calls it once a step with the seats taken now, a :class:`Seat` for each job (its
``inputs`` are the keywords a plain task would get; resources come once, as keywords), and
it returns one item per seat, in order:

- a partial output: the seat's step ended (streamed to its caller, or to a streamed edge, as a
  generator's ``yield`` is), and it stays for the next step;
- :class:`Done` ``(value)``: the seat's job has its final output, and it leaves the batch;
- an ``Exception`` instance: that seat's job fails alone, and it leaves.

A raise fails every job seated at that step. Between two calls, jobs join (the worker core's
decision: a task of the same function that would otherwise wait for a lane takes a free seat,
up to ``batch`` and the batch curve) and leave (done, failed, or stopped because their job
ended); ``state`` is the function's own for its seat, kept from one call to the next.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["Done", "Seat", "is_step_batch", "step_batch"]

F = TypeVar("F", bound=Callable[..., Any])

#: the attribute :func:`step_batch` sets on a step function
_MARK = "__compass_step_batch__"


def step_batch(fn: F) -> F:
    """Mark ``fn`` as a step function over a batch's seats (see the module docstring)."""
    setattr(fn, _MARK, True)
    return fn


def is_step_batch(fn: Callable[..., Any] | None) -> bool:
    """Whether ``fn`` (or the function a ``functools.partial`` wraps) is a step function."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn is not None and bool(getattr(fn, _MARK, False))


@dataclass(eq=False, slots=True)
class Seat:
    """One job's seat in a step batch: ``inputs``, the keywords a plain task of it would get;
    ``state``, the step function's own for this job (None before its first step); ``step``,
    the steps it has done; ``job``, its job's id."""

    inputs: dict[str, Any]
    job: str
    state: Any = None
    step: int = 0


@dataclass(frozen=True, slots=True)
class Done:
    """What a step function returns for a seat whose job is done: its final ``value``."""

    value: Any = field(default=None)
