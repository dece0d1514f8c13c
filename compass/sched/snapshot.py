"""Snapshots of the cluster view: immutable numpy arrays over the workers.

A :class:`ViewSnapshot` is what every policy plans on: the workers sorted by name (a worker's
index is its position), their waits, free and total cache bytes, where each model is resident
or coming, and the batches queued per model, so the planner evaluates all workers for a task
with a few vector operations. The live view (:class:`~compass.sched.view.ClusterView`) and the
simulator's cluster state hand them out; tests and benchmarks build them from heartbeats
(:meth:`ViewSnapshot.build`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.records import record
from compass.sched.heartbeat import Heartbeat

__all__ = ["BatchRows", "Members", "ViewSnapshot", "batch_rows", "heartbeat_arrays"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]

#: per model: (queued batchable tasks, seconds before the first of them starts), per worker
BatchRows = tuple[IntArray, FloatArray]

_NO_ROWS: Mapping[str, BatchRows] = MappingProxyType({})

#: ``ndarray.setflags`` with ``write`` passed by position, which numpy accepts (its stubs
#: declare it keyword-only): the keyword costs twice the call, and a snapshot (several per
#: job) makes an array per model read-only
_set_writeable = cast("Callable[[npt.NDArray[Any], bool], None]", np.ndarray.setflags)


@dataclass(frozen=True, slots=True, eq=False)
class Members:
    """Every worker a view knows of (``names``, sorted), when a snapshot shows only some of
    them: ``index`` holds each shown worker's position in ``names`` (sorted, read-only). A
    planner's job-independent cost tables are built once over the members and indexed down
    (:meth:`~compass.sched.cost.CostCache.for_view`)."""

    names: tuple[str, ...]
    index: IntpArray


# made for every job (an aged one besides, in a bounded view): a record, frozen by convention
# (:mod:`compass.records`)
@record(eq=False)
class ViewSnapshot:
    """An immutable picture of the cluster, array-based.

    ``names`` is sorted and a worker's index is its position. ``wait_s``, ``free_bytes`` and
    ``capacity_bytes`` are read-only arrays over the workers; ``resident[model]`` is a read-only
    boolean array, true where the model is resident, loading or on its way (a task just placed
    there needs it). Waits already count the tasks recently placed on each worker.
    ``batches[model]`` (:meth:`batched`): read-only ``(counts, start_s)`` arrays, the queued
    tasks of ``model`` that may batch on each worker and the seconds before the first of them
    is expected to start (like ``wait_s``: from now); only for models some worker reports.
    ``members``: set when the snapshot shows only some of the workers the view knows of
    (:meth:`take`; a bounded view, :mod:`compass.sched.candidates`); None: it shows them all.
    """

    names: tuple[str, ...]
    wait_s: FloatArray
    free_bytes: IntArray
    capacity_bytes: IntArray
    resident: Mapping[str, BoolArray]
    positions: Mapping[str, int]
    min_capacity_bytes: int
    batches: Mapping[str, BatchRows] = field(default_factory=lambda: _NO_ROWS)
    members: Members | None = None

    @classmethod
    def build(cls, states: Sequence[Heartbeat] | Iterable[Heartbeat]) -> ViewSnapshot:
        """A snapshot straight from worker states (tests, the simulator). Names must differ."""
        by_name: dict[str, Heartbeat] = {}
        for state in states:
            if state.name in by_name:
                raise ConfigError(f"ViewSnapshot.build: worker {state.name!r} appears twice")
            by_name[state.name] = state
        names = tuple(sorted(by_name))
        ordered = [by_name[n] for n in names]
        wait, free, cap, resident = heartbeat_arrays(ordered)
        batches = batch_rows([s.batches for s in ordered])
        return cls._frozen(names, wait, free, cap, resident, batches=batches)

    @classmethod
    def from_arrays(
        cls,
        names: tuple[str, ...],
        wait_s: FloatArray,
        free_bytes: IntArray,
        capacity_bytes: IntArray,
        resident: Mapping[str, BoolArray],
        *,
        positions: Mapping[str, int] | None = None,
        batches: Mapping[str, BatchRows] | None = None,
        members: Members | None = None,
    ) -> ViewSnapshot:
        """A snapshot over arrays the caller built (the simulator, which keeps its cluster
        state in arrays already). ``names`` must be sorted; the arrays are indexed like it.

        Nothing is copied: the arrays (and ``resident``'s and ``batches``' rows) are made
        read-only, so the caller must not reuse them for writing. ``positions``, when given,
        must map each name to its index (pass the same mapping every time to avoid rebuilding
        it). ``batches`` and ``members``: see the class docstring (None: no worker reports
        any; the snapshot shows every worker).
        """
        n = len(names)
        if len(wait_s) != n or len(free_bytes) != n or len(capacity_bytes) != n:
            raise ConfigError(
                f"ViewSnapshot.from_arrays: {n} names but arrays of lengths "
                f"{len(wait_s)}, {len(free_bytes)}, {len(capacity_bytes)}"
            )
        if batches:
            for model, (counts, start) in batches.items():
                if len(counts) != n or len(start) != n:
                    raise ConfigError(
                        f"ViewSnapshot.from_arrays: {n} names but batches[{model!r}] has "
                        f"arrays of lengths {len(counts)}, {len(start)}"
                    )
        if members is not None and len(members.index) != n:
            raise ConfigError(
                f"ViewSnapshot.from_arrays: {n} names but members.index of length "
                f"{len(members.index)}"
            )
        return cls._frozen(
            names, wait_s, free_bytes, capacity_bytes, resident, positions, batches, members
        )

    @classmethod
    def _frozen(
        cls,
        names: tuple[str, ...],
        wait: FloatArray,
        free: IntArray,
        cap: IntArray,
        resident: Mapping[str, BoolArray],
        positions: Mapping[str, int] | None = None,
        batches: Mapping[str, BatchRows] | None = None,
        members: Members | None = None,
    ) -> ViewSnapshot:
        _freeze(wait, free, resident, batches)
        _set_writeable(cap, False)
        if positions is None:
            positions = MappingProxyType({n: i for i, n in enumerate(names)})
        return cls(
            names,
            wait,
            free,
            cap,
            MappingProxyType(dict(resident)),
            positions,
            _least(cap),
            MappingProxyType(dict(batches)) if batches else _NO_ROWS,
            members,
        )

    def counted(
        self,
        wait: FloatArray,
        free: IntArray,
        resident: Mapping[str, BoolArray],
        batches: Mapping[str, BatchRows],
    ) -> ViewSnapshot:
        """The same workers with the waits, free bytes, residency and batches given (indexed
        like :attr:`names`, made read-only as :meth:`from_arrays` makes them): a view that
        counts placements on this one (:mod:`compass.sched.adjust`). Its names, capacities,
        positions and members are this view's, so it skips :meth:`from_arrays`' checks and the
        least capacity (a fan-out builds one per sibling it places)."""
        _freeze(wait, free, resident, batches)
        return ViewSnapshot(
            self.names,
            wait,
            free,
            self.capacity_bytes,
            MappingProxyType(dict(resident)),
            self.positions,
            self.min_capacity_bytes,
            MappingProxyType(dict(batches)) if batches else _NO_ROWS,
            self.members,
        )

    def with_wait(self, wait: FloatArray) -> ViewSnapshot:
        """The same picture with the waits ``wait`` (indexed like :attr:`names`; made
        read-only, so the caller must not write it again). Built field by field rather than
        with :func:`dataclasses.replace`, which looks every field up by name (about 290
        bytecode instructions, three times this): a bounded view ages every snapshot's waits."""
        _set_writeable(wait, False)
        return ViewSnapshot(
            self.names,
            wait,
            self.free_bytes,
            self.capacity_bytes,
            self.resident,
            self.positions,
            self.min_capacity_bytes,
            self.batches,
            self.members,
        )

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.positions

    def index(self, name: str) -> int:
        """Position of worker ``name``; :class:`ConfigError` if the view lacks it."""
        i = self.positions.get(name)
        if i is None:
            raise ConfigError(f"worker {name!r} is not in this view ({len(self.names)} workers)")
        return i

    def holds(self, model: str) -> BoolArray:
        """Where ``model`` is resident, loading or on its way (all false for an unseen model)."""
        found = self.resident.get(model)
        if found is None:
            return np.zeros(len(self.names), dtype=np.bool_)
        return found

    def subset(self, names: Iterable[str]) -> ViewSnapshot:
        """The same picture over ``names`` only (in this view's order; a name twice counts
        once): every array and row indexed down to them. :class:`ConfigError` if the view
        lacks one."""
        wanted = set(names)
        missing = wanted - self.positions.keys()
        if missing:
            raise ConfigError(
                f"ViewSnapshot.subset: {', '.join(sorted(missing))} not in this view "
                f"({len(self.names)} workers)"
            )
        return self.take(np.array(sorted(self.positions[n] for n in wanted), dtype=np.intp))

    def take(self, index: IntpArray) -> ViewSnapshot:
        """The same picture over the workers at the sorted, distinct positions ``index``; its
        :class:`Members` are this view's (or this view's members, for a view that is itself
        part of one)."""
        names = tuple(self.names[i] for i in index.tolist())
        batches = {
            model: (counts[index], start[index]) for model, (counts, start) in self.batches.items()
        }
        if self.members is None:
            within = Members(self.names, index.copy())
        else:
            within = Members(self.members.names, self.members.index[index])
        within.index.setflags(write=False)
        return ViewSnapshot._frozen(
            names,
            self.wait_s[index],
            self.free_bytes[index],
            self.capacity_bytes[index],
            {model: row[index] for model, row in self.resident.items()},
            batches=batches,
            members=within,
        )

    def batched(self, model: str) -> BatchRows | None:
        """``(counts, start_s)`` of ``model``'s queued batchable tasks over the workers (see
        the class docstring); None when no worker reports any."""
        return self.batches.get(model) if self.batches else None


