"""The live cluster view: each worker's picture of every worker's queue, cached models and memory.

:class:`ClusterView` folds heartbeats (:class:`~compass.sched.heartbeat.Heartbeat`) in, counts
the tasks this worker has just placed on peers until their heartbeats reflect them
(:mod:`compass.sched.placement`), and hands out immutable snapshots
(:class:`~compass.sched.snapshot.ViewSnapshot`).

The view keeps its arrays up to date in place, one heartbeat at a time, and hands them to a
snapshot without copying; the first write after that copies them (copy on write). Planning
many jobs between heartbeats therefore costs no copies at all.

Batches: a worker also reports, per model, how many queued tasks may batch and when the first
of them is expected to start (:meth:`~compass.core.queue.TaskQueue.batchable`), so the
planner can send a task of that model where it joins their batch. Most of the time no worker
has any, and then a snapshot holds no arrays for them at all.

The heartbeat record, snapshots and placement counting live in modules of their own; their
names are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.sched.heartbeat import Heartbeat
from compass.sched.placement import BatchCurve, PlacedCounts, Placement
from compass.sched.snapshot import BatchRows, ViewSnapshot, batch_rows, heartbeat_arrays

__all__ = [
    "BatchCurve",
    "BatchRows",
    "ClusterView",
    "Heartbeat",
    "PlacedCounts",
    "Placement",
    "ViewSnapshot",
    "batch_rows",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class _Pending:
    placed_at: float
    task: Placement

    @property
    def ends(self) -> float:
        """When the task would have run: no longer counted after."""
        return self.placed_at + self.task.seconds


class ClusterView:
    """One worker's view of the cluster, itself included.

    Its own state (:meth:`update_self`) is always exact. A peer's comes from heartbeats
    (:meth:`apply_heartbeat`), and tasks this worker just placed on a peer
    (:meth:`note_placement`) count in that peer's wait until a heartbeat received more than
    ``settle_s`` after the placement (default: two heartbeat intervals) must reflect them, or
    until the task would have run. That keeps jobs planned back to back from piling onto the
    one peer that looked idle at the last heartbeat.
    """

    def __init__(
        self, self_name: str, *, heartbeat_s: float = 0.010, settle_s: float | None = None
    ) -> None:
        if not isinstance(self_name, str) or not self_name:
            raise ConfigError(f"ClusterView needs this worker's name, got {self_name!r}")
        if not heartbeat_s > 0:
            raise ConfigError(f"ClusterView heartbeat_s must be > 0, got {heartbeat_s!r}")
        self.self_name = self_name
        self.settle_s = 2.0 * heartbeat_s if settle_s is None else float(settle_s)
        if not self.settle_s >= 0:
            raise ConfigError(f"ClusterView settle_s must be >= 0, got {settle_s!r}")
        self._states: dict[str, Heartbeat] = {}
        self._received: dict[str, float] = {}
        self._pending: dict[str, list[_Pending]] = {}
        self._names: tuple[str, ...] = ()
        self._positions: Mapping[str, int] = MappingProxyType({})
        self._wait: FloatArray = np.zeros(0)
        #: when each worker's state was received, by position (inf: this worker, never aged)
        self._got: FloatArray = np.zeros(0)
        self._free: IntArray = np.zeros(0, dtype=np.int64)
        self._cap: IntArray = np.zeros(0, dtype=np.int64)
        self._resident: dict[str, BoolArray] = {}
        self._batches: dict[str, BatchRows] = {}
        self._shared = False  # the arrays belong to a snapshot: copy before writing
        self._base: ViewSnapshot | None = None
        self._placed: ViewSnapshot | None = None  # the base plus counted placements
        self._next_expiry = math.inf
        #: whether a peer's wait is not zero, so that aging may change it (None: not known
        #: since the waits last changed)
        self._peers_wait: bool | None = None

    # -- updates ----------------------------------------------------------------------------

    def update_self(self, state: Heartbeat) -> None:
        """This worker's own state: applied unconditionally, and it clears this worker's
        counted placements (its own queue already holds them)."""
        if state.name != self.self_name:
            raise ConfigError(
                f"update_self got the state of {state.name!r}; this is {self.self_name!r}"
            )
        if self._pending.pop(self.self_name, None) is not None:
            self._placed = None
        if state == self._states.get(self.self_name):
            # as it was (a worker's state for each job it plans, between jobs that leave no
            # queue): the arrays and the snapshot of them stand
            return
        self._store(state)

    def apply_heartbeat(self, state: Heartbeat, now: float) -> bool:
        """Fold in a peer's heartbeat received at ``now``; False (ignored) unless it is newer
        than the last one applied, by ``(incarnation, seq)``, or if it claims to be this worker.

        A newer incarnation wins whatever its ``seq`` (a restarted worker counts from 1 again);
        an older one is stale, whatever its ``seq``."""
        name = state.name
        if name == self.self_name:
            return False
        old = self._states.get(name)
        if old is not None and (state.incarnation, state.seq) <= (old.incarnation, old.seq):
            return False
        self._received[name] = now
        pending = self._pending.get(name)
        if pending:
            # a heartbeat received this long after a placement reflects it
            kept = [p for p in pending if now - p.placed_at <= self.settle_s]
            if kept:
                self._pending[name] = kept
            else:
                del self._pending[name]
        self._store(state)
        self._got[self._positions[name]] = now  # never shared with a snapshot: no copy
        return True

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        """Count a task just placed on ``worker`` (see the class docstring and
        :class:`PlacedCounts`).

        A worker the view does not know is ignored: the plan will be adjusted when it fails.
        """
        if worker not in self._positions:
            return
        self._pending.setdefault(worker, []).append(_Pending(now, placed))
        self._next_expiry = min(self._next_expiry, now + placed.seconds)
        self._placed = None

    def remove(self, worker: str) -> None:
        """Forget a peer (it left or was declared dead); its next heartbeat re-adds it."""
        if worker == self.self_name:
            raise ConfigError(f"a worker cannot remove itself ({worker!r}) from its view")
        if worker not in self._states:
            return
        del self._states[worker]
        self._received.pop(worker, None)
        self._pending.pop(worker, None)
        self._rebuild()

    # -- queries ----------------------------------------------------------------------------

    def __contains__(self, worker: object) -> bool:
        return worker in self._states

    def __len__(self) -> int:
        return len(self._states)

    def names(self) -> tuple[str, ...]:
        """Every worker in the view, sorted."""
        return self._names

    def get(self, worker: str) -> Heartbeat | None:
        """The last state applied for ``worker``."""
        return self._states.get(worker)

    def age_s(self, worker: str, now: float) -> float:
        """Seconds since ``worker``'s last applied heartbeat (0 for this worker)."""
        if worker == self.self_name and worker in self._states:
            return 0.0
        received = self._received.get(worker)
        if received is None:
            raise ConfigError(f"worker {worker!r} is not in the view of {self.self_name!r}")
        return max(0.0, now - received)

    def pending(self, worker: str) -> int:
        """How many placements on ``worker`` are still counted."""
        return len(self._pending.get(worker, ()))

    def snapshot(
        self, now: float, without: str = "", priority: int = 0, *, aged: bool = False
    ) -> ViewSnapshot:
        """An immutable picture at ``now``, counting placements not yet settled or run, except
        those of job ``without``, with the waits a task of ``priority`` would see (the work
        that runs before it: the running tasks and the queued ones of its level and above).

        A job re-planned or adjusted must not see its own tasks as other work queued ahead of
        them: a task counted on the worker it was planned for would wait behind itself there,
        with its model counted as already coming.

        ``aged``: each peer's reported wait less the time since it was received (at least 0):
        its queue has run that long since, as far as this worker knows. For a view whose
        peers do not report every few milliseconds (a bounded view: a peer sends its state
        to the planners watching it, on change)."""
        snap = self._snapshot(now, without, aged)
        if priority <= 0:
            return snap
        # not cached: the worker's own state, applied before every snapshot, would clear it
        wait = np.fromiter(
            (self._states[n].wait_at(priority) for n in self._names),
            dtype=np.float64,
            count=len(self._names),
        )
        if aged:
            wait = self._age(wait, now)
        for worker, placements in self._pending.items():
            i = self._positions[worker]
            for p in placements:
                if p.task.priority >= priority and not (without and p.task.job == without):
                    wait[i] += p.task.seconds
        return snap.with_wait(wait)

    def _aging(self) -> bool:
        """Whether aging may change a wait: some peer's is not zero."""
        if self._peers_wait is None:
            me = self._positions.get(self.self_name, -1)
            self._peers_wait = any(w != 0.0 for i, w in enumerate(self._wait.tolist()) if i != me)
        return self._peers_wait

    def _age(self, wait: FloatArray, now: float) -> FloatArray:
        """``wait`` less each worker's time since its state was received, at least 0."""
        return np.maximum(wait - np.maximum(now - self._got, 0.0), 0.0)

    def _snapshot(self, now: float, without: str, aged: bool = False) -> ViewSnapshot:
        self._expire(now)
        if aged:
            # not cached: it changes with now; unless no peer waits (aging leaves a zero wait
            # zero, and this worker's own is never aged): the same waits, not copied
            base = self._frozen_base()
            if self._aging():
                base = base.with_wait(self._age(base.wait_s, now))
            return self._with_placements(base, without) if self._pending else base
        base = self._frozen_base()
        if not self._pending:
            return base
        if without and any(p.task.job == without for ps in self._pending.values() for p in ps):
            return self._with_placements(base, without)
        if self._placed is None:
            self._placed = self._with_placements(base)
        return self._placed

    def _frozen_base(self) -> ViewSnapshot:
        """The heartbeats' picture, without placements: the view's arrays, shared until the
        next write."""
        if self._base is None:
            self._base = ViewSnapshot._frozen(
                self._names,
                self._wait,
                self._free,
                self._cap,
                self._resident,
                self._positions,
                self._batches,
            )
            self._shared = True
        return self._base

    # -- internals --------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        # a placed task has run by placement time + its length: stop counting it
        if now <= self._next_expiry:
            return
        self._placed = None
        done = [w for w, ps in self._pending.items() if any(now > p.ends for p in ps)]
        for worker in done:
            kept = [p for p in self._pending[worker] if now <= p.ends]
            if kept:
                self._pending[worker] = kept
            else:
                del self._pending[worker]
        self._next_expiry = min(
            (p.ends for ps in self._pending.values() for p in ps),
            default=math.inf,
        )

    def _with_placements(self, base: ViewSnapshot, without: str = "") -> ViewSnapshot:
        counts = PlacedCounts(
            base.wait_s.copy(), base.free_bytes.copy(), base.resident, base.batches
        )
        for worker, placements in self._pending.items():
            i = self._positions[worker]
            for p in placements:
                if not (without and p.task.job == without):
                    counts.add(i, p.task)
        free = counts.free
        np.maximum(free, 0, out=free)
        return ViewSnapshot._frozen(
            base.names,
            counts.wait,
            free,
            base.capacity_bytes,
            counts.resident(),
            self._positions,
            counts.batches(),
        )

    def _store(self, state: Heartbeat) -> None:
        old = self._states.get(state.name)
        self._states[state.name] = state
        self._base = None
        self._placed = None
        if state.name != self.self_name:
            self._peers_wait = None
        if old is None:
            self._rebuild()
            return
        if self._shared:
            self._wait = self._wait.copy()
            self._free = self._free.copy()
            self._cap = self._cap.copy()
            self._resident = {m: row.copy() for m, row in self._resident.items()}
            self._batches = {m: (c.copy(), s.copy()) for m, (c, s) in self._batches.items()}
            self._shared = False
        i = self._positions[state.name]
        self._wait[i] = state.wait_s
        self._free[i] = state.free_bytes
        self._cap[i] = state.capacity_bytes
        before = old.models | old.loading
        after = state.models | state.loading
        if before != after:
            for model in before ^ after:
                row = self._resident.get(model)
                if row is None:
                    row = self._resident[model] = np.zeros(len(self._names), dtype=np.bool_)
                row[i] = model in after
        if old.batches or state.batches:
            self._store_batches(i, old.batches, state.batches)

    def _store_batches(
        self,
        i: int,
        before: Mapping[str, tuple[int, float]],
        after: Mapping[str, tuple[int, float]],
    ) -> None:
        n = len(self._names)
        for model in before.keys() | after.keys():
            count, first = after.get(model, (0, 0.0))
            row = self._batches.get(model)
            if row is None:
                if not count:
                    continue
                row = self._batches[model] = (np.zeros(n, dtype=np.int64), np.zeros(n))
            row[0][i] = count
            row[1][i] = first
            if not count and not row[0].any():
                del self._batches[model]  # no worker has any: keep snapshots free of it

    def _rebuild(self) -> None:
        names = tuple(sorted(self._states))
        self._names = names
        self._positions = MappingProxyType({n: i for i, n in enumerate(names)})
        ordered = [self._states[n] for n in names]
        self._wait, self._free, self._cap, self._resident = heartbeat_arrays(ordered)
        self._got = np.fromiter(
            (self._received.get(n, math.inf) for n in names), dtype=np.float64, count=len(names)
        )
        self._batches = batch_rows([s.batches for s in ordered])
        self._shared = False
        self._base = None
        self._placed = None
        self._peers_wait = None
