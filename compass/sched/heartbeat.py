"""What a heartbeat carries: one worker's queue wait, cached models, cache bytes and lanes.

:class:`Heartbeat` is checked when it is made (a bad value is a :class:`ConfigError`) and when
it is read off the wire (:meth:`Heartbeat.from_wire`: a :class:`ProtocolError`). The view
(:mod:`compass.sched.view`) folds heartbeats in; snapshots (:mod:`compass.sched.snapshot`) are
built from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import field
from types import MappingProxyType
from typing import Any

from compass.errors import ConfigError, ProtocolError
from compass.objective import MAX_PRIORITY
from compass.records import record
from compass.workflow.frequencies import Likely
from compass.workflow.profile import Learned

__all__ = [
    "DEGRADED_WAIT_S",
    "MAX_LEARNED",
    "MAX_RECENT",
    "NO_BATCHES",
    "CacheHeld",
    "Heartbeat",
    "LaneLoad",
    "Serving",
]

#: what a degraded worker (too many stuck task threads) adds to the wait it reports: no plan's
#: horizon reaches it, so planners place nothing there, GPU or host lane
DEGRADED_WAIT_S = 1e6

#: the most learned task times one state may carry (more is a malformed message); a worker
#: sends at most :data:`~compass.workflow.profile.LEARNED_SPREAD`
MAX_LEARNED = 64

#: the most models a state may name as recently used (more is a malformed message): a worker
#: sends the ones its queue needs first, then the most recently used
#: (:func:`~compass.core.replica.recent_models`)
MAX_RECENT = 64

#: a heartbeat without batches (shared: most heartbeats have none)
NO_BATCHES: Mapping[str, tuple[int, float]] = MappingProxyType({})


@record(eq=False)
class LaneLoad:
    """A worker's lanes as its own state reports them (:meth:`Heartbeat.own`): the fields of
    :class:`Heartbeat` of the same names."""

    wait_s: float
    lifted_s: tuple[float, ...]
    lanes: int
    lanes_busy: int
    batches: Mapping[str, tuple[int, float]]


@record(eq=False)
class CacheHeld:
    """A worker's cache as its own state reports it (:meth:`Heartbeat.own`): the fields of
    :class:`Heartbeat` of the same names."""

    models: frozenset[str]
    loading: frozenset[str]
    free_bytes: int
    capacity_bytes: int
    h2d_bytes_per_s: float
    recent: frozenset[str] = frozenset()


@record(eq=False)
class Serving:
    """What a worker serves with, as its own state reports it (:meth:`Heartbeat.own`): the
    fields of :class:`Heartbeat` of the same names."""

    version: str
    learned: tuple[Learned, ...]
    choices: tuple[Likely, ...] = ()


# made for every job (a worker's own state): a record, frozen by convention
# (:mod:`compass.records`)
@record
class Heartbeat:
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
    where the sender predates it: ``wait_s`` stands in). ``version``: the version of its app's
    weights (:mod:`compass.workflow.versions`; "" where unknown), planners keep workers of
    another version apart; ``learned``: the task times it learned itself, at most
    :data:`MAX_LEARNED` (``Profiles.learned_of``), which its peers' planners take in.
    ``recent``: the models its running and queued tasks need and those a task began with there
    lately (at most :data:`MAX_RECENT`; empty where the sender predates it, or said nothing):
    the cluster's hot models are their union (:func:`compass.elastic.replicate.hot_models`).
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
    batches: Mapping[str, tuple[int, float]] = field(default_factory=lambda: NO_BATCHES, hash=False)
    lifted_s: tuple[float, ...] = ()
    version: str = ""
    learned: tuple[Learned, ...] = ()
    #: the choices it learned as an ingress that move a workflow's likely path
    #: (:meth:`ChoiceFrequencies.spread <compass.workflow.frequencies.ChoiceFrequencies.spread>`)
    choices: tuple[Likely, ...] = ()
    recent: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"Heartbeat.name must be a non-empty string, got {self.name!r}")
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
        if self.batches is not NO_BATCHES:
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

    @classmethod
    def own(
        cls,
        name: str,
        seq: int,
        incarnation: int,
        load: LaneLoad,
        held: CacheHeld,
        serving: Serving,
    ) -> Heartbeat:
        """A worker's own state, made from its lanes (``load``), cache (``held``) and what it
        serves with (``serving``) for every job it plans: the same value as the constructor's,
        without its checks, which what a worker counts itself always passes (``lifted_s`` are
        floats >= 0, at most one per priority level; the constructor's checks were 150 of the
        220 bytecode instructions).
        ``batches`` is normalised as the constructor does (none: :data:`NO_BATCHES`)."""
        state: Any = object.__new__(cls)
        state.name = name
        state.wait_s = load.wait_s
        state.models = held.models
        state.free_bytes = held.free_bytes
        state.capacity_bytes = held.capacity_bytes
        state.lanes = load.lanes
        state.lanes_busy = load.lanes_busy
        state.seq = seq
        state.loading = held.loading
        state.h2d_bytes_per_s = held.h2d_bytes_per_s
        state.recent = held.recent
        state.incarnation = incarnation
        batches = load.batches
        state.batches = state._checked_batches(batches) if batches else NO_BATCHES
        state.lifted_s = load.lifted_s
        state.version = serving.version
        state.learned = serving.learned
        state.choices = serving.choices
        made: Heartbeat = state
        return made

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
            return NO_BATCHES
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
            **({"v": self.version} if self.version else {}),
            **({"p": [list(e) for e in self.learned]} if self.learned else {}),
            **({"lc": [list(e) for e in self.choices]} if self.choices else {}),
            **({"r": sorted(self.recent)} if self.recent else {}),
        }

    @classmethod
    def from_wire(cls, data: object) -> Heartbeat:
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
        batches = data.get("q", NO_BATCHES)  # likewise, and left out when empty
        lifted = data.get("wl", ())  # likewise
        version = data.get("v", "")  # likewise
        if not isinstance(version, str):
            raise ProtocolError("worker state: field 'v' must be a version string")
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
        recent = data.get("r", ())  # absent from a worker that predates it, or says nothing
        if not isinstance(recent, list | tuple) or len(recent) > MAX_RECENT:
            raise ProtocolError(
                f"worker state: field 'r' must be a list of at most {MAX_RECENT} model names"
            )
        for key, names in (("m", models), ("ld", loading), ("r", recent)):
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
                version=version,
                learned=_learned(data.get("p", ())),
                choices=_choices(data.get("lc", ())),
                recent=frozenset(recent),
            )
        except ConfigError as exc:
            raise ProtocolError(f"worker state: {exc.message}") from None


def _choices(entries: object) -> tuple[Likely, ...]:
    """A state's learned choices off the wire (field ``lc``); :class:`ProtocolError` unless
    they are at most :data:`MAX_LEARNED` ``[workflow, task, option >= 0]``."""
    if not isinstance(entries, list | tuple) or len(entries) > MAX_LEARNED:
        raise ProtocolError(
            f"worker state: field 'lc' must be a list of at most {MAX_LEARNED} learned choices"
        )
    out: list[Likely] = []
    for entry in entries:
        if type(entry) is list and len(entry) == 3:
            workflow, task, option = entry
            if type(workflow) is str and type(task) is str and type(option) is int and option >= 0:
                out.append((workflow, task, option))
                continue
        raise ProtocolError(
            f"worker state: a learned choice must be [workflow, task, option >= 0], got {entry!r}"
        )
    return tuple(out)


def _learned(entries: object) -> tuple[Learned, ...]:
    """A state's learned task times off the wire (field ``p``); :class:`ProtocolError` if
    they are not at most :data:`MAX_LEARNED` ``[workflow, task, seconds >= 0, samples >= 1]``."""
    if not isinstance(entries, list | tuple) or len(entries) > MAX_LEARNED:
        raise ProtocolError(
            f"worker state: field 'p' must be a list of at most {MAX_LEARNED} learned times"
        )
    out: list[Learned] = []
    for entry in entries:  # plain type checks: a match statement took five times as long
        if type(entry) is list and len(entry) == 4:
            workflow, task, seconds, samples = entry
            kind = type(seconds)
            if (
                type(workflow) is str
                and type(task) is str
                and (kind is float or kind is int)
                and 0 <= seconds < math.inf
                and type(samples) is int
                and samples >= 1
            ):
                out.append((workflow, task, float(seconds), samples))
                continue
        raise ProtocolError(
            "worker state: a learned time must be [workflow, task, seconds >= 0, samples >= 1], "
            f"got {entry!r}"
        )
    return tuple(out)