def _freeze(
    wait: FloatArray,
    free: IntArray,
    resident: Mapping[str, BoolArray],
    batches: Mapping[str, BatchRows] | None,
) -> None:
    """Make a snapshot's arrays read-only."""
    _set_writeable(wait, False)
    _set_writeable(free, False)
    for row in resident.values():
        _set_writeable(row, False)
    if batches:
        for counts, start in batches.values():
            _set_writeable(counts, False)
            _set_writeable(start, False)


#: below this many workers the least capacity is taken over a list: a bounded view shows about
#: ten, where ``min(tolist())`` costs half the ufunc's reduce (which wins from about 20)
_FEW_WORKERS = 16


def _least(capacity: IntArray) -> int:
    """The least of ``capacity`` (0 when empty)."""
    n = len(capacity)
    if n < _FEW_WORKERS:
        return min(capacity.tolist()) if n else 0
    # the ufunc itself: ndarray.min's Python wrapper costs twice as much
    return int(np.minimum.reduce(capacity))


def heartbeat_arrays(
    states: Sequence[Heartbeat],
) -> tuple[FloatArray, IntArray, IntArray, dict[str, BoolArray]]:
    n = len(states)
    wait = np.fromiter((s.wait_s for s in states), dtype=np.float64, count=n)
    free = np.fromiter((s.free_bytes for s in states), dtype=np.int64, count=n)
    cap = np.fromiter((s.capacity_bytes for s in states), dtype=np.int64, count=n)
    resident: dict[str, BoolArray] = {}
    for i, state in enumerate(states):
        for model in state.models | state.loading:
            row = resident.get(model)
            if row is None:
                row = resident[model] = np.zeros(n, dtype=np.bool_)
            row[i] = True
    return wait, free, cap, resident


def batch_rows(
    per_worker: Sequence[Mapping[str, tuple[int, float]]], since: float = 0.0
) -> dict[str, BatchRows]:
    """Per model, the workers' batch counts and the seconds from ``since`` before the first of
    each starts (none below 0), as arrays over the workers (``per_worker``'s order). Starts
    are seconds from when each state was taken with ``since`` 0 (heartbeats), or absolute
    times with ``since`` the time they are read at (the simulator)."""
    rows: dict[str, BatchRows] = {}
    n = len(per_worker)
    for i, batches in enumerate(per_worker):
        for model, (count, first) in batches.items():
            row = rows.get(model)
            if row is None:
                row = rows[model] = (np.zeros(n, dtype=np.int64), np.zeros(n))
            row[0][i] = count
            row[1][i] = max(0.0, first - since)
    return rows
