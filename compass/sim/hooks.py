"""The simulator's public hook: what a simulation built on the engine adds, by composition.

:class:`~compass.sim.engine.Simulation` runs the real worker cores in virtual time; a
simulation that is more than that (:mod:`compass.elastic.sim`: a cluster that starts and
drains workers) passes a :class:`SimHooks` and acts through the engine's public methods
(``schedule``, ``apply``, ``set_open``, ``restart``, ``has_jobs``), never its internals. The
engine calls the hooks at four points; with none nothing changes. A plain ``compass sim``
passes the hot-model rule's (:class:`~compass.sim.replicas.Replication`) unless
``SimSettings.replicate`` is None.
"""

from __future__ import annotations

from typing import Protocol

from compass.sim.arrivals import Arrival
from compass.sim.result import JobRecord

__all__ = ["SimHooks"]


class SimHooks(Protocol):
    def began(self) -> None:
        """The run begins, before anything else is scheduled: schedule the hook's own events
        (``Simulation.schedule``)."""

    def entry(self, arrival: Arrival) -> int:
        """The number of the worker ``arrival`` enters at."""

    def may_tick(self, index: int) -> bool:
        """Whether worker ``index`` checks its cache for warming now (not a worker that is
        off: it holds no GPU)."""

    def recorded(self, record: JobRecord) -> None:
        """A job ended (answered, failed, or never answered at the end of the run)."""
