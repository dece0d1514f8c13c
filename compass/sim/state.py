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

A bounded view (:mod:`compass.sim.heard`): the ticks are a push gap apart (1 ms) and
``staleness_s`` is a link delay, which is how a watched candidate's pushes show it (each
change sent within a gap, a link away); :attr:`ClusterState.heard` then rewrites, in a
snapshot over a job's candidates, the rows of those the planner does not watch with what it
last heard of them, aged, and gives the residency each planner has heard (its candidates'
holders, and the whole view's residency that warming reads). The mesh has no ``heard``: every
peer as the last tick shows it.

Batches: each worker also publishes, per model, its queued tasks that may batch and when the
first of them is expected to start (:meth:`~compass.core.queue.TaskQueue.batchable`). The
live state keeps that start as an absolute time, so the published one, like the wait, is what
is left of it at the tick. Most of the time no worker has any: then a capture holds none and a
snapshot carries no arrays for them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.records import record
from compass.sched.placement import PlacedCounts, Placement
from compass.sched.snapshot import BatchRows, Members, ViewSnapshot, batch_rows
from compass.sim.heard import Heard, Told

__all__ = ["ClusterState"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]

#: per model: (queued batchable tasks, absolute expected start of the first of them)
_Batches = Mapping[str, tuple[int, float]]
_NONE: _Batches = MappingProxyType({})
_NO_ROWS: Mapping[str, BatchRows] = MappingProxyType({})
_NO_LEVELS: Mapping[int, float] = MappingProxyType({})


@dataclass(slots=True)
class _Capture:
    """The cluster's state from tick ``label`` on, until the next capture."""

    label: int
    queued: FloatArray
    run_end: FloatArray
    free: IntArray
    held: BoolArray
    #: each worker's batches (absolute starts); None: no worker had any
    batches: tuple[_Batches, ...] | None
    #: each worker's queued seconds per level above 0; None: no worker had any
    raised: tuple[Mapping[int, float], ...] | None
    #: ``held`` by model name, made when a whole view first reads it (None: not yet)
    rows: Mapping[str, BoolArray] | None = None


@record
class _Pending:
    worker: int
    task: Placement
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
        self.batches: list[_Batches] = [_NONE] * n
        self._batching: set[int] = set()  # workers with batches
        self.raised: list[Mapping[int, float]] = [_NO_LEVELS] * n
        self._raising: set[int] = set()  # workers with tasks queued above level 0
        self._now = 0.0
        self._dirty = False
        self._tick = 0
        self._captures: deque[_Capture] = deque([self._capture(0)])
        self._published: tuple[int, FloatArray, _Capture, Mapping[str, BatchRows]] | None = None
        #: (tick, priority) -> the published waits at that priority
        self._lifted: dict[tuple[int, int], FloatArray] = {}
        self._pending: list[list[_Pending]] = [[] for _ in range(n)]
        #: per viewer: no placement it counts stops counting while now <= the first and
        #: now < the second (the least ``ends`` and ``settles`` of them; infinite: none)
        self._holds: list[tuple[float, float]] = [(math.inf, math.inf)] * n
        #: when each worker's queue last changed (the time of the state it would send)
        self.changed_at: FloatArray = np.zeros(n)
        #: a bounded view: what each planner has heard of the others (None: the mesh, where
        #: every worker shows as the last tick published it)
        self.heard: Heard | None = None

    # -- live updates (the simulator calls these as things happen) ---------------------------

    def advance(self, now: float) -> None:
        """Time moves to ``now``: publish the state of the ticks passed since the last event.

        Call before applying the changes of an event at ``now``.
        """
        if self.heard is not None:
            self.heard.advance(now)
        self._now = now
        tick = int(now / self.heartbeat_s)
        if tick > self._tick:
            if self._dirty:
                # the state after the previous event holds from the tick that followed it
                self._captures.append(self._capture(self._tick + 1))
                self._dirty = False
            self._tick = tick

    def queue_changed(
        self,
        worker: int,
        queued_s: float,
        run_ends: Sequence[float],
        batches: _Batches | None = None,
        raised: Mapping[int, float] | None = None,
    ) -> None:
        """``worker``'s queue holds ``queued_s`` expected seconds, and its lanes run tasks
        expected to end at ``run_ends`` (the worker core's :class:`TaskQueue`, read after each
        event: the published wait equals the real one). ``batches``: per model, its queued
        tasks that may batch and the seconds, from the current event (:meth:`advance`'s
        ``now``), before the first of them starts (:meth:`TaskQueue.batchable`). ``raised``:
        per level above 0, the expected seconds of its queued tasks (:meth:`TaskQueue.raised_s`),
        for the waits of jobs above the lowest priority."""
        if raised:
            self.raised[worker] = raised
            self._raising.add(worker)
        elif worker in self._raising:
            self.raised[worker] = _NO_LEVELS
            self._raising.discard(worker)
        if batches:
            now = self._now
            self.batches[worker] = {m: (c, now + first) for m, (c, first) in batches.items()}
            self._batching.add(worker)
        elif worker in self._batching:
            self.batches[worker] = _NONE
            self._batching.discard(worker)
        row = self.run_end[worker]
        self.changed_at[worker] = self._now
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

    def note_placement(self, viewer: int, worker: int, placed: Placement, now: float) -> None:
        """``viewer`` just placed a task on peer ``worker``: count it in its view until a
        heartbeat received more than ``settle_s`` later, or until it would have run."""
        hb = self.heartbeat_s
        # heartbeats of tick k are received at k * hb + staleness
        k = math.floor((now + self.settle_s - self.staleness_s) / hb) + 1
        settles = k * hb + self.staleness_s
        ends = now + placed.seconds
        self._pending[viewer].append(_Pending(worker, placed, ends, settles))
        holds = self._holds[viewer]
        if ends < holds[0] or settles < holds[1]:
            self._holds[viewer] = (min(ends, holds[0]), min(settles, holds[1]))

    def told(self, worker: int, since: float = 0.0) -> Told:
        """``worker``'s live state as it would send it at ``since`` or, if it changed after,
        at its last change (a push carries the state after each change)."""
        return Told(
            max(float(self.changed_at[worker]), since), float(self.queued[worker]),
            tuple(self.run_end[worker].tolist()), int(self.free[worker]), self.batches[worker],
            self.raised[worker],
        )  # fmt: skip

    # -- views --------------------------------------------------------------------------------

    def snapshot(
        self,
        viewer: int,
        now: float,
        own_wait_s: float,
        own_batches: _Batches | None = None,
        without: str = "",
        priority: int = 0,
        among: IntpArray | None = None,
    ) -> ViewSnapshot:
        """What ``viewer`` sees at ``now``: peers as of the last tick at least ``staleness_s``
        old plus its own recent placements (but those of job ``without``, as
        :meth:`ClusterView.snapshot` leaves them out), itself exactly (``own_wait_s`` and
        ``own_batches``, seconds from ``now`` as :meth:`TaskQueue.batchable` gives them, from
        its queue). With ``priority`` above 0 the waits are those a task of that level sees
        (the running work and the queued tasks of its level and above), ``own_wait_s``
        included. ``among``: only the workers at these sorted, distinct positions, ``viewer``
        among them (a bounded view, :mod:`compass.sched.candidates`); the arrays are built
        over them alone (None: every worker)."""
        q, base_wait, cap, published = self._at(now)
        if priority > 0:
            base_wait = self._lifted_at(q, cap, priority)
        heard = self.heard
        if among is None:
            me = viewer
            wait = base_wait.copy()
            free = cap.free.copy()
            rows: Mapping[str, BoolArray]
            if heard is not None:  # residency as heard (what warming reads)
                known = heard.holders(viewer, now, range(len(self.models)))
                rows = dict(zip(self.models, known, strict=True))
            else:
                rows = self._rows(cap)
            names, positions, capacity = self.names, self.positions, self.capacity
            members = None
        else:
            shown = among.tolist()
            me = bisect_left(shown, viewer)
            if me >= len(shown) or shown[me] != viewer:
                raise ConfigError(f"a bounded view of worker {viewer} must include it")
            wait = base_wait[among]
            free = cap.free[among]
            # one copy of every model's row over the candidates; its own column exactly
            grid = cap.held[:, among]
            grid[:, me] = self.held[:, viewer]
            rows = dict(zip(self.models, grid, strict=True))
            every = self.names
            names = tuple([every[i] for i in shown])
            positions, capacity = None, self.capacity[among]
            members = Members(every, among)
        wait[me] = own_wait_s
        free[me] = self.free[viewer]
        resident: Mapping[str, BoolArray] = rows
        if among is None:
            own = self.held[:, viewer]
            seen = cap.held[:, viewer]
            if (own != seen).any():  # rows this snapshot changes, copied
                changed: dict[str, BoolArray] = {}
                for m in np.flatnonzero(own != seen):
                    name = self.models[m]
                    row = rows[name].copy()
                    row[me] = own[m]
                    changed[name] = row
                resident = {**rows, **changed}
        batches = published
        if published or own_batches:
            batches = self._own_batches(viewer, published, own_batches or _NONE)
        if among is not None and batches:
            batches = {m: (counts[among], starts[among]) for m, (counts, starts) in batches.items()}
        if heard is not None and among is not None:
            batches = self._as_heard(viewer, now, priority, among, wait, free, grid, batches)
        kept = self._counted(viewer, now)
        if kept:
            counts = PlacedCounts(wait, free, resident, batches)
            for p in kept:
                if without and p.task.job == without:
                    continue
                i = p.worker if among is None else _position(among, p.worker)
                if i >= 0:
                    counts.add(i, p.task, p.task.priority >= priority)
            np.maximum(free, 0, out=free)
            resident, batches = counts.resident(), counts.batches()
        return ViewSnapshot.from_arrays(
            names, wait, free, capacity, resident, positions=positions, batches=batches,
            members=members,
        )  # fmt: skip

    def holders(self, viewer: int, now: float, models: Sequence[str]) -> list[BoolArray]:
        """Per model of ``models``, where ``viewer`` sees it resident or loading at ``now``:
        the residency published at the tick a snapshot shows, its own exactly, and the
        workers it has just placed a task of the model on (as :meth:`snapshot` counts them)."""
        index = self.model_index
        coming = self._counted(viewer, now)
        heard = self.heard
        if heard is None:
            published = self._at(now)[2].held
            known = [published[index[m]] for m in models]
        else:  # copies, as heard
            known = heard.holders(viewer, now, [index[m] for m in models])
        out: list[BoolArray] = []
        for k, model in enumerate(models):
            m = index[model]
            row = known[k]
            own = bool(self.held[m, viewer])
            extra = [p.worker for p in coming if p.task.model == model and not row[p.worker]]
            if extra or bool(row[viewer]) != own:
                row = row if heard is not None else row.copy()
                row[viewer] = own
                row[extra] = True
            out.append(row)
        return out

    def _as_heard(
        self,
        viewer: int,
        now: float,
        priority: int,
        among: IntpArray,
        wait: FloatArray,
        free: IntArray,
        held: BoolArray,
        batches: Mapping[str, BatchRows],
    ) -> Mapping[str, BatchRows]:
        """Rewrite, in ``wait``, ``free``, ``held`` (models x candidates) and ``batches``
        (arrays over the candidates ``among``, copies), the columns of those ``viewer`` does
        not watch at ``now`` with what it last heard of them (:mod:`compass.sim.heard`); the
        batches, changed or not."""
        heard = self.heard
        assert heard is not None, "a view as heard needs what was heard"
        changed: dict[str, BatchRows] | None = None
        shown = among.tolist()
        for j in heard.unwatched(viewer, among, now):
            peer = shown[j]
            if peer == viewer:
                continue
            told = heard.told(viewer, peer, now)
            wait[j] = told.aged(now, priority)
            free[j] = told.free
            held[:, j] = heard.residency(viewer, peer, now)
            if batches or told.batches:
                if changed is None:
                    changed = dict(batches)
                for counts, _ in changed.values():
                    counts[j] = 0
                for model, (count, first) in told.batches.items():
                    row = changed.get(model)
                    if row is None:
                        k = len(among)
                        row = changed[model] = (np.zeros(k, dtype=np.int64), np.zeros(k))
                    row[0][j] = count
                    row[1][j] = first - told.sent  # as the heartbeat said it, not aged
        if changed is None:
            return batches
        return {m: row for m, row in changed.items() if row[0].any()}

    def _own_batches(
        self, viewer: int, published: Mapping[str, BatchRows], own: _Batches
    ) -> dict[str, BatchRows]:
        """``published`` with ``viewer``'s own entries replaced by ``own`` (rows copied only
        where they change; models no worker has left out)."""
        out = dict(published)
        n = len(self.names)
        for model in published.keys() | own.keys():
            count, first = own.get(model, (0, 0.0))
            row = published.get(model)
            if (
                row is not None
                and row[0][viewer] == count
                and (not count or row[1][viewer] == first)
            ):
                continue
            if row is None:
                counts, starts = np.zeros(n, dtype=np.int64), np.zeros(n)
            else:
                counts, starts = row[0].copy(), row[1].copy()
            counts[viewer] = count
            starts[viewer] = first
            if counts.any():
                out[model] = (counts, starts)
            else:
                out.pop(model, None)
        return out

    def _counted(self, viewer: int, now: float) -> list[_Pending]:
        """The placements ``viewer`` still counts at ``now``, those that stopped dropped:
        looked through only when one may have stopped (``now`` never goes back)."""
        pending = self._pending[viewer]
        holds = self._holds[viewer]
        if now <= holds[0] and now < holds[1]:
            return pending
        kept = [p for p in pending if now <= p.ends and now < p.settles]
        self._pending[viewer] = kept
        self._holds[viewer] = (
            min((p.ends for p in kept), default=math.inf),
            min((p.settles for p in kept), default=math.inf),
        )
        return kept

    def pending(self, viewer: int) -> int:
        """Placements ``viewer`` counts (including expired ones not yet pruned)."""
        return len(self._pending[viewer])

    # -- internals ----------------------------------------------------------------------------

    def _capture(self, label: int) -> _Capture:
        held = self.held.copy()
        held.setflags(write=False)
        batches = tuple(self.batches) if self._batching else None
        raised = tuple(self.raised) if self._raising else None
        return _Capture(
            label, self.queued.copy(), self.run_end.copy(), self.free.copy(), held, batches, raised
        )  # fmt: skip

    def _rows(self, cap: _Capture) -> Mapping[str, BoolArray]:
        """``cap``'s residency by model (read-only rows), made once per capture: only a whole
        view of the mesh reads it."""
        if cap.rows is None:
            held = cap.held
            cap.rows = MappingProxyType({m: held[i] for i, m in enumerate(self.models)})
        return cap.rows

    def _lifted_at(self, q: int, cap: _Capture, priority: int) -> FloatArray:
        """The published waits at tick ``q`` of a task of ``priority`` (above 0): what runs
        before it, the running tasks and the queued ones of its level and above."""
        wait = self._lifted.get((q, priority))
        if wait is None:
            if len(self._lifted) > 64:
                self._lifted.clear()
            at = max(q, 0) * self.heartbeat_s
            wait = np.maximum(cap.run_end - at, 0.0).sum(axis=1)
            if cap.raised is not None:
                for i, levels in enumerate(cap.raised):
                    wait[i] += sum(s for level, s in levels.items() if level >= priority)
            wait.setflags(write=False)
            self._lifted[(q, priority)] = wait
        return wait

    def _at(self, now: float) -> tuple[int, FloatArray, _Capture, Mapping[str, BatchRows]]:
        """The published tick for ``now``, its waits, its capture and its batches (starts in
        seconds from the tick), cached per tick."""
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
        self._published = (q, wait, cap, _frozen_rows(cap.batches, at))
        return self._published


def _position(index: IntpArray, worker: int) -> int:
    """Where ``worker`` is in the sorted ``index`` (-1: not there)."""
    i = int(np.searchsorted(index, worker))
    return i if i < len(index) and index[i] == worker else -1


def _frozen_rows(batches: tuple[_Batches, ...] | None, at: float) -> Mapping[str, BatchRows]:
    """The published batches at tick time ``at`` (:func:`batch_rows`), read-only."""
    if batches is None:
        return _NO_ROWS
    rows = batch_rows(batches, since=at)
    for counts, starts in rows.values():
        counts.setflags(write=False)
        starts.setflags(write=False)
    return MappingProxyType(rows)
