"""A workflow's best possible latency, computed from its profile instead of trusted from a file.

Slowdown (a job's latency over its workflow's best time) is only meaningful when the best time
is one no run can beat. A ``best_ms`` declared in a workload file may be stale, measured on
another cluster, or simply wrong; :func:`best_time_s` computes a **lower bound** of what a job
can achieve on an idle cluster with every model already resident, from the declared execution
times, output sizes and the profiles' transfer model, so that a slowdown below 1 cannot happen.

The rules, each a relaxation of what a worker (and the simulator) must do, so the result is a
lower bound; ``ES``/``EF`` are a task's earliest start and finish:

- **Roots** start at 0: a root the ingress runs itself gets the job's inputs for free (only a
  root placed on another worker pays ``input_bytes`` on the wire).
- **One predecessor**: ``ES = EF(pred)``; the task can run where its predecessor ran, for free.
- **A join** (two or more predecessors) runs on some worker ``w``. The predecessors that ran on
  ``w`` (a set ``S``) shared ``w``'s lanes, so their outputs are ready no earlier than those
  tasks could all finish there (a single-machine bound with their ``ES`` as release times,
  below); every other predecessor ``p`` sends its output over the network, arriving no earlier
  than ``EF(p) + transfer(output_bytes(p))``. ``ES(join)`` is the minimum over every ``S`` of
  the later of the two. With one lane per worker and cheap predecessors, running them one
  after another on one worker can beat paying a transfer, and the bound knows it.
- **The answer**: every sink's output goes back to the ingress, free for the sinks it ran
  itself; it is the same rule as a join of the sinks that takes no time.
- **Lanes**: ``n`` tasks with release times ``r_i`` and times ``p_i`` on ``L`` lanes finish no
  earlier than ``max_j (r_j + sum_{i: r_i >= r_j} p_i / L)`` nor ``max_i (r_i + p_i)`` (for
  ``L = 1`` this is the exact optimum, Jackson's rule). With ``host_lanes > 0`` model-less
  tasks run on their own host lanes and do not share the GPU lanes.
- **Streamed edges**: a task fed by a stream starts no sooner than the streamed
  predecessor's first step (``ES(p) + exec(p) / steps(p)``) and ends no sooner than one of its
  own steps after that predecessor ends (transfers and lanes left out).
- **Workers**: with a finite cluster, the job's tasks need their execution seconds of lane time,
  so the job takes at least ``sum(exec) / (workers * lanes)`` (per kind of lane). On one worker
  every predecessor of a join and every sink is on that worker; one worker with one lane is
  then exactly the sum of every task's time, the latency a job gets there.

Transfers cost what :meth:`Profiles.transfer_s <compass.workflow.profile.Profiles.transfer_s>`
charges between two workers at the profiles' default bandwidths (fixed latency, network, and
the device-to-host and host-to-device copies when staged). Execution times and output sizes are
the workflow's declared profile, as the simulator runs them, not the online estimates.

Policy (:func:`check_declared`): compass uses the computed value; a caller that trusts the
file passes ``trust_declared=True`` (and then a slowdown below 1 is possible). A declared value
more than a tolerance away from the computed one is reported by
:func:`declared_disagreements`, one line per workflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from compass.errors import ConfigError
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles
from compass.workflow.spec import Workload

__all__ = ["best_time_s", "check_declared", "declared_disagreements"]

#: the bound is shaved by this fraction: a simulated clock adds times in another order (and to
#: a large absolute time), which can round a latency a few ulps below the exact sum; one part
#: in a million is far below anything a latency is measured to, and far above that rounding
ROUNDING_SLACK = 1e-6

#: (release time, execution seconds, runs on a host lane)
_Work = tuple[float, float, bool]


def best_time_s(
    wf: Workflow,
    profiles: Profiles,
    *,
    workers: int | None = None,
    lanes: int = 1,
    host_lanes: int = 0,
) -> float:
    """Seconds a job of ``wf`` takes at best on an idle cluster with warm caches (a lower
    bound; the module docstring gives the rules).

    ``workers``: the cluster's size (None: any size, the weakest and always valid bound);
    ``lanes`` and ``host_lanes``: per worker, as the cluster runs (``simulate``'s arguments
    of the same names). A bound computed for fewer lanes than the cluster has is not one.
    Returns 0.0 only for a workflow whose tasks all take no time. The value is shaved by
    :data:`ROUNDING_SLACK` (relative) so float rounding never shows a latency below it.
    """
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers < 1
    ):
        raise ConfigError(f"best_time_s: workers must be an integer >= 1 or None, got {workers!r}")
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
        raise ConfigError(f"best_time_s: lanes must be an integer >= 1, got {lanes!r}")
    if not isinstance(host_lanes, int) or isinstance(host_lanes, bool) or host_lanes < 0:
        raise ConfigError(f"best_time_s: host_lanes must be an integer >= 0, got {host_lanes!r}")
    one_worker = workers == 1
    per_byte = 1.0 / profiles.net_bytes_per_s
    if profiles.staged:
        per_byte += 1.0 / profiles.default_d2h_bytes_per_s + 1.0 / profiles.default_h2d_bytes_per_s
    fixed = profiles.net_fixed_s

    def transfer(nbytes: int) -> float:
        return fixed + nbytes * per_byte

    def on_host(task: str) -> bool:
        return host_lanes > 0 and wf.tasks[task].model is None

    start: dict[str, float] = {}
    finish: dict[str, float] = {}

    def meet(tasks: Iterable[str]) -> float:
        """Earliest time the outputs of ``tasks`` can all be on one worker."""
        items = [
            (
                finish[t] + transfer(wf.tasks[t].profile.output_bytes),
                (start[t], wf.tasks[t].profile.exec_s, on_host(t)),
            )
            for t in tasks
        ]
        return _meet(items, lanes, host_lanes, everything_local=one_worker)

    for t in wf.order:
        preds = wf.preds(t)
        if wf.tasks[t].streamed:
            start[t], finish[t] = _fed(wf, t, start, finish)
            continue
        if not preds:
            start[t] = 0.0
        elif len(preds) == 1:
            start[t] = finish[preds[0]]
        else:
            start[t] = meet(preds)
        finish[t] = start[t] + wf.tasks[t].profile.exec_s
    best = finish[wf.sinks[0]] if len(wf.sinks) == 1 else meet(wf.sinks)
    if workers is not None:
        gpu = sum(wf.tasks[t].profile.exec_s for t in wf.order if not on_host(t))
        host = sum(wf.tasks[t].profile.exec_s for t in wf.order if on_host(t))
        best = max(best, gpu / (workers * lanes))
        if host_lanes:
            best = max(best, host / (workers * host_lanes))
    return best * (1.0 - ROUNDING_SLACK)


def _fed(
    wf: Workflow, t: str, start: Mapping[str, float], finish: Mapping[str, float]
) -> tuple[float, float]:
    """``ES`` and ``EF`` of task ``t``, fed by streamed edges: it starts no sooner than each
    streamed predecessor's first step (each other one's end) and ends no sooner than one of its
    own steps after each streamed predecessor ends (no transfer, no lanes: a lower bound)."""
    task = wf.tasks[t]
    first = {
        p: start[p] + wf.tasks[p].profile.exec_s / wf.tasks[p].profile.steps for p in task.streamed
    }
    es = max(first[p] if p in first else finish[p] for p in task.after)
    step = task.profile.exec_s / task.profile.steps
    return es, max(es + task.profile.exec_s, *(finish[p] + step for p in task.streamed))


def _meet(
    items: list[tuple[float, _Work]], lanes: int, host_lanes: int, *, everything_local: bool
) -> float:
    """Min over the set ``S`` of items on the meeting worker of max(the local bound of ``S``,
    the latest remote arrival). ``items``: (arrival if sent, the work if run locally).

    Only prefixes in descending remote-arrival order can be optimal: any ``S`` costs at least
    the smallest prefix holding every item that arrives later than the first one ``S`` leaves
    out, because the local bound only grows with ``S``.
    """
    items = sorted(items, key=lambda item: item[0], reverse=True)
    if everything_local:  # one worker: nothing is sent
        return _local([work for _, work in items], lanes, host_lanes)
    best = math.inf
    for j in range(1, len(items) + 1):
        remote = items[j][0] if j < len(items) else 0.0
        if remote >= best:
            continue
        best = min(best, max(_local([work for _, work in items[:j]], lanes, host_lanes), remote))
    return best


def _local(work: list[_Work], lanes: int, host_lanes: int) -> float:
    """Earliest time the tasks of ``work`` can all finish on one worker's lanes."""
    gpu = [(r, p) for r, p, host in work if not host]
    host = [(r, p) for r, p, host in work if host]
    return max(_lanes_bound(gpu, lanes), _lanes_bound(host, host_lanes) if host else 0.0)


