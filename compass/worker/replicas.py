"""Hot models replicated ahead of need on a running worker (off by default; ``compass worker
start --replicate`` turns it on): the rule of :mod:`compass.elastic.replicate`, fed from
this worker's view.

Every :data:`REPLICATE_EVERY_S` of the worker's clock (the simulator's control period) the
worker builds the rule's :class:`~compass.elastic.replicate.Holding` of every serving worker
from what its view holds, as the desired worker count does (:mod:`compass.elastic.live`): its
own state as its next heartbeat would say it, and each peer's last heartbeat (its queue wait,
the models it holds or loads). It asks :func:`~compass.elastic.replicate.replicas_wanted` which
``(worker, model)`` pairs to warm, and acts only on those that name itself: it feeds its own
core ``Tick(now, hot=model)``, a speculative load that evicts only models colder than the one
warmed (:mod:`compass.core.replica`). Every worker runs the same deterministic rule, with the
same memory of cool-downs (:class:`~compass.elastic.replicate.Replicator`), over the same
gossiped view, so they agree on who warms what without a controller; where two views differ
for a round, at worst two workers warm the same model, and the copy nobody uses is evicted
later by the cache's LRU order.

The hot set is the models the cluster uses (:func:`~compass.elastic.replicate.hot_models`):
every worker's heartbeat names the models its running and queued tasks need and those a task
began with there within ``cold_s`` (``recent``), so a model held but unused is never warmed,
however long its holders queue for another one. A peer that predates the field names none:
the models only it uses are not hot (the rule warms less, never a wrong model).

A peer's ``recent`` models count only as heard within ``cold_s`` (of this worker's clock): they
say what it used within ``cold_s`` before it sent them, so an older state says nothing of
now. In the mesh every state is a heartbeat old; in a bounded view a peer this worker does not
watch is heard only through rumors and syncs, and its word of a model in use would otherwise
stand however long ago the use.

In a bounded view (the default) a worker hears a peer's load only if it watches it, and a
worker with headroom plans nothing the holders run: while it could be picked, and while the
cluster uses a model it does not hold, it watches the holders of the models it does not hold
(at most :data:`MAX_WATCHED`, by name, so workers watch the same ones), through a lease of its
own that the planner's candidate sampling does not read. With nothing in use that it lacks,
it renews no lease and those it holds run out (``lease_s``), so an idle cluster is as silent
with the rule as without it; it watches again once it hears a model in use: a job of its
own, a holder's state it watches, or a peer's rumor (a load) or sync. In the mesh every worker
hears every load anyway, and watches nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from compass.app import App
from compass.core.events import Event, Tick
from compass.elastic.replicate import (
    REPLICATE_EVERY_S,
    Holding,
    ReplicaConfig,
    Replicator,
    hot_models,
    spare_models,
)
from compass.elastic.replicate import objective_slack_s as slack_of
from compass.gossip.spread import Watching
from compass.sched.heartbeat import Heartbeat
from compass.sched.view import ClusterView
from compass.worker.gossip import Gossip
from compass.workflow.best import best_time_s
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = [
    "MAX_WATCHED",
    "REPLICATE_EVERY_S",
    "HotReplicas",
    "Replicated",
    "holdings",
    "objective_slack_s",
    "warm_here",
]

log = logging.getLogger("compass.worker")

#: peers a worker with headroom watches at most for their load (a bounded view)
MAX_WATCHED = 8


def holdings(
    own: Heartbeat, peers: Iterable[Heartbeat], stale: Collection[str] = ()
) -> list[Holding]:
    """The rule's workers: this one (``own``, its state now) and each peer by its last
    heartbeat; a worker holds the models resident or loading there, is loading while any
    load is under way, and uses the models its state names as recent, unless it is ``stale``
    (heard too long ago to say what it uses now: it uses none)."""
    states = [own, *(p for p in peers if p.name != own.name)]
    return [
        Holding(
            s.name, s.wait_s, s.models | s.loading, bool(s.loading),
            frozenset() if s.name in stale else s.recent,
        )
        for s in states
    ]  # fmt: skip


def warm_here(
    name: str,
    workers: Sequence[Holding],
    slack_s: float,
    rule: Replicator,
    now: float,
) -> list[str]:
    """The models ``rule`` picks worker ``name`` to warm at ``now`` (at most one), of the
    models ``workers`` use (:func:`~compass.elastic.replicate.hot_models`): the pairs that
    name another worker are theirs to act on (the rule remembers them too, as theirs do:
    every worker's cool-downs agree)."""
    return [m for w, m in rule.step(now, workers, hot_models(workers), slack_s) if w == name]


def objective_slack_s(workflows: Iterable[Workflow], profiles: Profiles) -> float:
    """The queueing a job of ``workflows`` can take within its objective, by their best times
    here (:func:`compass.elastic.replicate.objective_slack_s`)."""
    return slack_of([best_time_s(wf, profiles) for wf in workflows])


class Replicated(Protocol):
    """What the rule reads of a worker and feeds it: its view and state (its gossip), its app
    and task times (the objective's slack), its core (``apply``)."""

    @property
    def name(self) -> str: ...

    @property
    def gossip(self) -> Gossip: ...

    @property
    def app(self) -> App: ...

    @property
    def profiles(self) -> Profiles: ...

    def apply(self, event: Event) -> None: ...


class HotReplicas(Collector):
    """One worker's side of the rule (module docstring): :meth:`step` is a round, :meth:`run`
    the timer. ``own_state(now)``: this worker's state now; ``view``: its view of the peers;
    ``apply``: feeds its core; ``watch(peers)``: asks peers for their load, answers those it
    could not ask (None: a mesh, nothing to ask)."""

    def __init__(
        self,
        name: str,
        config: ReplicaConfig,
        *,
        own_state: Callable[[float], Heartbeat],
        view: ClusterView,
        apply: Callable[[Tick], None],
        slack_s: Callable[[], float],
        watch: Callable[[list[str]], list[str]] | None = None,
        lease_s: float = 10.0,
    ) -> None:
        self.name = name
        self.config = config
        #: the rule and its memory (cool-downs), over this worker's view
        self.rule = Replicator(config)
        self._own_state = own_state
        self._view = view
        self._apply = apply
        self._slack_s = slack_s
        self._watch = watch
        self._watching = Watching(lease_s)
        self._asked: set[str] = set()  # peers with a lease asked, forgotten once gone
        #: loads this rule started here, by model (bounded by the app's models)
        self.warmed: dict[str, int] = {}
        #: rounds that failed (a bug: logged, counted, the next round runs)
        self.failures = 0

    def step(self, now: float, real_s: float | None = None) -> list[str]:
        """One round at ``now`` (the worker's clock): the models it started warming here.
        ``real_s``: real seconds now, the clock of watch leases (default ``now``)."""
        own = self._own_state(now)
        view = self._view
        peers = [s for n in view.names() if n != self.name and (s := view.get(n)) is not None]
        cold_s = self.config.cold_s
        stale = {s.name for s in peers if view.age_s(s.name, now) > cold_s}
        workers = holdings(own, peers, stale)
        slack = self._slack_s()
        if self._watch is not None:
            self._renew(workers, slack, now if real_s is None else real_s)
        started = []
        for model in warm_here(self.name, workers, slack, self.rule, now):
            spare = spare_models(workers, self.name, model)
            self._apply(Tick(now, hot=model, cold_s=self.config.cold_s, spare=spare))
            # the core may decline (a load under way, no room without evicting a model queued
            # or used lately): only a load begun counts, and the rule asks another next round
            if model in self._own_state(now).loading:
                self.warmed[model] = self.warmed.get(model, 0) + 1
                started.append(model)
                log.info("%s: warming %s ahead of need (its holders queue)", self.name, model)
        return started

    def _renew(self, workers: Sequence[Holding], slack_s: float, real_s: float) -> None:
        """Watch the holders of the models this worker could be picked for, while it could
        and the cluster uses a model it lacks; otherwise renew nothing (the leases run out)."""
        me = workers[0]
        if me.loading or not me.wait_s < self.config.headroom_fraction * slack_s:
            return
        if not hot_models(workers) - me.models:
            return  # nothing in use that a copy here could take: an idle cluster is silent
        for gone in self._asked - {w.name for w in workers}:
            self._watching.drop(gone)
            self._asked.discard(gone)
        holders = sorted({w.name for w in workers[1:] if w.models - me.models})[:MAX_WATCHED]
        due = self._watching.due(holders, real_s)
        if due and self._watch is not None:
            self._asked.update(due)
            for peer in self._watch(due):
                self._watching.drop(peer)  # no channel now: asked again next round

    async def run(
        self,
        clock: Callable[[], float],
        every_s: float,
        *,
        real: Callable[[], float],
        serving: Callable[[], bool],
        failed: Callable[[], None] = lambda: None,
    ) -> None:
        """A round every ``every_s`` real seconds while ``serving()`` (not draining); a round
        that fails is logged, counted here and told to ``failed`` (the worker counts it as an
        internal error), and the next one runs. Runs until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            if not serving():
                continue
            try:
                self.step(clock(), real())
            except Exception:
                self.failures += 1
                failed()
                log.exception("%s: a round of hot-model replication failed", self.name)

    def watching(self, real_s: float) -> list[str]:
        """The peers whose load this rule watches at ``real_s`` (real seconds): a lease it
        asked for holds (none in the mesh)."""
        return sorted(self._watching.watched(real_s))

    def describe(self, held: Iterable[str] = (), real_s: float = 0.0) -> dict[str, Any]:
        """What ``compass status`` shows: the copies warmed here, by model, and those of them
        still ``held`` (resident or loading); the peers it watches at ``real_s``."""
        kept = set(held)
        return {
            "warmed": sum(self.warmed.values()),
            "models": dict(sorted(self.warmed.items())),
            "held": sorted(m for m in self.warmed if m in kept),
            "failures": self.failures,
            "watching": self.watching(real_s),
        }

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "compass_replicas_warmed",
            "Copies of hot models this worker warmed ahead of need (--replicate), by model.",
            labels=["model"],
        )
        for model, count in sorted(self.warmed.items()):
            family.add_metric([model], count)
        yield family

    @classmethod
    def of_worker(cls, worker: Replicated, config: ReplicaConfig) -> HotReplicas:
        """The rule on ``worker``: its view, its core, its app's objective; a bounded view
        watches through its gossip."""
        port = worker.gossip.port
        workflows: Mapping[str, Workflow] = worker.app.workflows
        return cls(
            worker.name,
            config,
            own_state=lambda now: port.own_state(now, recent=True),
            view=port.view,
            apply=worker.apply,
            slack_s=lambda: objective_slack_s(workflows.values(), worker.profiles),
            watch=None if port.rule is None else worker.gossip.watch,
            lease_s=port.watching.lease_s,
        )
