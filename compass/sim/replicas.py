"""Hot models replicated ahead of need in the simulator (:mod:`compass.elastic.replicate`).

:func:`replicate_round` is one round of the rule over simulated workers, as the elastic
simulator runs it at each of its control steps and :class:`Replication` every
:data:`~compass.elastic.replicate.REPLICATE_EVERY_S` of a plain ``compass sim`` (off by default,
as on a real worker: ``SimSettings.replicate``, ``compass sim --replicate``). The rule reads
each worker's state as its next heartbeat would say it (its queue wait, the models resident or
loading there, those it uses), exact: the simulator does not model the view's watches for it,
only their result. The copy is the worker core's own speculative load (``Tick.hot``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from compass.core.events import Event, Tick
from compass.core.lanes import Lanes
from compass.core.replica import recent_models
from compass.elastic import replicate
from compass.elastic.replicate import Holding, ReplicaConfig, Replicator
from compass.sched.heartbeat import MAX_RECENT
from compass.sim.arrivals import Arrival
from compass.sim.result import JobRecord
from compass.workflow.spec import Workload

__all__ = ["Replication", "Simulated", "replicate_round"]


class SimWorker(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def lanes(self) -> Lanes: ...


class Simulated(Protocol):
    """What the rule reads of a simulation and does through it
    (:class:`~compass.sim.engine.Simulation`'s public side)."""

    @property
    def now(self) -> float: ...

    @property
    def workers(self) -> Sequence[SimWorker]: ...

    @property
    def positions(self) -> Mapping[str, int]: ...

    @property
    def workload(self) -> Workload: ...

    @property
    def has_jobs(self) -> bool: ...

    def apply(self, index: int, event: Event) -> None: ...

    def schedule(
        self, t: float, handler: Callable[[Any], None], arg: Any, *, background: bool = False
    ) -> None: ...

    def best_s(self, workflow: str) -> float: ...

    def entry_of(self, arrival: Arrival) -> int: ...


def replicate_round(
    sim: Simulated, rule: Replicator, slack_s: float, serving: Iterable[int]
) -> int:
    """One round of ``rule`` at ``sim``'s now over its ``serving`` workers (their numbers):
    the copies it began (a worker's core may decline one)."""
    now = sim.now
    cold_s = rule.config.cold_s
    holdings = []
    for i in serving:
        lanes = sim.workers[i].lanes
        resident, loading = lanes.cache.residency()
        recent = recent_models(
            lanes.used, lanes.queue.upcoming_models(), now, cold_s, MAX_RECENT
        )  # as its heartbeat says
        holdings.append(Holding(sim.workers[i].name, lanes.wait_s(now), resident | loading,
                                bool(loading), recent))  # fmt: skip
    begun = 0
    for name, model in rule.step(now, holdings, replicate.hot_models(holdings), slack_s):
        i = sim.positions[name]
        spare = replicate.spare_models(holdings, name, model)
        sim.apply(i, Tick(now, hot=model, cold_s=cold_s, spare=spare))
        begun += sim.workers[i].lanes.cache.is_loading(model)
    return begun


class Replication:
    """The rule in a plain simulation, as the engine's hooks
    (:class:`~compass.sim.hooks.SimHooks`): a round every ``every_s`` of simulated time from
    the first arrival, as a real worker's timer, in the background (the run ends when nothing
    else is left to happen: a round never makes it longer); jobs enter where the engine's
    ingress setting says. The slack is a real worker's: the mean over the workload's
    workflows of ``MAX_SLOWDOWN - 1`` times their best times
    (:func:`~compass.elastic.replicate.objective_slack_s`)."""

    def __init__(self, config: ReplicaConfig, every_s: float = replicate.REPLICATE_EVERY_S) -> None:
        self.rule = Replicator(config)
        self.every_s = every_s
        #: copies of hot models begun
        self.copies = 0
        self._sim: Simulated | None = None
        self._slack_s = 0.0
        self._started = False

    def attach(self, sim: Simulated) -> None:
        """Run over ``sim`` (before it runs)."""
        self._sim = sim
        self._slack_s = replicate.objective_slack_s([sim.best_s(w) for w in sim.workload.workflows])

    def began(self) -> None:
        pass

    def entry(self, arrival: Arrival) -> int:
        sim = self._sim
        assert sim is not None, "attach the simulation first"
        if not self._started:
            self._started = True
            sim.schedule(sim.now + self.every_s, self._round, None, background=True)
        return sim.entry_of(arrival)

    def may_tick(self, index: int) -> bool:
        return True

    def recorded(self, record: JobRecord) -> None:
        pass

    def _round(self, _: object) -> None:
        sim = self._sim
        assert sim is not None
        self.copies += replicate_round(sim, self.rule, self._slack_s, range(len(sim.workers)))
        sim.schedule(sim.now + self.every_s, self._round, None, background=True)
