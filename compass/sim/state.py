"""The simulated cluster's shared state: every worker's queue, lanes and cache as numpy arrays,
what each worker's view shows of them, and the snapshots the planner reads.

A real worker publishes a heartbeat every ``heartbeat_s`` and its peers plan on the last one
they received (:class:`~compass.sched.view.ClusterView`). Here every worker publishes at the
same ticks ``k * heartbeat_s``, and a view at time ``now`` shows the peers as of the last tick
at least ``staleness_s`` old. Its own entry is exact, and the tasks it has just placed on peers
count until a heartbeat received ``settle_s`` after the placement reflects them, or until they
would have run (as :meth:`ClusterView.note_placement` does).

Cost: the live state is updated in place, O(1) per change. The state between two events is
constant, so it is copied (O(workers)) at most once per tick, and only when it changed: when
the first event of a later tick arrives, before that event changes anything. A queue wait
depends on time through the running tasks' remaining seconds, so the copy keeps their expected
end times and the published wait is computed at the tick it stands for, once per tick.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.sched.view import ViewSnapshot

__all__ = ["ClusterState"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(slots=True)
class _Capture:
    """The cluster's state from tick ``label`` on, until the next capture."""

    label: int
    queued: FloatArray
    run_end: FloatArray
    free: IntArray
    held: BoolArray
    rows: Mapping[str, BoolArray]


@dataclass(frozen=True, slots=True)
class _Placement:
    worker: int
    seconds: float
    model: str | None
    model_bytes: int
    ends: float  # counted while now <= ends: placed at + seconds
    settles: float  # counted while now < settles: the first heartbeat that reflects it


