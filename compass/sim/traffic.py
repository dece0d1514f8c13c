"""The messages a bounded view would send in a simulated cluster, counted by the real
worker's rules (:mod:`compass.gossip.spread`), and told to :class:`~compass.sim.heard.Heard`
(each watch asked, each rumor started), which makes them what each planner knows; counting
alone changes nothing a simulated worker sees or does.

- **Watch asks.** A planner that plans a job over its candidates asks each other candidate
  whose lease is due (:meth:`Watching.due <compass.gossip.spread.Watching.due>`: never asked,
  or under half a lease left) to be watched for ``lease_s``; for the counts the ask arrives at
  once (:class:`~compass.sim.heard.Heard` puts it, and the answer, a link delay away). Each
  ask is answered by one state message
  (:meth:`Gossip.watched_by <compass.worker.gossip.Gossip.watched_by>`), not counted apart.
- **State pushes.** When a worker's state changes (its lanes' version moved after the core
  handled an event, as :class:`~compass.worker.server.Worker` tells its gossip), it sends its
  state to every live watcher (:class:`~compass.gossip.spread.Watchers`), with the real loop's
  spacing (``Gossip._run_bounded``): a change at least a gap after the last send is sent at
  once, changes within the gap are sent together when it ends; the gap is
  :func:`~compass.gossip.spread.gossip_gap_s` of the live watchers at the send (1 ms,
  more with over 20 watchers). One push is one message to one watcher.
- **Cache changes.** At each of those sends, a worker whose models resident or loading
  differ from those of its last rumor starts a rumor of itself
  (:func:`~compass.gossip.spread.cache_changed`); the count is of rumors started, each sent
  ``Rumors.retransmits(n)`` times in messages of up to ``per_message`` states (the arithmetic
  is the caller's). A worker's first rumor (of its empty cache, at start) is not counted.

Not counted: the rumor, sync and failure-detector messages themselves (they do not depend
on the workload: a fixed number per period), and anything of workers lost or joining (the
simulator loses none).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compass.cache.policy import CacheCore
from compass.config import SchedConfig
from compass.gossip.spread import Watchers, Watching, gossip_gap_s, sync_period_s
from compass.sim.heard import Heard, rumor_delays
from compass.sim.state import ClusterState

__all__ = ["CacheKey", "ViewTraffic", "view_traffic"]

#: what a rumor says of a worker's cache, as the simulator changes it: resident, loading
CacheKey = tuple[frozenset[str], frozenset[str]]


@dataclass(slots=True)
class _Sender:
    """One worker's side: its watchers, its last send and the change still to send."""

    watchers: Watchers[int]
    watching: Watching[int]
    rumored: CacheKey
    sent_at: float = -math.inf
    gap_s: float = 0.0
    #: the cache after the latest change not yet sent (None: nothing to send)
    pending: CacheKey | None = None


class ViewTraffic:
    """Counts, for workers ``names``, the watch asks, state pushes and cache rumors a bounded
    view's real workers would send; see the module docstring. Times are the simulation's
    (workload seconds); ``caches`` is each worker's cache at the start."""

    def __init__(
        self,
        names: Sequence[str],
        caches: Sequence[CacheKey],
        *,
        lease_s: float,
        min_gap_s: float,
        max_rate: float,
        heard: Heard | None = None,
    ) -> None:
        self.names = tuple(names)
        self.lease_s = lease_s
        self._min_gap_s = min_gap_s
        self._max_rate = max_rate
        #: told of each watch asked and each rumor started (None: counted only)
        self.heard = heard
        self._senders = [_Sender(Watchers(int), Watching(lease_s, int), cache) for cache in caches]
        #: watch asks sent, state messages pushed to watchers, rumors started of a cache change
        self.asks = 0
        self.pushes = 0
        self.cache_changes = 0

    def planned(self, viewer: int, among: Iterable[int], now: float) -> None:
        """Worker ``viewer`` planned a job over workers ``among`` at ``now``: it asks those
        whose lease is due to be watched (each one now watched by it for a lease)."""
        others = [i for i in among if i != viewer]
        peers = self._senders[viewer].watching.due(others, now)
        if not peers:
            return
        self.asks += len(peers)
        until = now + self.lease_s
        senders = self._senders
        for peer in peers:
            sender = senders[peer]
            if sender.pending is not None:  # a send due before the ask goes to the old watchers
                self.catch_up(peer, now)
            sender.watchers.watch(viewer, until)
        if self.heard is not None:
            self.heard.watch(viewer, peers, now)

    def changed(self, worker: int, now: float, cache: CacheKey) -> None:
        """``worker``'s state changed at ``now``; ``cache`` is its cache after the change."""
        sender = self._senders[worker]
        if sender.pending is not None:
            self.catch_up(worker, now)
        if now >= sender.sent_at + sender.gap_s:
            self._send(sender, worker, now, cache)
        else:
            sender.pending = cache  # sent when the gap ends, with any later change in it

    def finish(self) -> None:
        """The run ended: send what is still waiting for its gap to end."""
        for worker, sender in enumerate(self._senders):
            if sender.pending is not None:
                self._send(sender, worker, sender.sent_at + sender.gap_s, sender.pending)

    def catch_up(self, worker: int, now: float) -> None:
        """Make the send that came due before ``now`` (the changes within a gap); call it
        before ``worker``'s state changes at ``now``, so that the send carries the state it
        had."""
        sender = self._senders[worker]
        due = sender.sent_at + sender.gap_s
        if sender.pending is not None and due < now:
            self._send(sender, worker, due, sender.pending)

    def _send(self, sender: _Sender, worker: int, at: float, cache: CacheKey) -> None:
        watchers = sender.watchers
        live = watchers.count(at)
        self.pushes += live
        if cache != sender.rumored:
            sender.rumored = cache
            self.cache_changes += 1
            if self.heard is not None:
                self.heard.rumor(worker, at, cache[0] | cache[1], watchers.live(at))
        sender.sent_at = at
        sender.gap_s = gossip_gap_s(self._min_gap_s, live, self._max_rate)
        sender.pending = None


def view_traffic(state: ClusterState, caches: Sequence[CacheCore], seed: int) -> ViewTraffic:
    """A bounded view's messages, with a real worker's default leases, spacing and rumors,
    and what they tell each planner (:class:`Heard`, which the cluster state then shows)."""
    sched = SchedConfig()
    n = len(state.names)
    lease_s = sched.watch_ms / 1000.0
    sync_s = sync_period_s(sched.sync_ms, n)
    delays = rumor_delays(
        n, period_s=sched.rumor_ms / 1000.0, fanout=sched.rumor_fanout, sync_s=sync_s
    )
    initial = [state.told(i) for i in range(n)]
    heard = Heard(
        state.models, state.held, initial, state.told, lease_s=lease_s, delays=delays, seed=seed
    )
    state.heard = heard
    return ViewTraffic(
        state.names,
        [cache.residency() for cache in caches],
        lease_s=lease_s,
        min_gap_s=sched.heartbeat_min_ms / 1000.0,
        max_rate=sched.heartbeat_max_rate,
        heard=heard,
    )
