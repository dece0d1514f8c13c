"""Workflows decided at run time, in the worker core (sans-IO): choices made, skips passed on.

A task of an unrolled workflow (:mod:`compass.workflow.unfold`) that finishes sends its output
along the route its :class:`~compass.workflow.choices.Unfolding` gives (a decision task first
tells the job's ingress its choice, a :class:`~compass.core.messages.ChoseMsg`): the successors its
choice runs get the output, the tasks that still wait on a skipped one get a skip mark (a
:class:`~compass.core.messages.TaskMsg` whose value is :data:`SKIPPED`), and the sinks that
will never run are reported to the ingress as skipped, so that it answers once every sink ran
or was skipped. A task all of whose inputs were skipped never queues: its worker passes the
skip on at once (:func:`skip_task`).

Under the ``compass-chained`` policy each choice ends a job as a user chaining ``submit`` calls
would see it: the chosen successors' inputs go back to the ingress (:class:`ChainedStep`),
which sends them on as a new job would: one hop later, and queued as a job that just arrived.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from compass.core.jobs import IngressJob
from compass.core.messages import ChoseMsg, PeerMessage, ResultMsg, TaskMsg
from compass.core.queue import QueuedTask
from compass.errors import CompassError
from compass.sched import JobInfo, Policy
from compass.sched.adjust import PlacementCounter, record_plan
from compass.sched.planner import CompassPolicy
from compass.workflow.choices import SKIPPED, Route, is_skipped
from compass.workflow.dag import Workflow
from compass.workflow.profile import Profiles

__all__ = [
    "ChainedStep",
    "answer_value",
    "chains_steps",
    "counted",
    "counts_steps",
    "forward_step",
    "note_step",
    "pass_on",
    "prefetches_likely",
    "rank_basis",
    "skip_task",
    "step_of",
]


class Profiled(Protocol):
    """What :func:`forward_step` uses of a core's estimates."""

    @property
    def profiles(self) -> Profiles: ...

    @property
    def host_lanes(self) -> bool: ...


class ChainHost(Protocol):
    """What :func:`forward_step` uses of the ingress's worker core."""

    @property
    def policy(self) -> Policy: ...

    @property
    def view(self) -> PlacementCounter: ...

    @property
    def estimates(self) -> Profiled: ...

    def send(
        self, peer: str, msg: PeerMessage, now: float, job_arrival: float | None = None
    ) -> None: ...


