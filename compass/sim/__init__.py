"""The discrete-event simulator: the same planner, adjustment and cache code as a real worker,
driven in virtual time, so policies can be compared on hundreds of workers in seconds.

``simulate(workload, SimSettings(workers=..., policy=...), job_arrivals(...))`` returns a
:class:`SimResult`; ``compass sim`` compares policies
(:func:`compass.sim.compare.compare_policies`) and ``compass sim --capacity`` finds the load
each sustains (:mod:`compass.sim.capacity`); the CLI prints and plots what they return.
"""

from __future__ import annotations

from compass.sim.arrivals import PROCESSES, Arrival, interarrival_s, job_arrivals
from compass.sim.engine import simulate
from compass.sim.result import JobRecord, SimResult, TaskRecord
from compass.sim.settings import SimSettings

__all__ = [
    "PROCESSES",
    "Arrival",
    "JobRecord",
    "SimResult",
    "SimSettings",
    "TaskRecord",
    "interarrival_s",
    "job_arrivals",
    "simulate",
]
