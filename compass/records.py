"""The dataclass of the values made for every task or job on a hot path: frozen to the type
checker, not at run time.

A frozen dataclass sets each field in ``__init__`` through ``object.__setattr__`` (its own
``__setattr__`` refuses), about 8 bytecode instructions and a C call per field against 3
instructions for a plain store. The events, instructions and messages the worker core makes
for every task (:class:`~compass.core.events.Received`,
:class:`~compass.core.events.TaskDone`, :class:`~compass.core.events.Send`,
:class:`~compass.core.lanes.RunTask`, :class:`~compass.core.messages.TaskMsg`) have 3 to
13 fields each, and that setting was the largest part of what a chain task cost over 388075e
(docs/RESULTS.md, "Measured again, and cut"); a worker's own state
(:class:`~compass.sched.heartbeat.Heartbeat`) and the view's snapshots
(:class:`~compass.sched.snapshot.ViewSnapshot`) are made for every job.

So :func:`record` makes a slotted dataclass that mypy checks as frozen (``frozen_default``,
PEP 681): assigning a field is a type error, and every field is set once, in ``__init__`` (a
``__post_init__`` that normalises one uses ``object.__setattr__``, as in a frozen class). At
run time nothing refuses an assignment: they are immutable by convention, checked statically.
Equality and hashing are those of a frozen dataclass: by value (``unsafe_hash``), or by
identity with ``eq=False``. A frozen dataclass cannot inherit from one of these: subclass
them with :func:`record` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, dataclass_transform, overload

__all__ = ["record"]

_T = TypeVar("_T")


@overload
def record(cls: type[_T], /) -> type[_T]: ...


@overload
def record(*, eq: bool = True) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[Any] | None = None, /, *, eq: bool = True) -> Any:
    """``cls`` as a slotted dataclass, frozen by convention (see the module docstring);
    ``eq=False``: compared and hashed by identity."""

    def make(cls: type[Any]) -> type[Any]:
        if eq:
            return dataclass(slots=True, unsafe_hash=True)(cls)
        return dataclass(slots=True, eq=False)(cls)

    return make if cls is None else make(cls)
