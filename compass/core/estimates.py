"""What a worker core expects of a job's tasks, from its profiles, and what it learns into them.

Expected: a workflow's best time, each task's remaining critical path, a model's load time, a
job's deadline, where a task ranks in the queue, when a plan would finish; and, from these,
the queue entry of a task whose inputs are all here (cached per profile version: the
estimates move when the profiles do). Learned (a learning core, in real mode): measured runs,
output sizes, pushes and loads, and the task times and bandwidths peers measured; and, by
every core, the choice frequencies of the jobs it is the ingress of
(:attr:`Estimates.choices`). Sans-IO; only the core calls it, from its events.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from compass.core.jobs import InboxEntry
from compass.core.likely import likely_models
from compass.core.messages import TaskMsg
from compass.core.queue import QueuedTask
from compass.core.unfold import prefetches_likely, rank_basis, ranks_yardstick
from compass.objective import Objective
from compass.payload import payload_bytes
from compass.sched import Policy, ViewSnapshot
from compass.sched.cost import CostCache
from compass.sched.deadline import plan_finish_s, remaining_s
from compass.sched.heartbeat import Heartbeat
from compass.sched.unfold import expected_best_s, shortest_remaining_s, step_best_s
from compass.workflow.best import best_time_s
from compass.workflow.dag import Task, Workflow, batch_limit
from compass.workflow.profile import Learned, Profiles
from compass.workflow.unfold import likely_workflow

__all__ = [
    "ADOPTED_KEPT",
    "H2D_TOLERANCE",
    "MEASURED_TRANSFER_BYTES",
    "RESAMPLE_CHOICES",
    "Estimates",
]

#: a pushed input smaller than this measures the link's latency, not its bandwidth: not learned
MEASURED_TRANSFER_BYTES = 1 << 20

#: a peer's gossiped host-to-device bandwidth is adopted when it differs by more than this
H2D_TOLERANCE = 0.02

#: choices heard between two draws of the expected best times a queue ranks by
RESAMPLE_CHOICES = 500

#: the peers whose last learned times are remembered, at most (past it, forgotten at once)
ADOPTED_KEPT = 1024


def _batch_group(task: Task) -> str:
    """The batch group of a batchable task: tasks of one function and model, whatever their
    workflow. An emulated task has no function: it stands for its model's forward pass, so
    emulated tasks of one model batch together; step-wise ones apart from plain ones (their
    steps batch, not their calls)."""
    if task.fn is None:
        return f"{task.model}/steps" if task.profile.steps > 1 else f"{task.model}"
    fn = task.fn
    return f"{task.model}/{fn.__module__}.{getattr(fn, '__qualname__', '')}#{id(fn)}"


class Estimates:
    """The estimates of worker ``name`` under ``policy``, from ``profiles``."""

    def __init__(self, name: str, policy: Policy, profiles: Profiles, *, host_lanes: bool) -> None:
        self.name = name
        self.policy = policy
        self.profiles = profiles
        self.host_lanes = host_lanes
        #: the choice frequencies of workflows decided at run time: learned by the ingress,
        #: spread with the heartbeats (the profiles' own)
        self.choices = profiles.choices
        #: workflow -> (its profile and choice versions, its best time in seconds), for
        #: deadline order
        self._best: dict[str, tuple[tuple[int, int], float]] = {}
        #: workflow -> (its profile version, each task's remaining critical path), for shedding
        self._remaining: dict[str, tuple[int, dict[str, float]]] = {}
        #: workflow decided at run time -> (its profile version and choice epoch, each task's
        #: best time its queue rank counts: :meth:`rank`)
        self._ranked: dict[str, tuple[tuple[int, int], dict[str, float]]] = {}
        #: cost tables for estimating when a plan finishes (admission by deadline)
        self._costs = CostCache()
        #: peer -> the learned times last taken from it (a heartbeat that repeats them costs
        #: one comparison)
        self._adopted: dict[str, tuple[Learned, ...]] = {}

    # -- learning (a learning core's measurements; see WorkerCore) ------------------------------

    def observe_run(
        self, entry: QueuedTask, output: Any, exec_s: float | None, batch: int, steps: int = 0
    ) -> None:
        """``entry`` ran and gave ``output``: its run's measured ``exec_s`` (None: not a
        measurement, as for a batch's other entries: a batch is one, of its size, under its
        lead) updates its task's profile, its output's size the task's output estimate. A
        step-wise run (``steps`` > 0) teaches its step count and step time apart, unless it
        shared its steps in a step batch (a batch's step is not one job's)."""
        if exec_s is not None and steps > 0:
            if batch <= 1:
                self.profiles.observe_steps(entry.workflow, entry.task, self.name, steps, exec_s)
        elif exec_s is not None:
            self.profiles.observe_batch(entry.workflow, entry.task, self.name, batch, exec_s)
        self.profiles.observe_output(entry.workflow, entry.task, payload_bytes(output))

    def observe_push(self, sender: str, value: Any, transfer_s: float) -> None:
        """An input ``value`` pushed by ``sender`` spent ``transfer_s`` on the wire: a measure
        of the link (small pushes measure latency, not bandwidth, and are left out)."""
        nbytes = payload_bytes(value)
        if nbytes >= MEASURED_TRANSFER_BYTES:
            self.profiles.observe_transfer(sender, self.name, nbytes, transfer_s)

    def observe_load(self, nbytes: int, seconds: float) -> None:
        """This worker copied ``nbytes`` of a model into its cache in ``seconds``."""
        self.profiles.observe_h2d(self.name, nbytes, seconds)

    def adopt(self, heartbeat: Heartbeat) -> None:
        """What a peer measured, from its heartbeat: the task times it learned (a model's load
        time spreads as its bandwidth), the choices it learned, and its host-to-device
        bandwidth."""
        learned = heartbeat.learned
        if learned and self._adopted.get(heartbeat.name) != learned:
            if len(self._adopted) >= ADOPTED_KEPT:
                self._adopted.clear()  # peers come and go: only what is unchanged is skipped
            self._adopted[heartbeat.name] = learned
            for workflow, task, seconds, samples in learned:
                self.profiles.adopt_exec(workflow, task, heartbeat.name, seconds, samples)
        self.choices.adopt(heartbeat.name, heartbeat.choices)
        self.adopt_h2d(heartbeat)

    def adopt_h2d(self, heartbeat: Heartbeat) -> None:
        """A peer's measured host-to-device bandwidth, adopted when it differs by more than
        :data:`H2D_TOLERANCE` from what this worker assumes (smaller moves would only rebuild
        the cost tables)."""
        measured = heartbeat.h2d_bytes_per_s
        if measured > 0:
            assumed = self.profiles.h2d_bytes_per_s(heartbeat.name)
            if abs(measured - assumed) > H2D_TOLERANCE * assumed:
                self.profiles.set_h2d(heartbeat.name, measured)

    # -- estimates -----------------------------------------------------------------------------

    def deadline_s(self, workflow: Workflow, objective: Objective) -> float | None:
        """Seconds a job has: its own ``deadline_ms``, else its workflow's default objective
        (``slo_ms``, or ``slo_x`` times its computed best time), else None."""
        if objective.deadline_s is not None:
            return objective.deadline_s
        if workflow.slo_ms is not None:
            return workflow.slo_ms / 1000.0
        if workflow.slo_x is not None:
            return workflow.slo_x * self.best_s(workflow)
        return None

    def best_s(self, workflow: Workflow) -> float:
        """``workflow``'s computed best time (of a workflow decided at run time: of its likely
        path, as learned), kept per profile and choice version."""
        name = workflow.name
        version = (self.profiles.workflow_version(name), self.choices.version(name))
        known = self._best.get(name)
        if known is None or known[0] != version:  # the estimates moved
            if workflow.unfold is None:
                typical = workflow
            else:  # a typical job: the likely path, as learned
                typical = likely_workflow(workflow, self.choices.likely(workflow))
            known = self._best[name] = (version, best_time_s(typical, self.profiles))
        return known[1]

    def fetch_s(self, model: str) -> float:
        """Seconds to copy ``model`` into this worker's cache."""
        return self.profiles.model_bytes(model) / self.profiles.h2d_bytes_per_s(self.name)

    def remaining(self, workflow: Workflow) -> dict[str, float]:
        """Each task's remaining critical path (:func:`remaining_s`), kept per profile
        version."""
        version = self.profiles.workflow_version(workflow.name)
        known = self._remaining.get(workflow.name)
        if known is None or known[0] != version:
            left = remaining_s if workflow.unfold is None else shortest_remaining_s
            known = self._remaining[workflow.name] = (
                version,
                left(workflow, self.profiles, self.name),
            )
        return known[1]

    def rank(self, workflow: Workflow, arrival: float, task: str | None = None) -> float | None:
        """Where a task ranks in the queue (None: FIFO). Oldest job first ranks it at its
        job's arrival; by deadline, at its arrival plus ``deadline_slack`` times its
        workflow's best time (a short job's deadline comes sooner). A task of a workflow
        decided at run time may rank by a best time of its own (:meth:`_task_best`)."""
        slack = self.policy.deadline_slack
        if slack is not None:
            if task is not None and workflow.unfold is not None:
                by_task = self._task_best(workflow)
                if by_task is not None:
                    return arrival + slack * by_task[task]
            return arrival + slack * self.best_s(workflow)
        return arrival if self.policy.oldest_job_first else None

    def _task_best(self, workflow: Workflow) -> dict[str, float] | None:
        """The best time each task of unrolled ``workflow`` ranks by, where the policy gives
        one (:func:`~compass.core.unfold.rank_basis`): its chained step's, or the expected
        best time of a job that reached it, drawn again from the choice weights learned here
        once every :data:`RESAMPLE_CHOICES` choices heard (near-tied options flip the likely
        path back and forth without moving it); None: the workflow's likely path's."""
        basis = rank_basis(self.policy)
        if basis is None:
            return None
        name = workflow.name
        epoch = 0 if basis == "step" else self.choices.heard // RESAMPLE_CHOICES
        version = (self.profiles.workflow_version(name), epoch)
        known = self._ranked.get(name)
        if known is None or known[0] != version:
            if basis == "step":
                by_task = step_best_s(workflow, self.profiles, self.name)
            else:
                weights = functools.partial(self.choices.weights, workflow)
                by_task = expected_best_s(workflow, self.profiles, self.name, weights)
            known = self._ranked[name] = (version, by_task)
        return known[1]

    def plan_finish_s(
        self,
        workflow: Workflow,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        now: float,
        input_bytes: int,
    ) -> float:
        """When ``plan`` of a job of ``workflow`` entering here now would finish on ``view``."""
        costs = self._costs.for_view(workflow, self.profiles, view)
        return plan_finish_s(
            costs, plan, view, now, ingress=self.name, input_bytes=input_bytes,
            host_lanes=self.host_lanes,
        )  # fmt: skip

    def queued(
        self,
        msg: TaskMsg,
        workflow: Workflow,
        ready: InboxEntry,
        now: float,
        transfer_s: float,
        job_arrival: float | None,
    ) -> QueuedTask:
        """The queue entry of ``msg``'s task, ``ready`` (every input here) at ``now``, after
        ``msg`` spent ``transfer_s`` on the wire; ``job_arrival``: its job's submit time on
        this worker's clock (None: now)."""
        task = workflow.tasks[msg.task]
        arrival = now if job_arrival is None else job_arrival
        group: str | None = None
        scale: tuple[float, ...] = ()
        if task.batch > 1:
            scale = self.profiles.batch_scale(workflow.name, task.name, self.name)
            if batch_limit(scale, task.batch) > 1:  # else batching would gain nothing
                group = _batch_group(task)
        return QueuedTask(
            job_id=msg.job,
            attempt=msg.attempt,
            workflow=workflow.name,
            task=task.name,
            model=task.model,
            expected_s=self.profiles.exec_s(workflow.name, task.name, self.name),
            inputs=ready.inputs,
            plan=ready.plan,
            ingress=ready.ingress,
            enqueued_at=now,
            transfer_s=ready.transfer_s,
            priority=self.rank(workflow, arrival, task.name),
            t0=msg.t0,
            arrival=arrival,
            group=group,
            max_batch=task.batch,
            scale=scale,
            level=msg.priority,
            # the budget left when it was sent, on this worker's clock, less the transfer
            deadline=None if msg.budget_s is None else now + msg.budget_s - transfer_s,
            best_s=self._yardstick(workflow, task.name),
            finish=msg.finish,
            stream=msg.stream,
            remaining_s=self.remaining(workflow)[task.name],
            fetch_s=0.0 if task.model is None else self.fetch_s(task.model),
            steps=task.profile.steps,
            state_bytes=task.profile.state_bytes,
            likely=self._likely(workflow, task.name, ready.plan),
        )

    def _yardstick(self, workflow: Workflow, task: str) -> float:
        """The best time ``task``'s slowdown is measured against at step boundaries: its
        workflow's, or where the policy says so (:func:`~compass.core.unfold.ranks_yardstick`)
        the one a task of a workflow decided at run time ranks by."""
        if workflow.unfold is not None and ranks_yardstick(self.policy):
            by_task = self._task_best(workflow)
            if by_task is not None:
                return by_task[task]
        return self.best_s(workflow)

    def _likely(self, workflow: Workflow, task: str, plan: Mapping[str, str]) -> tuple[str, ...]:
        """The models of decision task ``task``'s likely successors planned here, where the
        policy prefetches them (:mod:`compass.core.likely`)."""
        if workflow.unfold is None or not prefetches_likely(self.policy):
            return ()
        return likely_models(workflow, task, plan, self.name, self.choices)