class Core(Protocol):
    """What these rules use of the worker core."""

    name: str
    policy: Policy

    @property
    def view(self) -> PlacementCounter: ...

    @property
    def estimates(self) -> Profiled: ...

    def send(
        self, peer: str, msg: PeerMessage, now: float, job_arrival: float | None = None
    ) -> None: ...

    def adjust_plan(
        self, workflow: Workflow, entry: QueuedTask, now: float, live: Collection[str] = ()
    ) -> dict[str, str]: ...

    def report_failure(
        self,
        job: str,
        attempt: int,
        task: str,
        ingress: str,
        now: float,
        message: str,
        code: str,
        traceback: str = "",
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ChainedStep:
    """A choice's outcome sent to the ingress (``compass-chained``): each chosen successor with
    its input, and the plan as adjusted where the choice was made."""

    sends: tuple[tuple[str, Any], ...]
    plan: dict[str, str]


def rank_basis(policy: Policy) -> str | None:
    """What best time a task of a workflow decided at run time ranks by in the queue under
    ``policy``: ``"step"``, its step's, as a job of its own (``compass-chained``: a user's
    client submits each step); ``"progress"``, the expected best time of a job that reached
    it (:func:`~compass.sched.unfold.expected_best_s`); None, its workflow's likely path's."""
    if not isinstance(policy, CompassPolicy):
        return None
    if policy.options.chained:
        return "step"
    return "progress" if policy.options.progress_rank else None


def ranks_yardstick(policy: Policy) -> bool:
    """Whether the slowdown of a task of a workflow decided at run time is measured, at a step
    boundary (:mod:`compass.core.preempt`), against the best time it ranks by
    (:func:`rank_basis`) rather than its workflow's likely path's: compass unless
    ``rank_yardstick`` is off. A job deep in its loop is then weighed as the long job it is
    expected to be, so a short job's task takes its lane between two steps; a chained step as
    the short job its client submitted."""
    return isinstance(policy, CompassPolicy) and policy.options.rank_yardstick


def counts_steps(policy: Policy) -> bool:
    """Whether ``policy`` counts a job's tasks in their workers' waits one step at a time (a
    step runs from a choice to the next: :func:`step_of`), rather than its whole likely path
    at admission: ``compass-chained`` always (a user's client submits one step at a time),
    compass unless ``count_likely_path``."""
    return isinstance(policy, CompassPolicy) and (
        policy.options.chained or not policy.options.count_likely_path
    )


def prefetches_likely(policy: Policy) -> bool:
    """Whether a worker prefetches the models of a decision task's likely successors under
    ``policy`` (:mod:`compass.core.likely`): compass unless ``likely_prefetch`` is off; never
    ``compass-chained`` (a user's client knows nothing of its program's next step) nor the
    baselines."""
    return (
        isinstance(policy, CompassPolicy)
        and policy.options.likely_prefetch
        and not policy.options.chained
    )


def chains_steps(policy: Policy) -> bool:
    """Whether ``policy`` runs each step of an unfolding job as a job of its own."""
    return isinstance(policy, CompassPolicy) and policy.options.chained


def draw_key(job_id: str, task: str) -> str:
    """What an emulated task's choice is drawn from: the same for a job's task on every host,
    under every policy."""
    return f"{job_id}|{task}"


def pass_on(core: Core, workflow: Workflow, entry: QueuedTask, output: Any, now: float) -> None:
    """Send the output of ``entry`` (finished, of an unrolled ``workflow``) along its route."""
    unfolding = workflow.unfold
    assert unfolding is not None
    emulated = workflow.tasks[entry.task].fn is None
    try:
        route = unfolding.route(
            entry.task, output, draw_key(entry.job_id, entry.task), emulated=emulated
        )
        plan = entry.plan
        live = [s for s, _ in route.sends]
        if route.sends and core.policy.dynamic:
            plan = core.adjust_plan(workflow, entry, now, live=live)
        # the step this choice starts counts now (chained: when the ingress sends it on)
        policy = core.policy
        chose = bool(live) and entry.task in unfolding.points
        if chose and counts_steps(policy) and not chains_steps(policy):
            kept = {t: plan[t] for t in step_of(workflow, live) if t not in live
                    or plan[t] == entry.plan[t]}  # fmt: skip
            note_step(core, workflow, entry, kept, now)
    except CompassError as exc:
        core.report_failure(
            entry.job_id, entry.attempt, entry.task, entry.ingress, now,
            f"{type(exc).__name__}: {exc}", exc.code,
        )  # fmt: skip
        return
    template = TaskMsg.onward(entry, workflow.name, entry.task, None, plan, now)
    if entry.task in unfolding.points:  # the choice, for the job's record (sent first)
        choice = ChoseMsg(entry.job_id, entry.attempt, entry.task, route.label)
        core.send(entry.ingress, choice, now)
    if not workflow.succs(entry.task):
        core.send(entry.ingress, ResultMsg(entry.job_id, entry.attempt, entry.task, output), now)
    elif entry.task in unfolding.points and chains_steps(core.policy) and route.sends:
        step = ChainedStep(route.sends, plan)
        core.send(entry.ingress, ResultMsg(entry.job_id, entry.attempt, entry.task, step), now)
        route = Route((), route.skips, route.dead_sinks, route.label)
    _send_route(core, template, route, now, entry.arrival)


def note_step(
    core: Core, workflow: Workflow, entry: QueuedTask, placed: Mapping[str, str], now: float
) -> None:
    """Count ``placed`` (tasks of the step a choice of ``entry``'s job starts) in their
    workers' waits, as a fresh plan's are (those the adjustment moved it counted already)."""
    info = JobInfo(entry.job_id, workflow, entry.ingress, 0, entry.level)
    record_plan(
        core.view, info, placed, core.estimates.profiles, now,
        host_lanes=core.estimates.host_lanes, planner=core.name,
        batch_aware=core.policy.batch_aware,
    )  # fmt: skip


def skip_task(
    core: Core, workflow: Workflow, msg: TaskMsg, plan: dict[str, str], now: float
) -> None:
    """Task ``msg.task`` had every input skipped: it is skipped, and so is what only it feeds."""
    unfolding = workflow.unfold
    assert unfolding is not None
    template = msg.with_plan(plan).to(msg.task, msg.task, None)
    _send_route(core, template, unfolding.skip(msg.task), now, None)


def _send_route(
    core: Core, template: TaskMsg, route: Route, now: float, arrival: float | None
) -> None:
    """The outputs, skip marks and skipped sinks of ``route``, from the task ``template``
    names (its job's fields are copied into every message)."""
    source, plan = template.task, template.plan
    for succ, value in route.sends:
        core.send(plan[succ], template.to(succ, source, value), now, job_arrival=arrival)
    for task, skipped in route.skips:
        core.send(plan[task], template.to(task, skipped, SKIPPED), now, job_arrival=arrival)
    for sink in route.dead_sinks:
        result = ResultMsg(template.job, template.attempt, sink, SKIPPED)
        core.send(template.ingress, result, now)


def counted(
    workflow: Workflow,
    plan: dict[str, str],
    likely: Collection[str] | None = None,
    policy: Policy | None = None,
) -> dict[str, str]:
    """What of a fresh ``plan`` counts as load on its workers: every task of a static workflow,
    the likely ones of an unrolled one (``likely``, as the ingress learned them; default
    :attr:`~compass.workflow.choices.Unfolding.likely`, by the declared weights): the
    branches, copies and iterations a job will not take would count as work that never comes
    until the next heartbeats. Under ``compass-chained`` (``policy``) only the first step's:
    a user's client submits that step alone, knowing nothing of the rest."""
    if workflow.unfold is None:
        return plan
    if policy is not None and counts_steps(policy):
        first = step_of(workflow, workflow.roots)
        return {t: w for t, w in plan.items() if t in first}
    if likely is None:
        likely = workflow.unfold.likely
    return {t: w for t, w in plan.items() if t in likely}


def step_of(workflow: Workflow, starts: Iterable[str]) -> frozenset[str]:
    """The tasks of unrolled ``workflow`` that one chained step starting at ``starts`` runs:
    what they lead to, up to and including the next decision tasks."""
    unfolding = workflow.unfold
    assert unfolding is not None
    step: set[str] = set()
    todo = list(starts)
    while todo:
        task = todo.pop()
        if task not in step:
            step.add(task)
            if task not in unfolding.points:
                todo.extend(workflow.succs(task))
    return frozenset(step)


def answer_value(sinks: tuple[str, ...], outputs: Mapping[str, Any]) -> Any:
    """What a job of an unrolled workflow answers: the output of the one sink that ran, or a
    mapping of those that ran (the skipped left out)."""
    ran = {s: outputs[s] for s in sinks if not is_skipped(outputs[s])}
    return next(iter(ran.values())) if len(ran) == 1 else ran


def forward_step(
    host: ChainHost, ingress: str, job: IngressJob, msg: ResultMsg, now: float
) -> None:
    """At the ingress (``compass-chained``): send the chosen successors of ``msg``'s step on
    as a new job of the client's would go: from here, its age starting now, the step's tasks
    counted in their workers' waits as a fresh plan's are (and only they)."""
    step = msg.value
    assert isinstance(step, ChainedStep)
    job.plan.update(step.plan)
    template = TaskMsg(
        job=job.job_id, attempt=job.attempt, workflow=job.workflow.name, task=msg.task,
        source=msg.task, value=None, plan=dict(job.plan), ingress=ingress,
        t0=job.t0 + (now - job.submitted_at), priority=job.objective.priority,
        budget_s=None if job.deadline is None else job.deadline - now,
        finish=job.objective.finish, stream=job.stream,
    )  # fmt: skip
    for succ, value in step.sends:
        host.send(job.plan[succ], template.to(succ, msg.task, value), now, now)
    tasks = step_of(job.workflow, [succ for succ, _ in step.sends])
    info = JobInfo(job.job_id, job.workflow, ingress, 0, job.objective.priority)
    record_plan(
        host.view, info, {t: job.plan[t] for t in tasks}, host.estimates.profiles, now,
        host_lanes=host.estimates.host_lanes, planner=ingress,
        batch_aware=host.policy.batch_aware,
    )  # fmt: skip
