"""What each planner of a simulated bounded view has heard of its peers, and when.

A real bounded view (:mod:`compass.worker.gossip`, :mod:`compass.gossip.spread`) knows a peer
by what reached it: the states a watched peer pushes, the rumors of cache changes, the answer
to a watch ask. :class:`Heard` keeps that for the simulator, by the same rules, with the
simulation's clock (workload seconds):

- **Watched.** A planner asks a candidate whose lease is due (:class:`~compass.gossip.spread.
  Watching`, run by :class:`~compass.sim.traffic.ViewTraffic`); the ask arrives a link delay
  (:data:`LINK_S`) later, starts the lease at the candidate (:class:`~compass.gossip.spread.
  Watchers`) and is answered by its state, which arrives a link delay after that. From then
  until the lease ends the candidate pushes its state on every change, a push gap apart, so
  the planner sees it as the cluster state's tick model shows it (ticks a push gap apart,
  ``staleness`` one link delay: a change is seen 0.25 to 1.25 ms later, as a push would be).
- **Not watched** (never asked, or the lease lapsed): the newest of the last state pushed
  before the lease ended (recorded when it ends, from the live state: events in time order
  leave the state after the peer's last change before the end) and the states carried by
  rumors that have reached the planner, *aged* as :meth:`ClusterView.snapshot(aged=True)
  <compass.sched.view.ClusterView.snapshot>` ages them: the wait less the time since it was
  received, at least 0. A peer never heard of otherwise shows its state at start (its first
  rumor, which every worker has: an empty queue and its initial cache).
- **Residency** (the models a peer holds or loads) of a peer: that of the newest rumor of it
  that has reached the planner; a rumor of a change the planner was watching for arrives as
  the push (a link delay), and a watch's answer brings every earlier one with it. A rumor
  reaches each other worker after a delay sampled, per (change, viewer), from the
  distribution :func:`rumor_delays` measures by running the real :class:`~compass.worker.
  spread.Rumors` rules (every ``rumor_ms``, jittered 0.5-1.5x, ``rumor_fanout`` peers picked at
  random, each holder passing it on ``retransmits(n)`` times). A worker a rumor happens to
  miss hears it at the next anti-entropy sync (an exponential delay of mean ``sync_ms``,
  scaled past 32 workers as the real worker scales it).

Not modelled: rumors competing for a message (at most 8 states each, newest first: at a cold
start, when many caches change at once, the real ones queue and arrive later), the third
parties' states a sync carries (no newer than the rumors already brought), a push gap above
1 ms (a worker with over 20 watchers; counted by :class:`ViewTraffic`, not shown), batches
and priority waits of an unwatched peer are as heard, not aged (as the real view leaves them).

Cost: a watch and a rumor are O(1) (a rumor O(n) in numpy, to sample its delays); each ask is
one entry in a queue kept in the order of the lease ends (asks come in time order, each lease
as long), whose lapse is recorded when its end passes; a snapshot patches only its candidates'
rows; residency is the rows every worker knows, patched for the few peers with a rumor still
on its way (looked up one by one when only a few rumors are in flight).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.gossip.spread import Ends, Rumors
from compass.records import record
from compass.sched.heartbeat import Heartbeat

__all__ = ["LINK_S", "Heard", "Told", "rumor_delays"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]

#: one way between two workers on a LAN: the ask, the answer, a push (about a quarter of a
#: millisecond on the test machine's loopback, "Bounded view" in docs/RESULTS.md)
LINK_S = 0.00025
#: rumors simulated to measure the delay distribution: enough for about 4,000 delays
_DELAY_SAMPLES = 4000

_NO_LEVELS: Mapping[int, float] = {}
#: rumors in flight up to which a viewer's heard ones are found in Python, not numpy
_FEW = 8


# made for every lapsed lease and rumor: a record, frozen by convention (:mod:`compass.records`)
@record
class Told:
    """A worker's state as it sent it at ``sent`` (a push, a watch's answer or a rumor)."""

    sent: float
    queued: float
    run_ends: tuple[float, ...]
    free: int
    #: per model: queued tasks that may batch, absolute expected start of the first
    batches: Mapping[str, tuple[int, float]]
    raised: Mapping[int, float]

    def wait_s(self, priority: int = 0) -> float:
        """The wait it reported (of a task of ``priority``), counted from ``sent``."""
        running = sum(max(end - self.sent, 0.0) for end in self.run_ends)
        if priority <= 0:
            return self.queued + running
        return running + sum(s for level, s in self.raised.items() if level >= priority)

    def aged(self, now: float, priority: int = 0) -> float:
        """Its wait as a bounded view shows it at ``now``: less the time since it arrived."""
        return max(self.wait_s(priority) - max(now - self.sent - LINK_S, 0.0), 0.0)


class _Flight:
    """The rumors not yet heard by every worker, in the order they started: one row each of
    who started it, its state, its residency (per model) and when each worker hears it, in
    arrays that grow by doubling and drop heard rows from the front (amortised O(1)).

    When each worker hears them is kept by worker (``arrives[viewer, row]``): a viewer's
    lookups read one contiguous line."""

    def __init__(self, n: int, models: int) -> None:
        self.arrives: FloatArray = np.empty((n, 16))
        self.held: BoolArray = np.empty((16, models), dtype=np.bool_)
        self.who: npt.NDArray[np.intp] = np.empty(16, dtype=np.intp)
        self.told: list[Told] = []
        self.done: list[float] = []  # when every worker has heard it (at the latest)
        self.head = 0  # rows before it are heard by all
        self.by_worker: dict[int, deque[int]] = {}  # each worker's rows in flight, oldest first

    def add(self, worker: int, told: Told, held: BoolArray, arrives: FloatArray) -> None:
        size = len(self.told)
        if size == len(self.who):
            self._make_room()
            size = len(self.told)
        self.arrives[:, size] = arrives
        self.held[size] = held
        self.who[size] = worker
        self.told.append(told)
        self.done.append(float(arrives.max()))
        self.by_worker.setdefault(worker, deque()).append(size)

    def latest(self, viewer: int, peer: int, now: float) -> int:
        """The row of ``peer``'s newest rumor that ``viewer`` has heard by ``now`` (-1: none)."""
        rows = self.by_worker.get(peer)
        if rows:
            line = self.arrives[viewer]
            for row in reversed(rows):
                if line[row] <= now:
                    return row
        return -1

    def few(self) -> bool:
        """Whether so few rumors are in flight that :meth:`heard_few` is the quicker."""
        return len(self.told) - self.head <= _FEW

    def heard_few(self, viewer: int, now: float) -> list[int]:
        """As :meth:`heard`, looked up one by one (quicker for a few rows in flight)."""
        head = self.head
        line = self.arrives[viewer, head : len(self.told)].tolist()
        rows = []
        for mine in self.by_worker.values():
            for row in reversed(mine):
                if line[row - head] <= now:
                    rows.append(row)
                    break
        return rows

    def heard(self, viewer: int, now: float) -> npt.NDArray[np.intp]:
        """Per worker with a rumor in flight that ``viewer`` has heard, the row of its newest
        (in no particular order)."""
        head, size = self.head, len(self.told)
        got = np.flatnonzero(self.arrives[viewer, head:size] <= now)
        if len(got) == 0:
            return got
        # the last of each worker's rows, by worker: a stable sort keeps each worker's rows in
        # time order (np.unique's return_index did the same at twice the cost)
        rows = head + got
        order = np.argsort(self.who[rows], kind="stable")
        who = self.who[rows[order]]
        last = np.empty(len(who), dtype=np.bool_)
        last[-1] = True
        np.not_equal(who[1:], who[:-1], out=last[:-1])
        return rows[order[last]]

    def _make_room(self) -> None:
        head, size = self.head, len(self.told)
        if head >= size // 2 and head:  # drop the rows heard by all
            k = size - head
            self.arrives[:, :k] = self.arrives[:, head:size]
            self.held[:k] = self.held[head:size]
            self.who[:k] = self.who[head:size]
            del self.told[:head], self.done[:head]
            for rows in self.by_worker.values():
                for i in range(len(rows)):
                    rows[i] -= head
            self.head = 0
            return
        grow = len(self.who) * 2
        arrives = np.empty((self.arrives.shape[0], grow))
        arrives[:, :size] = self.arrives[:, :size]
        self.arrives = arrives
        self.held = np.resize(self.held, (grow, self.held.shape[1]))
        self.who = np.resize(self.who, grow)


