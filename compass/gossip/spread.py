"""How a worker's state spreads in a bounded view, sans-IO: who watches whose load, and the
rumors that carry every worker's cache to all.

A planner of a bounded view (:mod:`compass.sched.candidates`) ranks only a job's candidates,
so it needs fresh load of those alone, and the cache residency of every worker (to know who
holds a model). The two travel apart:

- **Load, to the watchers.** A planner that plans over a candidate *watches* it: it asks for
  its state for ``lease_s`` (:class:`Watching` says when to ask again, before the lease runs
  out), and the candidate sends its state to every live watcher when it changes
  (:class:`Watchers`), coalesced, and at once on a new watch. Nobody else hears it: a worker's
  messages grow with the planners that place on it, not with the cluster.
- **Residency, to all, as rumors.** A worker starts a rumor of its own state when its cache
  changes (models resident or loading, capacity, lanes, measured bandwidth) or what it learned
  of its tasks' times does (:meth:`~compass.workflow.profile.Profiles.learned_of`); each period it
  sends a few rumors to a few peers picked at random, and a worker that hears a rumor newer
  than any it knew passes it on in turn (:class:`Rumors`: infection-style, each rumor sent
  ``retransmit_mult x ceil(log10(n + 1))`` times, so it reaches all ``n`` workers in O(log n)
  periods while every worker sends a constant number of messages a period). Now and then a
  worker also sends every state it holds to one peer (anti-entropy, as memberlist's push-pull
  sync; less often the larger the cluster, so that it costs a worker the same at any size), and
  a joining worker asks the first peer it meets for all of them, so one that missed a rumor or
  joined since catches up.

Nothing here reads a clock or does I/O; time is passed in, and the randomness is the caller's.
The asyncio side is :class:`~compass.worker.gossip.Gossip`'s.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

from compass.errors import ConfigError
from compass.sched.heartbeat import Heartbeat

__all__ = [
    "MAX_RUMORS",
    "SYNC_SCALE_FROM",
    "Ends",
    "Rumors",
    "Watchers",
    "Watching",
    "cache_changed",
    "gossip_gap_s",
    "sync_period_s",
]

K = TypeVar("K", bound=Hashable)  # how a Watchers or Watching keys its peers
T = TypeVar("T")

#: the most states one ``rumors`` message may carry (more is a malformed message)
MAX_RUMORS = 64
#: a bounded view syncs every ``sync_ms`` up to this many workers, proportionally less often
#: beyond (memberlist scales its push-pull interval likewise, by the log)
SYNC_SCALE_FROM = 32


def sync_period_s(sync_ms: float, workers: int) -> float:
    """Seconds between two whole-view syncs of a worker in a cluster of ``workers``: every
    ``sync_ms`` up to :data:`SYNC_SCALE_FROM` workers, proportionally less often beyond, so
    that the states a worker sends and receives in syncs do not grow with the cluster."""
    return sync_ms / 1000.0 * max(1.0, workers / SYNC_SCALE_FROM)


def gossip_gap_s(min_gap_s: float, peers: int, max_rate: float) -> float:
    """The least seconds between two heartbeats of a worker with ``peers`` peers: at least
    ``min_gap_s``, and enough that it sends at most ``max_rate`` messages a second in all
    (one message per peer sent to: every peer in a mesh, the watchers in a bounded view)."""
    return max(min_gap_s, peers / max_rate)


def cache_changed(before: Heartbeat | None, after: Heartbeat) -> bool:
    """Whether ``after`` says something of its worker's cache that ``before`` did not: what a
    rumor must carry to every planner (a change of load alone goes to the watchers). The task
    times it learned and its version count too: every planner estimates with the first, and
    keeps workers of another version apart by the second."""
    return (
        before is None
        or before.incarnation != after.incarnation
        or before.models != after.models
        or before.loading != after.loading
        or before.capacity_bytes != after.capacity_bytes
        or before.lanes != after.lanes
        or before.h2d_bytes_per_s != after.h2d_bytes_per_s
        or before.learned != after.learned
        or before.version != after.version
    )


class Ends(Generic[T]):
    """Items that each end at a time, handed back once it has passed. Leases of one length
    set as time goes on end in the order they were set: those wait in a queue (O(1) each);
    one that ends before the last added (set for a shorter lease, or for an earlier time)
    waits in a heap."""

    __slots__ = ("_late", "_order", "_queue")

    def __init__(self) -> None:
        self._queue: deque[tuple[float, T]] = deque()
        self._late: list[tuple[float, int, T]] = []
        self._order = 0  # of the entries in ``_late``: ties in the end never compare items

    def add(self, end: float, item: T) -> None:
        """``item`` ends at ``end``."""
        queue = self._queue
        if not queue or queue[-1][0] <= end:
            queue.append((end, item))
        else:
            self._order += 1
            heapq.heappush(self._late, (end, self._order, item))

    def ended(self, now: float) -> Sequence[tuple[float, T]]:
        """The items that ended before ``now``, with their ends, taken out."""
        queue, late = self._queue, self._late
        if not (queue and queue[0][0] < now) and not (late and late[0][0] < now):
            return ()
        out = []
        while queue and queue[0][0] < now:
            out.append(queue.popleft())
        while late and late[0][0] < now:
            end, _, item = heapq.heappop(late)
            out.append((end, item))
        return out

    def __len__(self) -> int:
        return len(self._queue) + len(self._late)


class Watchers(Generic[K]):
    """The peers watching this worker's load, each until its lease ends. Peers are named
    (``Watchers()``) or keyed by what ``key`` says (``Watchers(int)``: the simulator's
    worker indices)."""

    @overload
    def __init__(self: Watchers[str]) -> None: ...
    @overload
    def __init__(self, key: type[K]) -> None: ...
    def __init__(self, key: type[K] | None = None) -> None:
        self._until: dict[K, float] = {}
        #: each lease set, by its end; one that a later lease or a drop made stale is skipped
        #: (its end is not the peer's)
        self._ends: Ends[K] = Ends()

    def watch(self, peer: K, until: float) -> bool:
        """``peer`` watches until ``until`` (a later lease extends, an earlier one does not
        shorten); True if it did not watch before."""
        before = self._until.get(peer)
        if before is None or before < until:
            self._until[peer] = until
            self._ends.add(until, peer)
        return before is None

    def live(self, now: float) -> list[K]:
        """The watchers whose lease holds at ``now`` (the others are dropped)."""
        self._drop_ended(now)
        return list(self._until)

    def count(self, now: float) -> int:
        """How many watchers' leases hold at ``now`` (as ``len(live(now))``, without the list)."""
        self._drop_ended(now)
        return len(self._until)

    def drop(self, peer: K) -> None:
        """``peer`` is gone: it watches no more."""
        self._until.pop(peer, None)

    def __len__(self) -> int:
        return len(self._until)

    def _drop_ended(self, now: float) -> None:
        until = self._until
        for end, peer in self._ends.ended(now):
            if until.get(peer) == end:
                del until[peer]


