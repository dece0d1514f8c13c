"""Job arrivals for the simulator: one client per workflow, each with its own arrival process.

The paper's evaluation (see ``docs/ARCHITECTURE.md`` and the workload's ``arrivals`` object)
has one client per workflow submitting a job every ``mean_interval`` on average, under a
uniform, a Poisson or a bursty gamma process. ``load`` scales every client's rate: load 2
halves the mean interval. Workflows may differ in popularity: a client's ``weight`` divides
its mean interval (the workload file's per-workflow ``weight``, default 1).

Each client draws from its own random stream (spawned from the seed), so adding a workflow does
not change the arrivals of the others, and the same seed always gives the same arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError
from compass.objective import NO_OBJECTIVE, Objective
from compass.workflow.spec import Workload

__all__ = ["PROCESSES", "Arrival", "interarrival_s", "job_arrivals", "workload_arrivals"]

#: the arrival processes the paper evaluates
PROCESSES = ("uniform", "poisson", "gamma")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One job: submitted at ``t_s`` seconds by client ``client`` for ``workflow``, asking
    for ``objective`` (a deadline, a priority; none by default)."""

    t_s: float
    workflow: str
    client: int
    objective: Objective = NO_OBJECTIVE


def interarrival_s(
    process: str, n: int, mean_s: float, cv: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """``n`` inter-arrival times in seconds with mean ``mean_s``.

    ``uniform``: constant spacing (CV 0); ``poisson``: exponential (CV 1); ``gamma``: shape
    ``1 / cv**2`` and scale ``mean_s * cv**2``, so the coefficient of variation is ``cv``
    (``cv`` is ignored by the other two).
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigError(f"number of inter-arrival times must be an integer >= 0, got {n!r}")
    if not mean_s > 0 or not np.isfinite(mean_s):
        raise ConfigError(f"mean inter-arrival time must be a finite number > 0, got {mean_s!r}")
    if process == "uniform":
        return np.full(n, float(mean_s))
    if process == "poisson":
        return rng.exponential(mean_s, n)
    if process == "gamma":
        if not cv > 0 or not np.isfinite(cv):
            raise ConfigError(
                f"gamma arrivals need a finite coefficient of variation > 0, got {cv!r}"
            )
        return rng.gamma(1.0 / cv**2, mean_s * cv**2, n)
    raise ConfigError(f"unknown arrival process {process!r}; known: {', '.join(PROCESSES)}")


def job_arrivals(
    workflows: Sequence[str],
    jobs: int,
    *,
    process: str,
    mean_interval_s: float,
    load: float = 1.0,
    cv: float = 1.0,
    seed: int = 0,
    weights: Sequence[float] | None = None,
) -> list[Arrival]:
    """The first ``jobs`` arrivals of one client per workflow, merged by time.

    Client ``i`` submits ``workflows[i]`` with mean interval
    ``mean_interval_s / (load * weights[i])`` (every weight 1 when ``weights`` is None); a
    uniform client starts at a random phase within its first interval (so clients do not
    submit in lockstep). Times are shifted so that the first job arrives at 0.
    """
    if isinstance(workflows, str) or not workflows:
        raise ConfigError(
            f"job_arrivals needs a non-empty sequence of workflow names, got {workflows!r}"
        )
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 0:
        raise ConfigError(f"jobs must be an integer >= 0, got {jobs!r}")
    if not load > 0 or not np.isfinite(load):
        raise ConfigError(f"load must be a finite number > 0, got {load!r}")
    if weights is None:
        rates = [1.0] * len(workflows)
    else:
        rates = list(weights)
        if len(rates) != len(workflows):
            raise ConfigError(
                f"job_arrivals got {len(rates)} weights for {len(workflows)} workflows"
            )
        for name, weight in zip(workflows, rates, strict=True):
            if (
                not isinstance(weight, int | float)
                or isinstance(weight, bool)
                or not 0 < weight < np.inf
            ):
                raise ConfigError(
                    f"workflow {name!r}: weight must be a finite number > 0, got {weight!r}"
                )
    if jobs == 0:
        return []
    streams = np.random.SeedSequence(seed).spawn(len(workflows))
    times: list[npt.NDArray[np.float64]] = []
    for stream, rate in zip(streams, rates, strict=True):
        # weight 1 divides by exactly 1.0: the arrivals of an unweighted call are unchanged
        mean_s = mean_interval_s / load / rate
        rng = np.random.default_rng(stream)
        # a client contributes at most `jobs` of the first `jobs` merged arrivals
        gaps = interarrival_s(process, jobs, mean_s, cv, rng)
        if process == "uniform":
            gaps[0] = rng.uniform(0.0, mean_s)
        times.append(np.cumsum(gaps))
    clients = np.repeat(np.arange(len(workflows)), jobs)
    merged = np.concatenate(times)
    first = np.argsort(merged, kind="stable")[:jobs]
    start = float(merged[first[0]])
    return [
        Arrival(float(merged[i]) - start, workflows[int(clients[i])], int(clients[i]))
        for i in first
    ]


def workload_arrivals(
    workload: Workload,
    jobs: int,
    *,
    process: str,
    load: float = 1.0,
    cv: float = 1.0,
    seed: int = 0,
) -> list[Arrival]:
    """:func:`job_arrivals` for ``workload``: one client per workflow, at the spec's mean
    interval per client and its workflows' weights."""
    return job_arrivals(
        list(workload.workflows),
        jobs,
        process=process,
        mean_interval_s=workload.arrivals.mean_interval_ms_per_client / 1000.0,
        load=load,
        cv=cv,
        seed=seed,
        weights=workload.weight_list(),
    )