@dataclass(slots=True)
class _Watch:
    fresh_from: float  # the answer to the first ask arrives
    lease_end: float  # at the watched worker
    answered: float  # when it last answered an ask


class Heard:
    """What each of ``n`` simulated workers has heard of the others; see the module doc.

    ``held`` is each worker's residency at start (``models`` x workers), ``initial`` its state
    at start; ``live(worker, at)`` its state now, as it would send it at ``at`` (the
    simulator's cluster state); ``delays`` the rumor delays to sample from
    (:func:`rumor_delays`); ``seed`` seeds the sampling."""

    def __init__(
        self,
        models: Sequence[str],
        held: BoolArray,
        initial: Sequence[Told],
        live: Callable[[int, float], Told],
        *,
        lease_s: float,
        delays: FloatArray,
        seed: int,
    ) -> None:
        if not lease_s > 0 or len(delays) == 0:
            raise ConfigError(f"Heard needs lease_s > 0 and some delays, got {lease_s!r}")
        self.models = tuple(models)
        self._model_index = {m: i for i, m in enumerate(self.models)}
        self.n = held.shape[1]
        self._live = live
        self.lease_s = lease_s
        self._delays = delays
        self._rng = np.random.default_rng([seed, 0x4EA2D])
        #: the residency every worker knows of every worker (models x workers)
        self._settled = held.copy()
        #: per worker, the newest rumor of it every worker has heard (or its state at start)
        self._known: list[Told] = list(initial)
        #: the rumors still on their way to some worker
        self._flight = _Flight(self.n, len(self.models))
        #: per viewer: its watches, by peer
        self._watches: list[dict[int, _Watch]] = [{} for _ in range(self.n)]
        #: per viewer: the last state each peer pushed it before its lease lapsed
        self._last: list[dict[int, Told]] = [{} for _ in range(self.n)]
        #: per viewer, per peer: whether it holds a lease on it (a lease ended before the
        #: current event is dropped by :meth:`advance`)
        self._leased: BoolArray = np.zeros((self.n, self.n), dtype=np.bool_)
        #: per viewer, per peer: when the answer to its first ask arrives (inf: no lease), so
        #: that a snapshot finds the candidates it does not watch in one step
        self._fresh_from: FloatArray = np.full((self.n, self.n), math.inf)
        #: (viewer, peers) of each ask, by its lease end; a peer an ask renewed since is skipped
        self._leases: Ends[tuple[int, tuple[int, ...]]] = Ends()
        self._next_prune = 0.0

    # -- what happens -------------------------------------------------------------------------

    def watch(self, viewer: int, peers: Sequence[int], now: float) -> None:
        """``viewer`` asks ``peers`` (their leases due) to be watched at ``now``."""
        if not peers:
            return
        watching = self._watches[viewer]
        arrives = now + LINK_S
        answered = arrives + LINK_S
        end = arrives + self.lease_s
        leased = self._leased[viewer]
        fresh_from = self._fresh_from[viewer]
        for peer in peers:
            entry = watching.get(peer)
            if entry is None:
                watching[peer] = _Watch(answered, end, arrives)
                leased[peer] = True
                fresh_from[peer] = answered
            else:  # a renewal: the entry of the old end is skipped when it comes up
                entry.lease_end = end
                entry.answered = arrives
        by_worker = self._flight.by_worker
        if by_worker:  # the answer carries the cache of each peer with a rumor in flight
            line = self._flight.arrives[viewer]
            for peer in peers:
                for row in by_worker.get(peer, ()):
                    line[row] = min(line[row], answered)
        self._leases.add(end, (viewer, tuple(peers)))

    def rumor(
        self, worker: int, at: float, models: frozenset[str], watchers: Sequence[int]
    ) -> None:
        """``worker`` starts a rumor of its state at ``at``, holding or loading ``models``;
        its ``watchers`` get it pushed."""
        told = self._live(worker, at)
        held = np.zeros(len(self.models), dtype=np.bool_)
        index = self._model_index
        held[[index[m] for m in models]] = True
        arrives = at + self._rng.choice(self._delays, size=self.n)
        arrives[worker] = at
        if watchers:
            arrives[list(watchers)] = at + LINK_S
        self._flight.add(worker, told, held, arrives)

    def advance(self, now: float) -> None:
        """Time moves to ``now`` (before the event at ``now`` changes anything): each lease
        that ended before it leaves its viewer the peer's last push (the live state: the one
        after the peer's last change before the end). Rumors every worker has heard are
        folded into what all know."""
        for end, (viewer, peers) in self._leases.ended(now):
            self._lapse(end, viewer, peers)
        if now >= self._next_prune:
            self._prune(now)
            self._next_prune = now + 0.05

    # -- what a viewer knows ------------------------------------------------------------------

    def watched(self, viewer: int, peer: int, now: float) -> bool:
        """Whether ``peer`` pushes its state to ``viewer`` at ``now`` (its answer arrived)."""
        entry = self._watches[viewer].get(peer)
        return entry is not None and entry.fresh_from <= now <= entry.lease_end

    def unwatched(self, viewer: int, among: IntpArray, now: float) -> list[int]:
        """The positions in ``among`` of the workers that do not push their state to
        ``viewer`` at ``now`` (:meth:`watched` of each, ``viewer`` itself among them), after
        :meth:`advance` to ``now``: a lease held then has not ended, so it is watched once
        its answer has arrived."""
        out: list[int] = (self._fresh_from[viewer, among] > now).nonzero()[0].tolist()
        return out

    def watching(self, viewer: int) -> BoolArray:
        """Per worker, whether ``viewer`` holds a watch lease on it now (asked, its answer
        arrived or not: :meth:`Watching.watched <compass.gossip.spread.Watching.watched>`);
        read-only, valid until the next change."""
        row: BoolArray = self._leased[viewer]
        return row

    def told(self, viewer: int, peer: int, now: float) -> Told:
        """The newest state of ``peer`` that ``viewer`` has heard at ``now`` (not watched)."""
        row = self._flight.latest(viewer, peer, now)
        told = self._known[peer] if row < 0 else self._flight.told[row]
        last = self._last[viewer].get(peer)
        return told if last is None or told.sent > last.sent else last

    def residency(self, viewer: int, peer: int, now: float) -> BoolArray:
        """Per model, whether ``viewer`` knows ``peer`` holds or loads it at ``now``."""
        row = self._flight.latest(viewer, peer, now)
        return self._settled[:, peer] if row < 0 else self._flight.held[row]

    def holders(self, viewer: int, now: float, models: Iterable[int]) -> list[BoolArray]:
        """Per model index of ``models``, where ``viewer`` knows it resident or loading at
        ``now`` (copies)."""
        models = list(models)
        settled = self._settled
        rows = [settled[m].copy() for m in models]
        flight = self._flight
        if flight.head == len(flight.told):
            return rows
        if flight.few():
            for r in flight.heard_few(viewer, now):
                worker = flight.who[r]
                held = flight.held[r]
                for row, m in zip(rows, models, strict=True):
                    row[worker] = held[m]
            return rows
        heard = flight.heard(viewer, now)
        if len(heard):
            who = flight.who[heard]
            held = flight.held[heard]
            for row, m in zip(rows, models, strict=True):
                row[who] = held[:, m]
        return rows

    def in_flight(self) -> int:
        """Rumors not yet heard by every worker (or not yet found so)."""
        return len(self._flight.told) - self._flight.head

    # -- internals ----------------------------------------------------------------------------

    def _lapse(self, end: float, viewer: int, peers: Sequence[int]) -> None:
        """The leases ``viewer`` asked of ``peers`` to end at ``end`` ended (those not renewed
        since): it keeps each peer's last push."""
        watching = self._watches[viewer]
        last = self._last[viewer]
        leased = self._leased[viewer]
        fresh_from = self._fresh_from[viewer]
        for peer in peers:
            entry = watching.get(peer)
            if entry is None or entry.lease_end > end:  # ended already, or renewed since
                continue
            del watching[peer]
            leased[peer] = False
            fresh_from[peer] = math.inf
            last[peer] = self._live(peer, entry.answered)

    def _prune(self, now: float) -> None:
        flight = self._flight
        done, size = flight.done, len(flight.told)
        while flight.head < size and done[flight.head] <= now:
            row = flight.head
            worker = int(flight.who[row])
            self._settled[:, worker] = flight.held[row]
            self._known[worker] = flight.told[row]
            rows = flight.by_worker[worker]
            rows.popleft()
            if not rows:
                del flight.by_worker[worker]
            flight.head += 1


