"""A worker's side of the shared view: its :class:`ClusterView`, the heartbeats it sends, the
ones it receives, and what it learns from them.

A worker gossips its queue and cache to every peer within ``heartbeat_min_ms`` of a change
(spaced further in a large cluster, see :func:`~compass.worker.membership.gossip_gap_s`) and
every ``heartbeat_ms`` regardless. Whether a peer is alive is not judged here but by the
failure detector's probes (:mod:`~compass.worker.members`); a heartbeat only counts if it is
of a live peer's current incarnation. Each heartbeat is also the worker core's periodic check
(``tick``): an idle worker warms its cache then.

:class:`Gossip` is also the worker core's :class:`~compass.worker.state.ViewPort`: a snapshot
counts this worker's own state exactly as it is at that moment.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from compass.config import WorkerConfig
from compass.sched.heartbeat import Heartbeat
from compass.sched.placement import Placement
from compass.sched.snapshot import ViewSnapshot
from compass.sched.view import ClusterView
from compass.wire.transport import Channel
from compass.worker.lanes import Lanes
from compass.worker.membership import Membership, gossip_gap_s
from compass.workflow.profile import Profiles

__all__ = ["Gossip"]

#: a peer's gossiped host-to-device bandwidth is adopted when it differs by more than this
_H2D_TOLERANCE = 0.02

#: the wait a degraded worker (too many stuck tasks) reports: planners place nothing there
_DEGRADED_WAIT_S = 1e6


class Gossip:
    """The view and the heartbeats of worker ``name``; see the module docstring."""

    def __init__(
        self,
        name: str,
        config: WorkerConfig,
        *,
        profiles: Profiles,
        lanes: Lanes,
        clock: Callable[[], float],
        tick: Callable[[], None],
    ) -> None:
        self.name = name
        self._config = config
        self._profiles = profiles
        self._lanes = lanes
        self._clock = clock
        self._tick = tick
        self._seq = itertools.count(1)
        self._h2d_measured = False  # this worker's own host-to-device copies were timed
        #: this worker's incarnation, carried in its heartbeats
        self.incarnation = 0
        #: peers that said they drain: out of the view (nothing new is placed there), their
        #: heartbeats still keep them alive
        self.draining: set[str] = set()
        #: set when the queue or the cache changed since the last heartbeat
        self._changed = asyncio.Event()
        gap = self._gap_s(0)
        self.view = ClusterView(
            name, heartbeat_s=gap / config.time_scale, settle_s=self._settle_s(gap)
        )

    # -- the core's ViewPort -------------------------------------------------------------------
    def snapshot(self, now: float, without: str = "", priority: int = 0) -> ViewSnapshot:
        self.view.update_self(self.own_state())
        return self.view.snapshot(now, without, priority)

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        self.view.note_placement(worker, placed, now)

    def remove(self, worker: str) -> None:
        self.view.remove(worker)

    # -- this worker's state -------------------------------------------------------------------
    def own_state(self) -> Heartbeat:
        lanes, cache = self._lanes, self._lanes.cache
        h2d = self._profiles.h2d_bytes_per_s(self.name) if self._h2d_measured else 0.0
        now = self._clock()
        wait_s = lanes.wait_s(now)
        # a degraded worker takes no GPU work: no batch there to join either
        batches = {} if lanes.degraded else lanes.queue.batchable(now, lanes.lanes)
        return Heartbeat(
            name=self.name,
            wait_s=wait_s + (_DEGRADED_WAIT_S if lanes.degraded else 0.0),
            models=cache.resident(),
            free_bytes=cache.free_bytes(),
            capacity_bytes=cache.capacity_bytes(),
            lanes=lanes.lanes,
            lanes_busy=lanes.busy,
            seq=next(self._seq),
            loading=cache.loading(),
            h2d_bytes_per_s=h2d,
            incarnation=self.incarnation,
            batches=batches,
            lifted_s=tuple(w + (_DEGRADED_WAIT_S if lanes.degraded else 0.0)
                           for w in lanes.queue.lifted_s(now)),
        )  # fmt: skip

    def changed(self) -> None:
        """The queue or the cache changed: gossip it at the next gap."""
        self._changed.set()

    # -- heartbeats ----------------------------------------------------------------------------
    def _gap_s(self, peers: int) -> float:
        """Real seconds at least between two heartbeats with ``peers`` peers."""
        sched = self._config.sched
        return gossip_gap_s(sched.heartbeat_min_ms / 1000.0, peers, sched.heartbeat_max_rate)

    def _settle_s(self, gap_s: float) -> float:
        """How long the view counts a placement: changes are gossiped within ``gap_s``, so a
        heartbeat received two gaps after a placement reflects it (in the view's clock)."""
        return 2.0 * gap_s / self._config.time_scale

    async def run(self, membership: Membership) -> None:
        """Send this worker's state to every peer when it changes, and every
        ``heartbeat_ms`` regardless. Runs until cancelled."""
        sched = self._config.sched
        loop = asyncio.get_running_loop()
        loads_seen = (0, 0.0)
        while True:
            self._changed.clear()
            if not self._config.emulate:
                loads_seen = self._measure_h2d(loads_seen)
            self.incarnation = membership.incarnation  # raised when it rejoins (membership.py)
            state = self.own_state()
            self.view.update_self(state)
            self._tick()  # an idle worker warms its cache (the core decides)
            peers = len(membership.peers)
            if peers:
                membership.broadcast("heartbeat", state.to_wire())
            min_gap = self._gap_s(peers)
            interval = max(sched.heartbeat_ms / 1000.0, min_gap)
            self.view.settle_s = self._settle_s(min_gap)
            await asyncio.sleep(min_gap)
            if not self._changed.is_set() and interval > min_gap:
                timer = loop.call_later(interval - min_gap, self._changed.set)
                try:
                    await self._changed.wait()
                finally:
                    timer.cancel()

    def _measure_h2d(self, seen: tuple[int, float]) -> tuple[int, float]:
        """Fold the model loads since the last call into this worker's host-to-device bandwidth."""
        stats = self._lanes.cache.stats
        nbytes, seconds = stats.bytes_loaded - seen[0], stats.load_seconds - seen[1]
        if nbytes > 0 and seconds > 0:
            self._profiles.observe_h2d(self.name, nbytes, seconds)
            self._h2d_measured = True
        return stats.bytes_loaded, stats.load_seconds

    def on_heartbeat(self, channel: Channel, body: Any, membership: Membership) -> None:
        """A peer's heartbeat: it is alive, and its state goes into the view."""
        state = Heartbeat.from_wire(body)
        # only from a peer, of its current incarnation; a draining peer is only alive
        if (
            membership.seen(state.name, state.incarnation)
            and state.name not in self.draining
            and self.view.apply_heartbeat(state, self._clock())
        ):
            self._learn_h2d(state)

    def peer_draining(self, name: str) -> None:
        """Peer ``name`` drains: plan nothing new there (tasks already sent still run)."""
        if name != self.name:
            self.draining.add(name)
            self.view.remove(name)

    def _learn_h2d(self, state: Heartbeat) -> None:
        """Adopt a peer's measured host-to-device bandwidth when it differs by more than 2%
        from what this worker assumes (smaller moves would only rebuild the cost tables)."""
        measured = state.h2d_bytes_per_s
        if measured > 0:
            assumed = self._profiles.h2d_bytes_per_s(state.name)
            if abs(measured - assumed) > _H2D_TOLERANCE * assumed:
                self._profiles.set_h2d(state.name, measured)

    # -- for status ----------------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """Each worker's state as this worker's view holds it; ages and waits are in this
        worker's clock (workload time for an emulated worker)."""
        now = self._clock()
        rows = []
        for name in self.view.names():
            state = self.view.get(name)
            assert state is not None
            rows.append(
                {
                    "name": name,
                    "wait_ms": round(state.wait_s * 1000, 3),
                    "models": sorted(state.models),
                    "loading": sorted(state.loading),
                    "free_bytes": state.free_bytes,
                    "h2d_gbps": round(self._profiles.h2d_bytes_per_s(name) / 1e9, 4),
                    "age_ms": round(self.view.age_s(name, now) * 1000, 3),
                    "placements_counted": self.view.pending(name),
                }
            )
        return rows