def _lanes_bound(jobs: list[tuple[float, float]], lanes: int) -> float:
    """A lower bound on the makespan of ``jobs`` (release, time) on ``lanes`` identical lanes;
    exact for one lane (Jackson's rule: by release time, no idle time but waiting for one)."""
    if not jobs:
        return 0.0
    bound = max(r + p for r, p in jobs)
    tail = 0.0
    for r, p in sorted(jobs, reverse=True):
        tail += p
        bound = max(bound, r + tail / lanes)
    return bound


def check_declared(
    workload: Workload,
    profiles: Profiles,
    tolerance: float = 0.05,
    *,
    trust_declared: bool = False,
    workers: int | None = None,
    lanes: int = 1,
    host_lanes: int = 0,
) -> dict[str, float]:
    """The best seconds to use for each workflow of ``workload``: the computed bound, or the
    declared ``best_ms`` where one is given and ``trust_declared``. ``tolerance`` only checks
    its own value here; :func:`declared_disagreements` names the workflows beyond it."""
    _check_tolerance(tolerance)
    best: dict[str, float] = {}
    for name, wf in workload.workflows.items():
        if trust_declared and wf.best_ms is not None:
            best[name] = wf.best_ms / 1000.0
        else:
            best[name] = best_time_s(
                wf, profiles, workers=workers, lanes=lanes, host_lanes=host_lanes
            )
    return best


