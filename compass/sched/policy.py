"""What a placement policy is: the :class:`Policy` protocol, and :class:`JobInfo`, the job it
places.

Every policy (compass's :class:`~compass.sched.planner.CompassPolicy` and the baselines of
:mod:`compass.sched.policies`) plans a whole job at its ingress and re-checks each successor
when a predecessor finishes; :func:`~compass.sched.adjust.adjust_successors` drives the latter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt

from compass.records import record
from compass.sched.snapshot import ViewSnapshot
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = ["LARGE_CLUSTER", "TIE_S", "JobInfo", "Policy"]

FloatArray = npt.NDArray[np.float64]

#: finish times closer than this are a tie (seconds; far below any real task or transfer)
TIE_S = 1e-9
#: a cluster of this many workers or more is large: ties between workers are broken from each
#: ingress's own position (:func:`~compass.sched.eft.fewest_bytes`), and the simulator deals
#: jobs over every worker by default (:func:`~compass.sim.engine.simulate`'s ``ingress``)
LARGE_CLUSTER = 64


# made for every plan and adjustment: a record, frozen by convention (:mod:`compass.records`)
@record
class JobInfo:
    """What the planner knows of a job: its id, workflow, ingress worker and input size.

    ``input_bytes`` is the size of the job's inputs, which every root task receives from the
    ingress; 0 means unknown, and the root's declared ``input_bytes`` stands in. ``priority``
    is the job's (its tasks count in the waits of their level and those below).
    """

    job_id: str
    workflow: Workflow
    ingress: str
    input_bytes: int
    priority: int = 0


class Policy(Protocol):
    """A placement policy. Every method returns workers that exist in ``view``."""

    name: str
    #: whether :meth:`adjust` may move tasks away from their planned worker
    dynamic: bool
    #: whether a worker's queue runs tasks by their job's arrival (oldest job first) rather
    #: than by their own arrival (FIFO)
    oldest_job_first: bool
    #: a worker's queue runs tasks by their job's deadline, its arrival plus this many times
    #: its workflow's best time (None: by ``oldest_job_first``, else FIFO)
    deadline_slack: float | None
    #: whether an idle worker fills free cache space with the models the cluster holds least
    #: (:func:`compass.sched.replicas.warm_order`)
    warms_cache: bool
    #: whether this policy plans model-less tasks onto host lanes, off the GPU queue: such a
    #: task neither waits for a worker's queue nor adds to it
    host_lanes: bool
    #: whether :func:`~compass.sched.adjust.adjust_successors` places each successor of a
    #: finished task on a view that counts the siblings placed before it (off: all on one
    #: snapshot, as the paper did)
    counts_siblings: bool
    #: whether the policy's finish times count joining a batch queued on a worker (then
    #: :func:`~compass.sched.adjust.adjust_successors` counts the siblings it places in those
    #: batches too)
    batch_aware: bool

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        """Task -> worker for every task of ``job``, at its ingress."""
        ...

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        """The worker for successor ``task``, decided when one of its predecessors finishes,
        on the worker where it finished, before that output is sent. ``plan`` is the job's
        current plan (with earlier moves recorded)."""
        ...

    def finish_times(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> FloatArray:
        """When ``task`` would finish on each worker of ``view``, in absolute seconds on the
        clock of ``now``, by this policy's own terms (:func:`~compass.sched.eft.finish_now`):
        every input ready now on the worker ``plan`` gives its producer.
        :func:`~compass.sched.adjust.adjust_successors` counts a successor busy on its worker
        until then."""
        ...

    def joins_fed_by(self, wf: Workflow, finished: str) -> tuple[str, ...]:
        """The joins :meth:`place_joins` may move when task ``finished`` completes, in
        topological order (none for a policy that never moves joins)."""
        ...

    def place_joins(
        self,
        job: JobInfo,
        finished: str,
        plan: Mapping[str, str],
        finish: Mapping[str, tuple[int, float]],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> dict[str, str]:
        """New workers for the joins of :meth:`joins_fed_by`, after the successors of
        ``finished`` were placed: ``finish`` maps each of them to ``(worker index, expected
        absolute finish)`` and ``view`` counts them. Only the joins that move."""
        ...

    def planner(self, view: ViewSnapshot) -> str | None:
        """The one worker that must plan every job, or None when the ingress plans."""
        ...
