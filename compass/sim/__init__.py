"""The discrete-event simulator: the same planner, adjustment and cache code as a real worker,
driven in virtual time, so policies can be compared on hundreds of workers in seconds.

``simulate(workload, workers=..., policy=..., arrivals=job_arrivals(...))`` returns a
:class:`SimResult`; ``compass sim`` (:func:`compass.sim.report.run_cli`) compares policies.
"""

from __future__ import annotations

from compass.sim.arrivals import PROCESSES, Arrival, interarrival_s, job_arrivals
from compass.sim.engine import simulate
from compass.sim.result import JobRecord, SimResult, TaskRecord

__all__ = [
    "PROCESSES",
    "Arrival",
    "JobRecord",
    "SimResult",
    "TaskRecord",
    "interarrival_s",
    "job_arrivals",
    "simulate",
]
