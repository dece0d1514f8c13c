"""The cluster view: each worker's picture of every worker's queue, cached models and memory.

:class:`WorkerState` is what a heartbeat carries. :class:`ClusterView` folds heartbeats in,
counts the tasks this worker has just placed on peers until their heartbeats reflect them, and
hands out immutable :class:`ViewSnapshot` objects: numpy arrays over the workers (sorted by
name, the index of a worker is its position), so the planner evaluates all workers for a task
with a few vector operations.

The view keeps its arrays up to date in place, one heartbeat at a time, and hands them to a
snapshot without copying; the first write after that copies them (copy on write). Planning
many jobs between heartbeats therefore costs no copies at all.

Batches: a worker also reports, per model, how many queued tasks may batch and when the first
of them is expected to start (:meth:`~compass.worker.queue.TaskQueue.batchable`), so the
planner can send a task of that model where it joins their batch. Most of the time no worker
has any, and then a snapshot holds no arrays for them at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError, ProtocolError
from compass.objective import MAX_PRIORITY
from compass.workflow.dag import batch_scale

__all__ = [
    "BatchCurve",
    "BatchRows",
    "ClusterView",
    "PlacedCounts",
    "Placement",
    "ViewSnapshot",
    "WorkerState",
    "batch_rows",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: per model: (queued batchable tasks, seconds before the first of them starts), per worker
BatchRows = tuple[IntArray, FloatArray]

_NO_BATCHES: Mapping[str, tuple[int, float]] = MappingProxyType({})
_NO_ROWS: Mapping[str, BatchRows] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One worker's state as its heartbeat reports it.

    ``wait_s``: expected seconds before a task queued now would start (the sum of the expected
    times of the tasks ahead of it, spread over its lanes); ``models``: models resident in its
    GPU cache; ``loading``: models being loaded; ``free_bytes`` / ``capacity_bytes``: its cache;
    ``seq``: increases with every heartbeat the worker sends, so a stale one is recognised;
    ``h2d_bytes_per_s``: its measured host-to-device bandwidth (0: not measured yet), so peers
    estimate model fetches on a slower or faster GPU from what it measured; ``incarnation``:
    the worker's SWIM incarnation (see :mod:`compass.worker.membership`), raised each time it
    rejoins after being declared dead, so ``(incarnation, seq)`` orders its heartbeats even
    across a restart that starts ``seq`` again (0 where the sender predates it). ``batches``:
    per model, ``(queued tasks that may batch, seconds before the first of them is expected to
    start)``, counted like ``wait_s`` from when the state was taken (empty where the sender
    predates it, or where nothing queued batches). ``lifted_s``: the waits of a task of
    priority 1, 2, ... (:meth:`wait_at`), the last one holding for every level above it (empty
    where the sender predates it: ``wait_s`` stands in).
    """

    name: str
    wait_s: float
    models: frozenset[str]
    free_bytes: int
    capacity_bytes: int
    lanes: int = 1
    lanes_busy: int = 0
    seq: int = 0
    loading: frozenset[str] = frozenset()
    h2d_bytes_per_s: float = 0.0
    incarnation: int = 0
    #: not hashed (a mapping is not hashable); compared like every other field
    batches: Mapping[str, tuple[int, float]] = field(
        default_factory=lambda: _NO_BATCHES, hash=False
    )
    lifted_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"WorkerState.name must be a non-empty string, got {self.name!r}")
        if not self.wait_s >= 0:
            raise ConfigError(f"worker {self.name!r}: wait_s must be >= 0, got {self.wait_s!r}")
        if self.capacity_bytes < 0 or not 0 <= self.free_bytes <= self.capacity_bytes:
            raise ConfigError(
                f"worker {self.name!r}: need 0 <= free_bytes ({self.free_bytes}) <= "
                f"capacity_bytes ({self.capacity_bytes})"
            )
        if not self.h2d_bytes_per_s >= 0:
            raise ConfigError(
                f"worker {self.name!r}: h2d_bytes_per_s must be >= 0, got {self.h2d_bytes_per_s!r}"
            )
        if self.incarnation < 0:
            raise ConfigError(
                f"worker {self.name!r}: incarnation must be >= 0, got {self.incarnation!r}"
            )
        if self.lanes < 1 or not 0 <= self.lanes_busy <= self.lanes:
            raise ConfigError(
                f"worker {self.name!r}: need lanes >= 1 and 0 <= lanes_busy <= lanes, "
                f"got {self.lanes_busy}/{self.lanes}"
            )
        if self.batches is not _NO_BATCHES:
            object.__setattr__(self, "batches", self._checked_batches(self.batches))
        if self.lifted_s:
            lifted = self.lifted_s
            if len(lifted) > MAX_PRIORITY or not all(
                isinstance(w, int | float) and not isinstance(w, bool) and 0 <= w < math.inf
                for w in lifted
            ):
                raise ConfigError(
                    f"worker {self.name!r}: lifted_s must be at most {MAX_PRIORITY} waits "
                    f">= 0, got {lifted!r}"
                )
            object.__setattr__(self, "lifted_s", tuple(float(w) for w in lifted))

    def wait_at(self, priority: int) -> float:
        """Expected seconds before a task of ``priority`` queued now would start: the running
        work and the queued tasks of its level and above (``wait_s`` at level 0)."""
        lifted = self.lifted_s
        if priority <= 0 or not lifted:
            return self.wait_s
        return lifted[min(priority, len(lifted)) - 1]

    def _checked_batches(self, batches: object) -> Mapping[str, tuple[int, float]]:
        if not isinstance(batches, Mapping):
            raise ConfigError(
                f"worker {self.name!r}: batches must map model names to (count, seconds), "
                f"got {type(batches).__name__}"
            )
        if not batches:
            return _NO_BATCHES
        checked: dict[str, tuple[int, float]] = {}
        for model, entry in batches.items():
            if not isinstance(model, str) or not model:
                raise ConfigError(
                    f"worker {self.name!r}: a batches key must be a model name, got {model!r}"
                )
            count, first = entry if isinstance(entry, tuple | list) and len(entry) == 2 else (0, 0)
            if (
                not isinstance(count, int)
                or isinstance(count, bool)
                or count < 1
                or not isinstance(first, int | float)
                or isinstance(first, bool)
                or not 0 <= first < math.inf
            ):
                raise ConfigError(
                    f"worker {self.name!r}: batches[{model!r}] must be (count >= 1, seconds >= 0), "
                    f"got {entry!r}"
                )
            checked[model] = (count, float(first))
        return MappingProxyType(checked)

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-able dict (short keys: heartbeats are frequent)."""
        return {
            "n": self.name,
            "w": self.wait_s,
            "m": sorted(self.models),
            "f": self.free_bytes,
            "c": self.capacity_bytes,
            "l": self.lanes,
            "b": self.lanes_busy,
            "s": self.seq,
            "ld": sorted(self.loading),
            "h": self.h2d_bytes_per_s,
            "i": self.incarnation,
            # optional: {model: [count, seconds]}, left out when nothing queued batches
            **({"q": {m: list(v) for m, v in self.batches.items()}} if self.batches else {}),
            **({"wl": list(self.lifted_s)} if self.lifted_s else {}),
        }

    @classmethod
    def from_wire(cls, data: object) -> WorkerState:
        """Rebuild a state from :meth:`to_wire`'s form; :class:`ProtocolError` if malformed."""
        if not isinstance(data, Mapping):
            raise ProtocolError(f"worker state: expected a map, got {type(data).__name__}")
        try:
            name, wait, models = data["n"], data["w"], data["m"]
            free, cap, lanes = data["f"], data["c"], data["l"]
            busy, seq, loading = data["b"], data["s"], data["ld"]
        except KeyError as exc:
            raise ProtocolError(f"worker state: missing field {exc.args[0]!r}") from None
        h2d = data.get("h", 0.0)  # absent from a worker that predates it
        incarnation = data.get("i", 0)  # likewise
        batches = data.get("q", _NO_BATCHES)  # likewise, and left out when empty
        lifted = data.get("wl", ())  # likewise
        if not isinstance(lifted, list | tuple):
            raise ProtocolError("worker state: field 'wl' must be a list of waits")
        if not isinstance(batches, Mapping):
            raise ProtocolError("worker state: field 'q' must map model names to [count, seconds]")
        ints = {"f": free, "c": cap, "l": lanes, "b": busy, "s": seq, "i": incarnation}
        for key, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ProtocolError(f"worker state: field {key!r} must be an integer")
        for key, number in (("w", wait), ("h", h2d)):
            if not isinstance(number, int | float) or isinstance(number, bool):
                raise ProtocolError(f"worker state: field {key!r} must be a number")
        for key, names in (("m", models), ("ld", loading)):
            if not isinstance(names, list | tuple) or not all(isinstance(m, str) for m in names):
                raise ProtocolError(f"worker state: field {key!r} must be a list of model names")
        try:
            return cls(
                name=name,
                wait_s=float(wait),
                models=frozenset(models),
                free_bytes=free,
                capacity_bytes=cap,
                lanes=lanes,
                lanes_busy=busy,
                seq=seq,
                loading=frozenset(loading),
                h2d_bytes_per_s=float(h2d),
                incarnation=incarnation,
                batches=batches,
                lifted_s=tuple(lifted),
            )
        except ConfigError as exc:
            raise ProtocolError(f"worker state: {exc.message}") from None


