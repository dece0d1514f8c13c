"""The worker core's :class:`~compass.core.events.ViewPort` over the live view: what a worker
knows of the cluster's load and caches, as the core reads and changes it. Sans-IO.

Only the core changes it, inside :meth:`WorkerCore.handle <compass.core.state.WorkerCore.handle>`,
and nothing in it reads a clock, samples with a shared random generator or does I/O:

- **time comes from the event**: every method takes the event's ``now`` (the core's clock:
  workload time on an emulated worker, ``time_scale`` real seconds per unit); leases of
  watches are kept in real seconds, ``now * time_scale``;
- **candidates are sampled with the port's own generator**, seeded by the worker's name, that
  nothing else draws from (the gossip loop's timing and peer choice have their own), so the
  same events sample the same candidates;
- **watches are instructions**: a plan over candidates whose lease runs out soon leaves them
  in :meth:`take_wanted`, which the core turns into a
  :class:`~compass.core.events.Watch` instruction that the adapter carries out; a watch it
  could not send comes back as an event (:class:`~compass.core.events.WatchFailed`).

The gossip loop (:class:`compass.worker.gossip.Gossip`) sends what the port holds: this
worker's state (:meth:`next_state`) to its watchers and as rumors; it changes no more of the
port than its own bookkeeping of sends (sequence numbers, watchers' leases, rumors taken),
which no decision of the core reads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Protocol

from compass.config import WorkerConfig
from compass.core.lanes import Lanes
from compass.core.replica import COLD_S, recent_models
from compass.gossip.spread import Rumors, Watchers, Watching, gossip_gap_s
from compass.sched.candidates import CandidateRule, PlanScope, candidates
from compass.sched.heartbeat import (
    DEGRADED_WAIT_S,
    MAX_RECENT,
    NO_BATCHES,
    CacheHeld,
    Heartbeat,
    LaneLoad,
    Serving,
)
from compass.sched.placement import Placement
from compass.sched.snapshot import ViewSnapshot
from compass.sched.view import ClusterView
from compass.workflow import versions
from compass.workflow.profile import Profiles

__all__ = ["GossipPort", "Gossiped"]


class Gossiped(Protocol):
    """What a heartbeat says of a worker (its core): its lanes, queue and cache, and whether
    it measured its host-to-device bandwidth."""

    @property
    def lanes(self) -> Lanes: ...

    @property
    def h2d_measured(self) -> bool: ...


class GossipPort:
    """The view of worker ``name`` and the state it gossips; see the module docstring."""

    def __init__(self, name: str, config: WorkerConfig, *, profiles: Profiles) -> None:
        self.name = name
        self._config = config
        self._profiles = profiles
        self._scale = config.time_scale
        self._core: Gossiped | None = None
        sched = config.sched
        #: the candidate rule of a bounded view (None: the mesh; also for the ``central``
        #: policy, whose one planner plans every job and so must see every worker)
        self.rule = (
            CandidateRule(sched.candidates, sched.holders or None, sched.explore)
            if sched.view == "bounded" and sched.policy != "central"
            else None
        )
        #: samples the candidates, and nothing else: seeded by the name, so a replay samples
        #: the same
        self._rng = random.Random(f"candidates:{name}")
        #: who watches this worker's load, whose load it watches, and the rumors it passes on
        self.watchers = Watchers()
        self.watching = Watching(sched.watch_ms / 1000.0)
        self.rumors = Rumors()
        #: candidates to ask for a watch (:meth:`take_wanted`), in the order first wanted
        self._wanted: dict[str, None] = {}
        #: the sequence number of the last state sent, and this worker's incarnation
        self.seq = 0
        self.incarnation = 0
        #: peers that said they drain, and the instance that did: out of the view (nothing new
        #: is placed there), their heartbeats still keep them alive
        self.draining: dict[str, str] = {}
        #: the version of this worker's weights (:mod:`compass.workflow.versions`; "": not
        #: known, which keeps nobody apart), and the peers heard with another one: kept out of
        #: the view, so no job planned here runs a task there (a rolling upgrade's two sides)
        self.version = ""
        self.apart: dict[str, str] = {}
        #: a model a task began with here within this many seconds is one it gossips as
        #: ``recent`` (the hot-model rule's ``cold_s``: hot is what is not cold somewhere)
        self.recent_s = COLD_S if config.replicate is None else config.replicate.cold_s
        #: the peers the core was told of, and their instances (the heartbeat gap, and so the
        #: settle time, grows with them in the mesh; a new instance holds no watch)
        self._peers: dict[str, str] = {}
        gap = self.gap_s(0)
        self.view = ClusterView(
            name, heartbeat_s=gap / config.time_scale, settle_s=self._settle_s(gap)
        )

    def attach(self, core: Gossiped) -> None:
        """Gossip ``core``'s state: its lanes, its cache, what it measured."""
        self._core = core

    def real_s(self, now: float) -> float:
        """``now`` (the core's clock) in real seconds, the clock of watch leases."""
        return now * self._scale

    # -- the core's ViewPort -------------------------------------------------------------------
    def snapshot(
        self, now: float, without: str = "", priority: int = 0, scope: PlanScope | None = None
    ) -> ViewSnapshot:
        self.view.update_self(self.own_state(now))
        rule = self.rule
        # a bounded view hears a peer when it changes, not every few ms: its queue has run
        # since (aged)
        full = self.view.snapshot(now, without, priority, aged=rule is not None)
        if rule is None or scope is None:
            return full  # the mesh: every peer is heard, so every snapshot shows all of them
        if self.name not in scope.keep:  # the core's scopes name it: no new scope per job
            scope = PlanScope(scope.workflow, (*scope.keep, self.name))
        real = self.real_s(now)
        fresh = self.watching.watched(real)  # sampled first: their load is pushed here
        among = candidates(full, scope, rule, self._rng, fresh)
        due = self.watching.due((w for w in among if w != self.name), real)
        if due:
            self._wanted.update(dict.fromkeys(due))
        return full if len(among) == len(full) else full.subset(among)

    def take_wanted(self) -> tuple[str, ...]:
        """The candidates to ask for a watch since the last call (the core's
        :class:`~compass.core.events.Watch`), and forget them."""
        if not self._wanted:
            return ()
        wanted, self._wanted = tuple(self._wanted), {}
        return wanted

    def watch_failed(self, peer: str) -> None:
        """A watch could not be asked of ``peer`` (no channel now): ask again at the next plan
        that samples it."""
        self.watching.drop(peer)

    @property
    def version_id(self) -> int:
        return versions.version_id(self.version)

    def other_version(self, worker: str) -> None:
        # what the view holds of it was heard under this worker's version (its instance before
        # a restart); its next heartbeat says which it serves now (:meth:`heard`)
        self.view.remove(worker)

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        self.view.note_placement(worker, placed, now)

    def remove(self, worker: str) -> None:
        self.draining.pop(worker, None)
        self.apart.pop(worker, None)
        self._peers.pop(worker, None)
        self.watchers.drop(worker)
        self.watching.drop(worker)
        self.rumors.forget(worker)
        self._resettle()
        self.view.remove(worker)

    def heard(self, heartbeat: Heartbeat, now: float) -> bool:
        if heartbeat.version != self.version and heartbeat.version and self.version:
            if self.apart.get(heartbeat.name) != heartbeat.version:
                self.apart[heartbeat.name] = heartbeat.version
                self.view.remove(heartbeat.name)  # what it held under this worker's version
            return False
        if self.apart:
            self.apart.pop(heartbeat.name, None)  # upgraded to this worker's side since
        return heartbeat.name not in self.draining and self.view.apply_heartbeat(heartbeat, now)

    def drain(self, worker: str, instance: str) -> None:
        if worker != self.name:
            self.draining[worker] = instance
            self.view.remove(worker)

    def joined(self, worker: str, instance: str) -> None:
        if self.draining.get(worker, instance) != instance:
            del self.draining[worker]  # a new instance under the drained one's name
        if self._peers.get(worker, instance) != instance:
            self.watchers.drop(worker)  # a new instance: it holds no lease, nor do we at it
            self.watching.drop(worker)
        self._peers[worker] = instance
        self._resettle()

    def _resettle(self) -> None:
        """The view counts a placement for two heartbeat gaps, which grow with the peers."""
        self.view.settle_s = self._settle_s(self.gap_s(len(self._peers)))

    # -- this worker's state -------------------------------------------------------------------
    def own_state(self, now: float, recent: bool = False) -> Heartbeat:
        """This worker's state at ``now``, as its next heartbeat would say it; ``recent``: with
        the models it uses (the heartbeat's, and the hot-model rule's; a job's plan does not
        read them, so a snapshot's state leaves out their walk of the queue)."""
        core = self._core
        assert core is not None, "attach the core first"
        lanes, cache = core.lanes, core.lanes.cache
        h2d = self._profiles.h2d_bytes_per_s(self.name) if core.h2d_measured else 0.0
        wait_s = lanes.wait_s(now)
        lifted_s = lanes.queue.lifted_s(now)
        if lanes.degraded:
            # a degraded worker takes no GPU work: no batch there to join either
            wait_s += DEGRADED_WAIT_S
            lifted_s = tuple(w + DEGRADED_WAIT_S for w in lifted_s)
            batches: Mapping[str, tuple[int, float]] = NO_BATCHES
        else:
            wait_s += 0.0  # a float, as the heartbeat's checks made it
            batches = lanes.batchable(now)
        # built once per change of the cache, not per job (a walk of every cached model)
        models, loading = cache.residency()
        used = (
            recent_models(lanes.used, lanes.queue.upcoming_models(), now, self.recent_s, MAX_RECENT)
            if recent
            else frozenset()
        )
        return Heartbeat.own(
            self.name,
            self.seq,
            self.incarnation,
            LaneLoad(wait_s, lifted_s, lanes.lanes, lanes.busy, batches),
            CacheHeld(models, loading, cache.free_bytes(), cache.capacity_bytes(), h2d, used),
            Serving(
                self.version, self._profiles.learned_of(self.name), self._profiles.choices.spread()
            ),
        )

    def next_state(self, now: float) -> Heartbeat:
        """This worker's state at ``now`` under the next sequence number (each one sent is
        newer)."""
        self.seq += 1
        state = self.own_state(now, recent=True)
        self.view.update_self(state)
        return state

    # -- timing --------------------------------------------------------------------------------
    def gap_s(self, peers: int) -> float:
        """Real seconds at least between two heartbeats with ``peers`` peers."""
        sched = self._config.sched
        return gossip_gap_s(sched.heartbeat_min_ms / 1000.0, peers, sched.heartbeat_max_rate)

    def _settle_s(self, gap_s: float) -> float:
        """How long the view counts a placement: changes are gossiped within ``gap_s``, so a
        heartbeat received two gaps after a placement reflects it (in the view's clock)."""
        return 2.0 * gap_s / self._config.time_scale