@functools.lru_cache(maxsize=16)
def rumor_delays(
    n: int, *, period_s: float, fanout: int, sync_s: float, seed: int = 0
) -> FloatArray:
    """Seconds from a worker's start of a rumor to each other worker's hearing it, in a
    cluster of ``n``: about 4,000 of them (pooled over rumors started at random workers),
    each rumor run on its own by the real :class:`~compass.gossip.spread.Rumors` rules. Each
    worker wakes every ``period_s`` x U(0.5, 1.5) (``Gossip._run_rumors``), takes a message
    of rumors for each of ``fanout`` peers picked at random and sends it, a link delay away;
    a worker the rumor misses hears it from the next sync, an exponential delay of mean
    ``sync_s`` after the rumor died out. Read-only; cached per arguments."""
    if n < 2:
        return np.zeros(1)
    rng = random.Random(f"rumor-delays:{n}:{seed}")
    out: list[float] = []
    samples = max(1, math.ceil(_DELAY_SAMPLES / (n - 1)))
    for _ in range(samples):
        out += _one_rumor(n, rng, period_s, fanout, sync_s)
    delays = np.array(out)
    delays.setflags(write=False)
    return delays


def _one_rumor(
    n: int, rng: random.Random, period_s: float, fanout: int, sync_s: float
) -> list[float]:
    """Each other worker's delay in hearing one rumor started at worker 0 at time 0."""
    tables = [Rumors() for _ in range(n)]
    tables[0].heard(Heartbeat("w0", 0.0, frozenset(), 0, 0, seq=1), n)
    heard = [math.inf] * n
    heard[0] = 0.0
    wakes = [(period_s * rng.random(), w) for w in range(n)]  # each loop somewhere in its sleep
    heapq.heapify(wakes)
    others = range(n - 1)
    pending = 1
    now = 0.0
    while pending:
        now, w = heapq.heappop(wakes)
        heapq.heappush(wakes, (now + period_s * (0.5 + rng.random()), w))
        table = tables[w]
        if not table.pending():
            continue
        for pick in rng.sample(others, min(fanout, n - 1)):
            peer = pick + (pick >= w)  # one of the n - 1 others
            states = table.take()
            if not states:
                break
            target = tables[peer]
            had = target.pending()
            if target.heard(states[0], n):
                heard[peer] = now + LINK_S
                pending += had == 0
            if not table.pending():
                pending -= 1
                break
    return [t if t < math.inf else now + rng.expovariate(1.0 / sync_s) for t in heard[1:]]