@dataclass(frozen=True, slots=True, eq=False)
class ViewSnapshot:
    """An immutable picture of the cluster, array-based.

    ``names`` is sorted and a worker's index is its position. ``wait_s``, ``free_bytes`` and
    ``capacity_bytes`` are read-only arrays over the workers; ``resident[model]`` is a read-only
    boolean array, true where the model is resident, loading or on its way (a task just placed
    there needs it). Waits already count the tasks recently placed on each worker.
    ``batches[model]`` (:meth:`batched`): read-only ``(counts, start_s)`` arrays, the queued
    tasks of ``model`` that may batch on each worker and the seconds before the first of them
    is expected to start (like ``wait_s``: from now); only for models some worker reports.
    """

    names: tuple[str, ...]
    wait_s: FloatArray
    free_bytes: IntArray
    capacity_bytes: IntArray
    resident: Mapping[str, BoolArray]
    positions: Mapping[str, int]
    min_capacity_bytes: int
    batches: Mapping[str, BatchRows] = field(default_factory=lambda: _NO_ROWS)

    @classmethod
    def build(cls, states: Sequence[WorkerState] | Iterable[WorkerState]) -> ViewSnapshot:
        """A snapshot straight from worker states (tests, the simulator). Names must differ."""
        by_name: dict[str, WorkerState] = {}
        for state in states:
            if state.name in by_name:
                raise ConfigError(f"ViewSnapshot.build: worker {state.name!r} appears twice")
            by_name[state.name] = state
        names = tuple(sorted(by_name))
        ordered = [by_name[n] for n in names]
        wait, free, cap, resident = _arrays(ordered)
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
    ) -> ViewSnapshot:
        """A snapshot over arrays the caller built (the simulator, which keeps its cluster
        state in arrays already). ``names`` must be sorted; the arrays are indexed like it.

        Nothing is copied: the arrays (and ``resident``'s and ``batches``' rows) are made
        read-only, so the caller must not reuse them for writing. ``positions``, when given,
        must map each name to its index (pass the same mapping every time to avoid rebuilding
        it). ``batches``: see the class docstring (None: no worker reports any).
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
        return cls._frozen(names, wait_s, free_bytes, capacity_bytes, resident, positions, batches)

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
    ) -> ViewSnapshot:
        for array in (wait, free, cap, *resident.values()):
            array.setflags(write=False)
        if batches:
            for counts, start in batches.values():
                counts.setflags(write=False)
                start.setflags(write=False)
        if positions is None:
            positions = MappingProxyType({n: i for i, n in enumerate(names)})
        return cls(
            names=names,
            wait_s=wait,
            free_bytes=free,
            capacity_bytes=cap,
            resident=MappingProxyType(dict(resident)),
            positions=positions,
            min_capacity_bytes=int(cap.min()) if len(names) else 0,
            batches=MappingProxyType(dict(batches)) if batches else _NO_ROWS,
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

    def batched(self, model: str) -> BatchRows | None:
        """``(counts, start_s)`` of ``model``'s queued batchable tasks over the workers (see
        the class docstring); None when no worker reports any."""
        return self.batches.get(model) if self.batches else None


def _arrays(
    states: Sequence[WorkerState],
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


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """How a task placed on a worker may batch there: its batch curve on that worker (what a
    batch of 1, 2, ... costs, as multiples of one run) and the largest batch worth forming."""

    scale: tuple[float, ...]
    limit: int


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
            seconds = self._batch(i, seconds, model, placed.curve)
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
        self._states: dict[str, WorkerState] = {}
        self._received: dict[str, float] = {}
        self._pending: dict[str, list[_Pending]] = {}
        self._names: tuple[str, ...] = ()
        self._positions: Mapping[str, int] = MappingProxyType({})
        self._wait: FloatArray = np.zeros(0)
        self._free: IntArray = np.zeros(0, dtype=np.int64)
        self._cap: IntArray = np.zeros(0, dtype=np.int64)
        self._resident: dict[str, BoolArray] = {}
        self._batches: dict[str, BatchRows] = {}
        self._shared = False  # the arrays belong to a snapshot: copy before writing
        self._base: ViewSnapshot | None = None
        self._placed: ViewSnapshot | None = None  # the base plus counted placements
        #: priority -> the peers' waits at that level (:meth:`WorkerState.wait_at`)
        self._lifted: dict[int, FloatArray] = {}
        self._next_expiry = math.inf

    # -- updates ----------------------------------------------------------------------------

    def update_self(self, state: WorkerState) -> None:
        """This worker's own state: applied unconditionally, and it clears this worker's
        counted placements (its own queue already holds them)."""
        if state.name != self.self_name:
            raise ConfigError(
                f"update_self got the state of {state.name!r}; this is {self.self_name!r}"
            )
        self._pending.pop(self.self_name, None)
        self._store(state)

    def apply_heartbeat(self, state: WorkerState, now: float) -> bool:
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

    def get(self, worker: str) -> WorkerState | None:
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

    def snapshot(self, now: float, without: str = "", priority: int = 0) -> ViewSnapshot:
        """An immutable picture at ``now``, counting placements not yet settled or run, except
        those of job ``without``, with the waits a task of ``priority`` would see (the work
        that runs before it: the running tasks and the queued ones of its level and above).

        A job re-planned or adjusted must not see its own tasks as other work queued ahead of
        them: a task counted on the worker it was planned for would wait behind itself there,
        with its model counted as already coming."""
        snap = self._snapshot(now, without)
        if priority <= 0:
            return snap
        wait = self._lifted.get(priority)
        if wait is None:
            wait = self._lifted[priority] = np.fromiter(
                (self._states[n].wait_at(priority) for n in self._names),
                dtype=np.float64,
                count=len(self._names),
            )
        wait = wait.copy()
        for worker, placements in self._pending.items():
            i = self._positions[worker]
            for p in placements:
                if p.task.priority >= priority and not (without and p.task.job == without):
                    wait[i] += p.task.seconds
        wait.setflags(write=False)
        return replace(snap, wait_s=wait)

    def _snapshot(self, now: float, without: str) -> ViewSnapshot:
        self._expire(now)
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
        if not self._pending:
            return self._base
        if without and any(p.task.job == without for ps in self._pending.values() for p in ps):
            return self._with_placements(self._base, without)
        if self._placed is None:
            self._placed = self._with_placements(self._base)
        return self._placed

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

    def _store(self, state: WorkerState) -> None:
        old = self._states.get(state.name)
        self._states[state.name] = state
        self._base = None
        self._placed = None
        self._lifted.clear()
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
        self._wait, self._free, self._cap, self._resident = _arrays(ordered)
        self._batches = batch_rows([s.batches for s in ordered])
        self._shared = False
        self._base = None
        self._placed = None
        self._lifted.clear()