def declared_disagreements(
    workload: Workload,
    profiles: Profiles,
    tolerance: float = 0.05,
    *,
    workers: int | None = None,
    lanes: int = 1,
    host_lanes: int = 0,
) -> list[str]:
    """One line for each workflow whose declared ``best_ms`` is more than ``tolerance``
    (relative to the computed value) away from :func:`best_time_s`; workflows in file order."""
    _check_tolerance(tolerance)
    computed = check_declared(
        workload, profiles, tolerance, workers=workers, lanes=lanes, host_lanes=host_lanes
    )
    return [
        line
        for name, wf in workload.workflows.items()
        if (line := _disagreement(workload.name, wf, computed[name], tolerance))
    ]


def _disagreement(workload: str, wf: Workflow, computed_s: float, tolerance: float) -> str:
    if wf.best_ms is None:
        return ""
    computed_ms = computed_s * 1000.0
    if computed_ms > 0 and abs(wf.best_ms - computed_ms) <= tolerance * computed_ms:
        return ""
    off = f"{(wf.best_ms / computed_ms - 1.0) * 100.0:+.1f}%" if computed_ms > 0 else "n/a"
    below = " (below what any run can reach)" if wf.best_ms < computed_ms else ""
    return (
        f"workload {workload!r}: workflow {wf.name!r} declares best_ms {wf.best_ms:g}, but its "
        f"best possible latency is {computed_ms:.1f} ms ({off}){below}; compass uses "
        f"{computed_ms:.1f} ms unless told to trust the declared value"
    )


def _check_tolerance(tolerance: float) -> None:
    if (
        not isinstance(tolerance, int | float)
        or isinstance(tolerance, bool)
        or not 0 <= tolerance < math.inf
    ):
        raise ConfigError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