class ClusterState:
    """Live per-worker state, published copies at heartbeat ticks, per-viewer placements.

    ``names`` must be sorted (a worker's index is its position, as in a
    :class:`~compass.sched.view.ViewSnapshot`); ``models`` is every model a cache can hold.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        models: Sequence[str],
        capacity_bytes: Sequence[int],
        *,
        lanes: int,
        heartbeat_s: float,
        staleness_s: float,
        settle_s: float,
    ) -> None:
        if list(names) != sorted(names):
            raise ConfigError("ClusterState needs the worker names sorted")
        if not heartbeat_s > 0 or not staleness_s >= 0 or not settle_s >= 0:
            raise ConfigError(
                f"need heartbeat_s > 0, staleness_s >= 0 and settle_s >= 0, got "
                f"{heartbeat_s!r}, {staleness_s!r}, {settle_s!r}"
            )
        n = len(names)
        self.names = names
        self.positions: Mapping[str, int] = MappingProxyType({w: i for i, w in enumerate(names)})
        self.models = tuple(models)
        self.model_index = {m: i for i, m in enumerate(self.models)}
        self.heartbeat_s = float(heartbeat_s)
        self.staleness_s = float(staleness_s)
        self.settle_s = float(settle_s)
        self.capacity: IntArray = np.array(capacity_bytes, dtype=np.int64)
        self.capacity.setflags(write=False)
        # live state, changed in place
        self.queued: FloatArray = np.zeros(n)
        self.run_end: FloatArray = np.zeros((n, lanes))  # 0 on an idle lane: no time left
        self.free: IntArray = self.capacity.copy()
        self.held: BoolArray = np.zeros((len(self.models), n), dtype=np.bool_)
        self._dirty = False
        self._tick = 0
        self._captures: deque[_Capture] = deque([self._capture(0)])
        self._published: tuple[int, FloatArray, _Capture] | None = None
        self._pending: list[list[_Placement]] = [[] for _ in range(n)]

    # -- live updates (the simulator calls these as things happen) ---------------------------

    def advance(self, now: float) -> None:
        """Time moves to ``now``: publish the state of the ticks passed since the last event.

        Call before applying the changes of an event at ``now``.
        """
        tick = int(now / self.heartbeat_s)
        if tick > self._tick:
            if self._dirty:
                # the state after the previous event holds from the tick that followed it
                self._captures.append(self._capture(self._tick + 1))
                self._dirty = False
            self._tick = tick

    def queue_changed(self, worker: int, queued_s: float, run_ends: Sequence[float]) -> None:
        """``worker``'s queue holds ``queued_s`` expected seconds, and its lanes run tasks
        expected to end at ``run_ends`` (the worker core's :class:`TaskQueue`, read after each
        event: the published wait equals the real one)."""
        row = self.run_end[worker]
        self.queued[worker] = queued_s
        row[:] = 0.0  # an idle lane: no time left
        row[: len(run_ends)] = run_ends
        self._dirty = True

    def cache_changed(
        self, worker: int, loading: str, evicted: Sequence[str], free_bytes: int
    ) -> None:
        """``worker`` began loading ``loading`` after evicting ``evicted``."""
        index = self.model_index
        self.held[index[loading], worker] = True
        for model in evicted:
            self.held[index[model], worker] = False
        self.free[worker] = free_bytes
        self._dirty = True

    def note_placement(
        self,
        viewer: int,
        worker: int,
        seconds: float,
        model: str | None,
        model_bytes: int,
        now: float,
    ) -> None:
        """``viewer`` just placed a task of ``seconds`` on peer ``worker``: count it in its view
        until a heartbeat received more than ``settle_s`` later, or until it would have run."""
        hb = self.heartbeat_s
        # heartbeats of tick k are received at k * hb + staleness
        k = math.floor((now + self.settle_s - self.staleness_s) / hb) + 1
        settles = k * hb + self.staleness_s
        self._pending[viewer].append(
            _Placement(worker, seconds, model, model_bytes, now + seconds, settles)
        )

    # -- views --------------------------------------------------------------------------------

    def snapshot(self, viewer: int, now: float, own_wait_s: float) -> ViewSnapshot:
        """What ``viewer`` sees at ``now``: peers as of the last tick at least ``staleness_s``
        old plus its own recent placements, itself exactly (``own_wait_s`` from its queue)."""
        _, base_wait, cap = self._at(now)
        wait = base_wait.copy()
        wait[viewer] = own_wait_s
        free = cap.free.copy()
        free[viewer] = self.free[viewer]
        rows: dict[str, BoolArray] = {}  # rows this snapshot changes, copied
        own = self.held[:, viewer]
        seen = cap.held[:, viewer]
        if not np.array_equal(own, seen):
            for m in np.flatnonzero(own != seen):
                name = self.models[m]
                row = cap.rows[name].copy()
                row[viewer] = own[m]
                rows[name] = row
        pending = self._pending[viewer]
        if pending:
            kept = [p for p in pending if now <= p.ends and now < p.settles]
            self._pending[viewer] = kept
            for p in kept:
                i = p.worker
                wait[i] += p.seconds
                if p.model is None:
                    continue
                row = rows.get(p.model, cap.rows[p.model])
                if row[i]:
                    continue  # resident, loading or already counted as coming
                if p.model not in rows:
                    row = rows[p.model] = row.copy()
                row[i] = True
                free[i] -= p.model_bytes
            if kept:
                np.maximum(free, 0, out=free)
        resident = {**cap.rows, **rows} if rows else cap.rows
        return ViewSnapshot.from_arrays(
            self.names, wait, free, self.capacity, resident, positions=self.positions
        )

    def pending(self, viewer: int) -> int:
        """Placements ``viewer`` counts (including expired ones not yet pruned)."""
        return len(self._pending[viewer])

    # -- internals ----------------------------------------------------------------------------

    def _capture(self, label: int) -> _Capture:
        held = self.held.copy()
        held.setflags(write=False)
        rows = MappingProxyType({m: held[i] for i, m in enumerate(self.models)})
        return _Capture(
            label, self.queued.copy(), self.run_end.copy(), self.free.copy(), held, rows
        )

    def _at(self, now: float) -> tuple[int, FloatArray, _Capture]:
        """The published tick for ``now``, its waits and its capture (cached per tick)."""
        q = math.floor((now - self.staleness_s) / self.heartbeat_s)
        published = self._published
        if published is not None and published[0] == q:
            return published
        captures = self._captures
        while len(captures) > 1 and captures[1].label <= q:
            captures.popleft()
        cap = captures[0]
        at = max(q, 0) * self.heartbeat_s
        wait = cap.queued + np.maximum(cap.run_end - at, 0.0).sum(axis=1)
        wait.setflags(write=False)
        self._published = (q, wait, cap)
        return self._published
