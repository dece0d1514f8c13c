"""Counting placements: tasks just placed on a worker, before its heartbeats show them.

A :class:`Placement` is what the placing worker remembers of a task it sent somewhere;
:class:`PlacedCounts` adds placements to a snapshot's arrays (waits, free bytes, residency and,
for tasks that may batch, their model's batches), as the worker's own queue will count them.
The live view (:class:`~compass.sched.view.ClusterView`) and the simulator's cluster state
count them alike through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.sched.snapshot import BatchRows
from compass.workflow.dag import batch_scale

__all__ = ["BatchCurve", "PlacedCounts", "Placement"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """How a task placed on a worker may batch there: its batch curve on that worker (what a
    batch of 1, 2, ... costs, as multiples of one run) and the largest batch worth forming."""

    scale: tuple[float, ...]
    limit: int
    #: what its batches are counted under (:func:`~compass.workflow.dag.batch_key`; "": the
    #: task's model)
    key: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """A task just placed on a worker, as the placing worker's view counts it there until that
    worker's heartbeats show it: ``seconds`` of expected run, its model and the model's bytes
    (None and 0: none), the job it is a task of ("": none named, so never left out),
    ``curve``, how it may batch there (None: it does not), and its job's ``priority`` (it
    counts in the waits of its own level and those below)."""

    seconds: float
    model: str | None = None
    model_bytes: int = 0
    job: str = ""
    curve: BatchCurve | None = None
    priority: int = 0


class PlacedCounts:
    """A snapshot's arrays with placements not yet in any heartbeat counted in: the view and
    the simulator's state count them alike through this.

    ``wait`` and ``free`` are the caller's own copies, changed in place; ``resident`` and
    ``batches`` rows are copied the first time a placement changes them.
    """

    __slots__ = ("_batches", "_resident", "_rows", "_runs", "free", "wait")

    def __init__(
        self,
        wait: FloatArray,
        free: IntArray,
        resident: Mapping[str, BoolArray],
        batches: Mapping[str, BatchRows],
    ) -> None:
        self.wait = wait
        self.free = free
        self._resident = resident
        self._batches = batches
        self._rows: dict[str, BoolArray] = {}
        self._runs: dict[str, BatchRows] = {}

    def add(self, i: int, placed: Placement, waits: bool = True) -> None:
        """Count a task placed at the back of worker ``i``'s queue: its wait grows by the
        task's run, or only by its share of a batch (it has a ``curve``) where a batch of its
        model waits there with room; its model counts as coming. ``waits=False``: the waits
        are a higher priority's, which the task does not hold up; only its model counts."""
        model, seconds = placed.model, placed.seconds
        if model is not None and placed.curve is not None:
            seconds = self._batch(i, seconds, placed.curve.key or model, placed.curve)
        if waits:
            self.wait[i] += seconds
        if model is None:
            return
        row = self._rows.get(model)
        if row is None:
            row = self._resident.get(model)
            if row is not None and row[i]:
                return  # resident, loading or already counted as coming
            row = self._rows[model] = (
                np.zeros(len(self.wait), dtype=np.bool_) if row is None else row.copy()
            )
        elif row[i]:
            return
        row[i] = True
        self.free[i] -= placed.model_bytes

    def _batch(self, i: int, seconds: float, model: str, curve: BatchCurve) -> float:
        """The seconds a batchable task adds to worker ``i``'s queue, counted in ``model``'s
        batches there: as the queue counts it (:meth:`TaskQueue.batchable`), it joins a
        waiting batch with room, or leads the next one."""
        rows = self._runs.get(model)
        if rows is None:
            found = self._batches.get(model)
            n = len(self.wait)
            rows = self._runs[model] = (
                (np.zeros(n, dtype=np.int64), np.zeros(n))
                if found is None
                else (found[0].copy(), found[1].copy())
            )
        counts, starts = rows
        count = int(counts[i])
        counts[i] = count + 1
        if 0 < count < curve.limit:
            return seconds * (batch_scale(curve.scale, count + 1) - batch_scale(curve.scale, count))
        if count == 0:
            starts[i] = self.wait[i]
        return seconds

    def resident(self) -> Mapping[str, BoolArray]:
        """The residency rows, placed models included."""
        return {**self._resident, **self._rows} if self._rows else self._resident

    def batches(self) -> Mapping[str, BatchRows]:
        """The batch rows, placed batchable tasks included."""
        return {**self._batches, **self._runs} if self._runs else self._batches
