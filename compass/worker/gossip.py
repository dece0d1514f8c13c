"""A worker's side of the shared view: its :class:`ClusterView`, the states it sends, the ones
it receives, and what it learns from them.

Two views, :attr:`~compass.config.SchedConfig.view`:

- ``bounded`` (the default): a planner plans each job over its candidates
  (:mod:`compass.sched.candidates`: itself, the holders of the job's inputs, a few holders of
  each model it needs and ``candidates`` more sampled), and watches their load: each
  candidate sends it its state when that changes, for a lease the planner renews while it
  keeps planning there. The cache of every worker reaches every other as rumors, a few a
  period to a few peers, passed on (:mod:`compass.gossip.spread`). A worker's messages grow
  with the planners that place on it, not with the cluster; an idle cluster sends only
  rumors and the failure detector's probes.
- ``mesh``: a worker sends its state to every peer within ``heartbeat_min_ms`` of a change
  (spaced further in a large cluster, see :func:`~compass.gossip.spread.gossip_gap_s`)
  and every ``heartbeat_ms`` regardless, and a planner sees every worker.

Whether a peer is alive is not judged here but by the failure detector's probes
(:mod:`~compass.membership.table`); a state only counts if it is of a live peer's current
incarnation. At each change, and every ``heartbeat_ms`` (mesh) or 100 ms (bounded) regardless,
the loop also runs the worker core's periodic check (``tick``): an idle worker warms its cache
then.

:class:`Gossip` runs the loops; the view itself is its :attr:`~Gossip.port`
(:class:`~compass.gossip.port.GossipPort`, sans-IO), the worker core's
:class:`~compass.core.events.ViewPort`, and only the core changes it: a peer's state, a peer
that drains, joins or is lost are events of the core (:class:`~compass.core.events.Heard` and
its kin), which calls the port; the watches a plan wants are the core's
:class:`~compass.core.events.Watch` instructions, carried out here (:meth:`Gossip.watch`). A
snapshot counts this worker's own state exactly as it is at the snapshot's time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping
from time import monotonic as _now
from typing import Any

from compass.config import WorkerConfig
from compass.gossip.port import Gossiped, GossipPort
from compass.gossip.spread import (
    MAX_RUMORS,
    cache_changed,
    gossip_gap_s,
    sync_period_s,
)
from compass.sched.heartbeat import Heartbeat
from compass.worker.membership import Membership
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles
from compass.workflow.versions import AppStamp

__all__ = ["Gossip", "Gossiped"]


#: in a bounded view, with nothing to send, the core's periodic check runs this often (the
#: mesh runs it at each heartbeat)
_IDLE_CHECK_S = 0.1
#: states of workers not yet peers kept until they join, at most (the oldest go first)
MAX_EARLY = 1024


class Gossip:
    """The state messages of worker ``name`` and the loops that send them; the view itself,
    which only the core changes, is :attr:`port` (see the module docstring)."""

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
        self._clock = clock
        self._tick = tick
        #: the core's view port: the view, the candidates' sampling, the watches' leases
        self.port = GossipPort(name, config, profiles=profiles)
        self._profiles = profiles
        #: the loop's timing and peer choice (the port samples candidates with its own)
        self._rng = random.Random(f"gossip:{name}")
        self._rumored: Heartbeat | None = None  # the last rumor this worker started of itself
        self._caught_up = False  # asked a peer for its whole view (when the first one joined)
        self._drains = False  # this worker drains: a watch is answered with that
        #: the newest state of each worker heard before it was a peer here (see
        #: :meth:`keep_early`): heard again when it joins
        self._early: dict[str, Heartbeat] = {}
        self._membership: Membership | None = None  # while running
        #: whether the queue or the cache changed since the last state sent, and the loop's
        #: wake-up (a change, or its timer)
        self._dirty = True
        self._wake = asyncio.Event()

    def attach(self, core: Gossiped) -> None:
        """Gossip ``core``'s state: its lanes, its cache, what it measured."""
        self.port.attach(core)

    def stamp(self, workflows: Mapping[str, Workflow], weights: Mapping[str, str]) -> AppStamp:
        """The stamp of the app this worker serves (``weights``: each model's digest), which it
        joins under; its heartbeats say the stamp's version from now on, and its view keeps
        workers of another version apart (:mod:`compass.workflow.versions`). Once, at start,
        before any peer is heard."""
        stamp = AppStamp.of(workflows, weights)
        self.port.version = stamp.version
        return stamp

    def own_state(self, now: float) -> Heartbeat:
        """This worker's state at ``now``, as its next heartbeat would say it."""
        return self.port.own_state(now)

    def _next_state(self) -> Heartbeat:
        """This worker's state now, under the next sequence number (each one sent is newer)."""
        return self.port.next_state(self._clock())

    def changed(self) -> None:
        """The queue or the cache changed: gossip it at the next gap."""
        self._dirty = True
        self._wake.set()

    # -- a bounded view: watches and rumors ----------------------------------------------------
    def watch(self, peers: Iterable[str]) -> list[str]:
        """Ask each of ``peers``, whose load this worker's plans need, to send it its state
        for a lease (the core's :class:`~compass.core.events.Watch`). The peers it could not
        ask now (no channel) are returned: the core hears of them as an event."""
        membership = self._membership
        if membership is None:
            return []
        body = {"name": self.name, "for_ms": self.port.watching.lease_s * 1000.0}
        return [peer for peer in peers if not membership.channels.send(peer, "watch", body)]

    def keep_early(self, state: Heartbeat, membership: Membership) -> None:
        """``state`` is of no peer yet: keep the newest of each worker until it joins. A
        worker a peer took in sends it its state as it answers the join, and in a bounded
        view nothing more until it changes: heard before the answer, it was lost, and the
        peer planned without it until a sync (seconds) brought it."""
        if state.name in membership.channels.peers:
            return  # of an older incarnation of a live peer: stale
        old = self._early.get(state.name)
        if old is not None and (old.incarnation, old.seq) >= (state.incarnation, state.seq):
            return
        if old is None and len(self._early) >= MAX_EARLY:
            del self._early[next(iter(self._early))]  # the one kept longest
        self._early[state.name] = state

    def take_early(self, worker: str) -> Heartbeat | None:
        """``worker`` joined: the state kept of it before (:meth:`keep_early`), if any."""
        return self._early.pop(worker, None)

    def tell_draining(self, membership: Membership) -> None:
        """This worker drains: the planners that may place here hear it, so that they place
        nothing new. The mesh tells every peer. A bounded view tells the peers a channel is
        open to and its watchers (the planners placing here), and answers each later watch
        with it (:meth:`watched_by`): it dials no one else, as a thousand workers would
        cost a thousand dials. A planner it does not reach may still place a task here
        before it asks: a draining worker runs it."""
        body = {"name": self.name}
        if self.port.rule is None:
            membership.channels.broadcast("drain", body)
            return
        self._drains = True
        membership.channels.tell_connected("drain", body)
        for peer in self.port.watchers.live(_now()):
            if membership.channels.channel(peer) is None:
                membership.channels.send(peer, "drain", body)

    def watched_by(self, peer: str, for_ms: float) -> None:
        """``peer`` watches this worker's load for ``for_ms``: it gets this worker's state now,
        and each change until then (a draining worker tells it that instead)."""
        membership = self._membership
        if membership is None or peer not in membership.channels.peers or self.port.rule is None:
            return
        if self._drains:
            membership.channels.send(peer, "drain", {"name": self.name})
            return
        self.port.watchers.watch(peer, _now() + min(for_ms, 60_000.0) / 1000.0)
        membership.channels.send(peer, "heartbeat", self._next_state().to_wire())

    def introduce(self, peer: str) -> None:
        """A peer joined: it gets this worker's state at once (a bounded view sends it
        nothing else until it watches this worker; rumors bring the rest). A worker that has
        heard of no peer yet (it is joining) asks the first for every state it holds."""
        membership = self._membership
        if membership is None or self.port.rule is None:
            return
        if self._caught_up:
            membership.channels.send(peer, "heartbeat", self._next_state().to_wire())
        else:
            self._caught_up = True
            self._sync(peer, membership, ask=True)

    def sync_asked(self, peer: str) -> None:
        """``peer`` joined and asks for every state this worker holds."""
        membership = self._membership
        if membership is None or self.port.rule is None:
            return
        if peer in membership.channels.peers:
            self._sync(peer, membership)

    def rumor_heard(self, state: Heartbeat) -> None:
        """``state`` came as a rumor and the core took it as news of a live peer: pass it on."""
        membership = self._membership
        members = 1 if membership is None else len(membership.channels.peers) + 1
        self.port.rumors.heard(state, members)

    # -- sending -------------------------------------------------------------------------------
    async def run(self, membership: Membership) -> None:
        """Send this worker's state (to every peer, or in a bounded view to its watchers, and
        as rumors) and run the core's periodic check. Runs until cancelled."""
        self._membership = membership
        try:
            if self.port.rule is None:
                await self._run_mesh(membership)
            else:
                await asyncio.gather(self._run_bounded(membership), self._run_rumors(membership))
        finally:
            self._membership = None

    async def _run_mesh(self, membership: Membership) -> None:
        """To every peer within the gap of a change, and every ``heartbeat_ms`` regardless."""
        sched = self._config.sched
        while True:
            self._dirty = False
            # raised when it rejoins (membership.py)
            self.port.incarnation = membership.table.incarnation
            state = self._next_state()
            self._tick()  # an idle worker warms its cache (the core decides)
            peers = len(membership.channels.peers)
            if peers:
                membership.channels.broadcast("heartbeat", state.to_wire())
            min_gap = self.port.gap_s(peers)
            await asyncio.sleep(min_gap)
            await self._changed_or(max(sched.heartbeat_ms / 1000.0, min_gap) - min_gap)

    async def _run_bounded(self, membership: Membership) -> None:
        """To the watchers within the gap of a change; the core's check at each change, and
        every 100 ms (or ``heartbeat_ms`` if longer) regardless; a rumor of this worker when its
        cache changed."""
        sched = self._config.sched
        changed = True
        while True:
            self._tick()  # an idle worker warms its cache (the core decides)
            watchers = self.port.watchers.live(_now())
            gap = gossip_gap_s(sched.heartbeat_min_ms / 1000.0, len(watchers),
                               sched.heartbeat_max_rate)  # fmt: skip
            if changed or self.port.incarnation != membership.table.incarnation:
                self.port.incarnation = membership.table.incarnation  # raised when it rejoins
                state = self._next_state()
                if watchers:
                    body = state.to_wire()
                    for peer in watchers:
                        membership.channels.send(peer, "heartbeat", body)
                if cache_changed(self._rumored, state):
                    self._start_rumor(state, membership)
                await asyncio.sleep(gap)
            changed = await self._changed_or(max(sched.heartbeat_ms / 1000.0, _IDLE_CHECK_S))

    def _start_rumor(self, state: Heartbeat, membership: Membership) -> None:
        self._rumored = state
        self.port.rumors.heard(state, len(membership.channels.peers) + 1)

    async def _run_rumors(self, membership: Membership) -> None:
        """Every ``rumor_ms`` (jittered), rumors to ``rumor_fanout`` peers picked at random;
        every ``sync_ms`` (times n / 32 past 32 workers, so that the states a worker sends
        and receives in syncs do not grow with the cluster), every state this worker holds
        to one peer picked at random."""
        sched = self._config.sched
        period_s = sched.rumor_ms / 1000.0
        next_sync = _now() + sched.sync_ms / 1000.0
        while True:
            await asyncio.sleep(period_s * (0.5 + self._rng.random()))  # no lockstep
            peers = list(membership.channels.peers)
            if not peers:
                continue
            if _now() >= next_sync:
                self._sync(self._rng.choice(peers), membership)
                next_sync = _now() + sync_period_s(sched.sync_ms, len(peers) + 1)
            if not self.port.rumors.pending():
                continue
            for peer in self._rng.sample(peers, min(sched.rumor_fanout, len(peers))):
                states = self.port.rumors.take()
                if not states:
                    break
                membership.channels.send(peer, "rumors", {"s": [s.to_wire() for s in states]})

    def _sync(self, peer: str, membership: Membership, *, ask: bool = False) -> None:
        """Every state this worker's view holds (its own fresh), to ``peer``: it takes what is
        newer than what it holds, and passes none of it on; with ``ask``, it answers with
        every state it holds."""
        view = self.port.view
        states = [self._next_state()]
        states += [s for n in view.names() if n != self.name and (s := view.get(n))]
        for i in range(0, len(states), MAX_RUMORS):
            chunk = [s.to_wire() for s in states[i : i + MAX_RUMORS]]
            body: dict[str, Any] = {"s": chunk, "sync": True}
            if ask and i == 0:
                body["ask"] = True
            membership.channels.send(peer, "rumors", body)

    async def _changed_or(self, timeout_s: float) -> bool:
        """Wait until the state changes or ``timeout_s`` passes; whether it changed since the
        last call (a change while the timer fired still counts)."""
        if not self._dirty and timeout_s > 0:
            timer = asyncio.get_running_loop().call_later(timeout_s, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
        self._wake.clear()
        dirty, self._dirty = self._dirty, False
        return dirty

    # -- for status ----------------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        """Each worker's state as this worker's view holds it; ages and waits are in this
        worker's clock (workload time for an emulated worker)."""
        now = self._clock()
        watched = set(self.port.watching.watched(_now()))
        rows = []
        for name in self.port.view.names():
            state = self.port.view.get(name)
            assert state is not None
            rows.append(
                {
                    "name": name,
                    "wait_ms": round(state.wait_s * 1000, 3),
                    "models": sorted(state.models),
                    "loading": sorted(state.loading),
                    "free_bytes": state.free_bytes,
                    "h2d_gbps": round(self._profiles.h2d_bytes_per_s(name) / 1e9, 4),
                    "version": state.version,
                    # the task times it learned, as this worker plans with them
                    "learned": [
                        {"workflow": wf, "task": task, "ms": round(seconds * 1000, 3), "runs": n}
                        for wf, task, seconds, n in self._profiles.learned_of(name)
                    ],
                    # the choices it learned that moved a likely path (as its heartbeat said)
                    "choices": [
                        self._choice(wf, task, option) for wf, task, option in state.choices
                    ],
                    "age_ms": round(self.port.view.age_s(name, now) * 1000, 3),
                    "placements_counted": self.port.view.pending(name),
                    "watched": name in watched or self.port.rule is None,
                }
            )
        return rows

    def _choice(self, workflow: str, task: str, option: int) -> dict[str, str]:
        label = self._profiles.choices.label(workflow, task, option)
        return {"workflow": workflow, "task": task, "likely": label}

    def summary(self) -> dict[str, Any]:
        """The view's kind and what a bounded one spreads: ``compass status``'s ``view``."""
        now = _now()
        return {
            "kind": "mesh" if self.port.rule is None else "bounded",
            # the version of this worker's weights, and the workers of another kept apart
            "version": self.port.version,
            "apart": dict(sorted(self.port.apart.items())),
            "watchers": sorted(self.port.watchers.live(now)),
            "watching": sorted(self.port.watching.watched(now)),
            "rumors_pending": self.port.rumors.pending(),
        }
