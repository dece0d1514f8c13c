"""A worker's side of the shared view: its :class:`ClusterView`, the heartbeats it sends, the
ones it receives, and what it learns from them.

A worker gossips its queue and cache to every peer within ``heartbeat_min_ms`` of a change
(spaced further in a large cluster, see :func:`~compass.worker.membership.gossip_gap_s`) and
every ``heartbeat_ms`` regardless. Whether a peer is alive is not judged here but by the
failure detector's probes (:mod:`~compass.worker.members`); a heartbeat only counts if it is
of a live peer's current incarnation. Each heartbeat is also the worker core's periodic check
(``tick``): an idle worker warms its cache then.

:class:`Gossip` is also the worker core's :class:`~compass.worker.events.ViewPort`, and only
the core changes the view through it: a peer's heartbeat, a peer that drains, joins or is lost
are events of the core (:class:`~compass.worker.events.Heard` and its kin), which calls back
here. A snapshot counts this worker's own state exactly as it is at the snapshot's time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from compass.config import WorkerConfig
from compass.sched.candidates import PlanScope
from compass.sched.heartbeat import Heartbeat
from compass.sched.placement import Placement
from compass.sched.snapshot import ViewSnapshot
from compass.sched.view import ClusterView
from compass.worker.lanes import Lanes
from compass.worker.membership import Membership, gossip_gap_s
from compass.workflow.profile import Profiles

__all__ = ["Gossip", "Gossiped"]


class Gossiped(Protocol):
    """What a heartbeat says of a worker (its core): its lanes, queue and cache, and whether
    it measured its host-to-device bandwidth."""

    @property
    def lanes(self) -> Lanes: ...

    @property
    def h2d_measured(self) -> bool: ...


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
        clock: Callable[[], float],
        tick: Callable[[], None],
    ) -> None:
        self.name = name
        self._config = config
        self._profiles = profiles
        self._clock = clock
        self._tick = tick
        self._core: Gossiped | None = None
        #: the sequence number of the last heartbeat sent
        self._seq = 0
        #: this worker's incarnation, carried in its heartbeats
        self.incarnation = 0
        #: peers that said they drain, and the instance that did: out of the view (nothing new
        #: is placed there), their heartbeats still keep them alive
        self.draining: dict[str, str] = {}
        #: the peers the core was told of (the heartbeat gap, and so the settle time, grows
        #: with them)
        self._peers: set[str] = set()
        #: set when the queue or the cache changed since the last heartbeat
        self._changed = asyncio.Event()
        gap = self._gap_s(0)
        self.view = ClusterView(
            name, heartbeat_s=gap / config.time_scale, settle_s=self._settle_s(gap)
        )

    def attach(self, core: Gossiped) -> None:
        """Gossip ``core``'s state: its lanes, its cache, what it measured."""
        self._core = core

    # -- the core's ViewPort -------------------------------------------------------------------
    def snapshot(
        self, now: float, without: str = "", priority: int = 0, scope: PlanScope | None = None
    ) -> ViewSnapshot:
        # the full mesh: every peer is heard, so every snapshot shows all of them (``scope``
        # is for a view that plans over candidates)
        self.view.update_self(self.own_state(now))
        return self.view.snapshot(now, without, priority)

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        self.view.note_placement(worker, placed, now)

    def remove(self, worker: str) -> None:
        self.draining.pop(worker, None)
        self._peers.discard(worker)
        self._resettle()
        self.view.remove(worker)

    def heard(self, heartbeat: Heartbeat, now: float) -> bool:
        return heartbeat.name not in self.draining and self.view.apply_heartbeat(heartbeat, now)

    def drain(self, worker: str, instance: str) -> None:
        if worker != self.name:
            self.draining[worker] = instance
            self.view.remove(worker)

    def joined(self, worker: str, instance: str) -> None:
        if self.draining.get(worker, instance) != instance:
            del self.draining[worker]  # a new instance under the drained one's name
        self._peers.add(worker)
        self._resettle()

    def _resettle(self) -> None:
        """The view counts a placement for two heartbeat gaps, which grow with the peers."""
        self.view.settle_s = self._settle_s(self._gap_s(len(self._peers)))

    # -- this worker's state -------------------------------------------------------------------
    def own_state(self, now: float) -> Heartbeat:
        """This worker's state at ``now``, as its next heartbeat would say it."""
        core = self._core
        assert core is not None, "attach the core first"
        lanes, cache = core.lanes, core.lanes.cache
        h2d = self._profiles.h2d_bytes_per_s(self.name) if core.h2d_measured else 0.0
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
            seq=self._seq,
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
        while True:
            self._changed.clear()
            self.incarnation = membership.incarnation  # raised when it rejoins (membership.py)
            self._seq += 1
            state = self.own_state(self._clock())
            self.view.update_self(state)
            self._tick()  # an idle worker warms its cache (the core decides)
            peers = len(membership.peers)
            if peers:
                membership.broadcast("heartbeat", state.to_wire())
            min_gap = self._gap_s(peers)
            interval = max(sched.heartbeat_ms / 1000.0, min_gap)
            await asyncio.sleep(min_gap)
            if not self._changed.is_set() and interval > min_gap:
                timer = loop.call_later(interval - min_gap, self._changed.set)
                try:
                    await self._changed.wait()
                finally:
                    timer.cancel()

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