class Watching(Generic[K]):
    """The peers this worker watches, and when each lease it asked for ends. Peers are named
    (``Watching(lease_s)``) or keyed by what ``key`` says (``Watching(lease_s, int)``)."""

    @overload
    def __init__(self: Watching[str], lease_s: float) -> None: ...
    @overload
    def __init__(self, lease_s: float, key: type[K]) -> None: ...
    def __init__(self, lease_s: float, key: type[K] | None = None) -> None:
        if not lease_s > 0:
            raise ConfigError(f"a watch lease must be > 0 seconds, got {lease_s!r}")
        self.lease_s = lease_s
        self._until: dict[K, float] = {}

    def due(self, peers: Iterable[K], now: float) -> list[K]:
        """Of ``peers``, those to ask now: never asked, or whose lease ends within half a lease
        (renewed before it runs out). Each is counted as asked until ``now + lease_s``."""
        ask = []
        renew = now + self.lease_s / 2
        until = now + self.lease_s
        leases = self._until
        for peer in peers:
            end = leases.get(peer)
            if end is None or end < renew:
                leases[peer] = until
                ask.append(peer)
        return ask

    def watched(self, now: float) -> list[K]:
        """The peers whose lease holds at ``now``."""
        return [p for p, until in self._until.items() if until >= now]

    def drop(self, peer: K) -> None:
        """``peer`` is gone (or came back as a new instance, which knows no lease)."""
        self._until.pop(peer, None)


@dataclass(slots=True)
class _Rumor:
    state: Heartbeat
    left: int  # transmissions still due


def _left(rumor: _Rumor) -> int:
    return rumor.left


class Rumors:
    """The latest state heard of each worker, and the rumors still to pass on.

    :meth:`heard` keeps a state newer (by ``(incarnation, seq)``) than any known of its worker
    and queues it to be sent ``retransmits(n)`` times; :meth:`take` hands out the rumors with
    the most transmissions left (the newest news first), counting one transmission each.
    """

    def __init__(self, *, retransmit_mult: int = 4, per_message: int = 8) -> None:
        if retransmit_mult < 1 or not 1 <= per_message <= MAX_RUMORS:
            raise ConfigError(
                f"Rumors needs retransmit_mult >= 1 and 1 <= per_message <= {MAX_RUMORS}, got "
                f"{retransmit_mult!r}, {per_message!r}"
            )
        self.retransmit_mult = retransmit_mult
        self.per_message = per_message
        self._known: dict[str, Heartbeat] = {}
        self._rumors: dict[str, _Rumor] = {}

    def retransmits(self, members: int) -> int:
        """How many times a rumor is sent in a cluster of ``members`` workers."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(members + 1)))

    def heard(self, state: Heartbeat, members: int) -> bool:
        """Keep ``state`` if it is newer than what is known of its worker, and pass it on;
        False (nothing changes) if it is not."""
        old = self._known.get(state.name)
        if old is not None and (state.incarnation, state.seq) <= (old.incarnation, old.seq):
            return False
        self._known[state.name] = state
        self._rumors[state.name] = _Rumor(state, self.retransmits(members))
        return True

    def take(self) -> list[Heartbeat]:
        """The rumors for one message: at most ``per_message``, those with the most
        transmissions left; each counts as sent once, and is dropped once sent enough."""
        if not self._rumors:
            return []
        # sorted(..., reverse=True)[:k] without sorting them all (ties in the order heard)
        picked = heapq.nlargest(self.per_message, self._rumors.values(), key=_left)
        for rumor in picked:
            rumor.left -= 1
            if rumor.left <= 0:
                del self._rumors[rumor.state.name]
        return [r.state for r in picked]

    def forget(self, worker: str) -> None:
        """``worker`` was declared dead or left: pass on nothing more of it, and take its next
        incarnation's news as new."""
        self._known.pop(worker, None)
        self._rumors.pop(worker, None)

    def pending(self) -> int:
        """Rumors still to pass on."""
        return len(self._rumors)
