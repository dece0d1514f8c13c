"""What a simulated worker sees of its peers (the simulator's
:class:`~compass.core.state.ViewPort`).

The cluster state (:mod:`compass.sim.state`) keeps what every worker has published; a
:class:`SimView` is one worker's window on it, as the real worker's view is: its peers as the
state says that worker sees them, itself exactly, and with a bounded view's candidate rule only
a job's candidates (:func:`~compass.sched.candidates.pick`), whose watch asks the traffic
counts (:mod:`compass.sim.traffic`).
"""

from __future__ import annotations

import random
from typing import Protocol

import numpy as np
import numpy.typing as npt

from compass.core.lanes import Lanes
from compass.sched import ViewSnapshot
from compass.sched.candidates import CandidateRule, PlanScope, pick
from compass.sched.heartbeat import Heartbeat
from compass.sched.placement import Placement
from compass.sim.state import ClusterState
from compass.sim.traffic import ViewTraffic

__all__ = ["SimView", "Simulated"]

IntpArray = npt.NDArray[np.intp]


class Simulated(Protocol):
    """The simulated worker a view belongs to: its position, name and lanes."""

    @property
    def index(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def lanes(self) -> Lanes: ...


class SimView:
    """A simulated worker's :class:`~compass.core.state.ViewPort`: its peers as
    :class:`ClusterState` says it sees them, itself exactly. With a candidate ``rule`` (a
    bounded view), a snapshot for a job shows only that job's candidates, sampled by a
    generator of this worker's own (seeded from ``seed`` and its name)."""

    def __init__(
        self,
        state: ClusterState,
        worker: Simulated,
        rule: CandidateRule | None,
        seed: int,
        traffic: ViewTraffic | None = None,
    ) -> None:
        self._state = state
        self._traffic = traffic
        self._worker = worker
        self._rule = rule
        self._rng = random.Random(f"candidates:{seed}:{worker.name}")
        #: snapshots taken for a job, and the workers they showed in all
        self.scoped = 0
        self.shown = 0

    def snapshot(
        self, now: float, without: str = "", priority: int = 0, scope: PlanScope | None = None
    ) -> ViewSnapshot:
        worker = self._worker
        lanes = worker.lanes
        among = None
        if self._rule is not None and scope is not None:
            among = self._candidates(now, scope, self._rule)
            self.scoped += 1
            self.shown += len(among)
            if self._traffic is not None:  # the planner watches its candidates' load
                self._traffic.planned(worker.index, among.tolist(), now)
        return self._state.snapshot(
            worker.index, now, lanes.wait_s(now, priority), lanes.batchable(now),
            without, priority, among,
        )  # fmt: skip

    def _candidates(self, now: float, scope: PlanScope, rule: CandidateRule) -> IntpArray:
        state = self._state
        viewer = self._worker.index
        keep = [state.positions[w] for w in scope.keep]  # simulated workers are never lost
        keep.append(viewer)
        held = state.holders(viewer, now, scope.models)
        heard = state.heard
        fresh = None if heard is None or rule.explore is None else heard.watching(viewer)
        return pick(len(state.names), held, keep, rule, self._rng, fresh)

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        self._state.note_placement(self._worker.index, self._state.positions[worker], placed, now)

    def remove(self, worker: str) -> None:
        pass  # simulated workers are never lost

    def heard(self, heartbeat: Heartbeat, now: float) -> bool:
        return False  # what each worker sees of the others is modelled by the cluster state

    def drain(self, worker: str, instance: str) -> None:
        pass  # simulated workers never drain

    def joined(self, worker: str, instance: str) -> None:
        pass

    def take_wanted(self) -> tuple[str, ...]:
        return ()  # a bounded view's watches are modelled by what a planner has heard (heard.py)

    def watch_failed(self, peer: str) -> None:
        pass

    #: simulated workers all serve one version: no task message carries one
    version_id = 0

    def other_version(self, worker: str) -> None:
        pass  # never refused: see version_id
