"""Model prefetch on the likely branch (compass.core.likely): while a decision task runs, the
worker planned to run its most likely successor loads that successor's model, within the
prefetch depth and never evicting what its queue needs; the lanes' rules are driven with
plain calls, the worker core with its events."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from compass.cache.policy import CacheCore, LoadPlan
from compass.cache.pool import SlabPool
from compass.core import likely
from compass.core.assemble import CoreOptions, build_core
from compass.core.events import Instruction, ModelLoaded, Submit, TaskDone
from compass.core.lanes import Lanes, LoadModel, RunTask
from compass.core.likely import likely_models
from compass.core.queue import QueuedTask, TaskQueue
from compass.core.state import WorkerCore
from compass.sched import make_policy
from compass.workflow import Profiles, Task, TaskProfile, Workflow
from compass.workflow.frequencies import ChoiceFrequencies
from compass.workflow.unfold import Branch, Loop, unfold_workflow

from .test_state import GB, FakeView

# -- the lanes' rule ---------------------------------------------------------------------------


def entry(task: str, model: str | None, *likely: str, job: str = "j1") -> QueuedTask:
    return QueuedTask(
        job_id=job, attempt=0, workflow="wf", task=task, model=model, expected_s=1.0,
        inputs={}, plan={}, ingress="w0", enqueued_at=0.0, likely=likely,
    )  # fmt: skip


def lanes(capacity_gb: float, resident: tuple[str, ...], **kwargs: Any) -> Lanes:
    """One lane over a cache of ``capacity_gb`` of 1 GB models a, b, c, d, ``resident``
    loaded."""
    cache = CacheCore(SlabPool(int(capacity_gb * GB), GB // 4), dict.fromkeys("abcd", GB))
    for model in resident:
        plan = cache.plan_load(model)
        assert plan is not None
        cache.begin_load(model, plan)
        cache.finish_load(model)
    return Lanes(cache=cache, **{"lanes": 1, **kwargs})


def loads(steps: list[Any]) -> list[tuple[str, tuple[str, ...], bool]]:
    return [(s.model, s.evict, s.prefetch) for s in steps if isinstance(s, LoadModel)]


def test_a_running_decision_task_s_likely_model_is_prefetched_as_it_starts() -> None:
    core = lanes(4, ("a",))
    steps = core.submit(entry("route", "a", "b"), 0.0)
    assert [s.entry.task for s in steps if isinstance(s, RunTask)] == ["route"]
    assert loads(steps) == [("b", (), True)]


def test_without_likely_models_nothing_is_prefetched_for_the_choice() -> None:
    core = lanes(4, ("a",))
    assert loads(core.submit(entry("route", "a"), 0.0)) == []


def test_the_likely_model_counts_within_the_prefetch_depth() -> None:
    # depth 1: the look-ahead is the running task's own model alone
    assert loads(lanes(4, ("a",), prefetch_depth=1).submit(entry("route", "a", "b"), 0.0)) == []
    # depth 0: no speculative loads at all
    assert loads(lanes(4, ("a",), prefetch_depth=0).submit(entry("route", "a", "b"), 0.0)) == []


def test_a_likely_model_never_evicts_a_model_the_queue_needs() -> None:
    core = lanes(2, ("a", "c"))  # full: a (the running task's) and c
    core.submit(entry("busy", "a"), 0.0)  # the lane is taken
    core.submit(entry("later", "c", job="j2"), 0.0)  # queued: c is needed
    steps = core.submit(entry("route", "a", "b", job="j3"), 0.0)
    assert loads(steps) == []  # b would have to evict c
    # with c needed by nobody, b takes its slabs
    free = lanes(2, ("a", "c"))
    assert loads(free.submit(entry("route", "a", "b"), 0.0)) == [("b", ("c",), True)]


def test_without_prefetch_evicts_a_likely_model_takes_free_slabs_only() -> None:
    core = lanes(2, ("a", "c"), prefetch_evicts=False)
    assert loads(core.submit(entry("route", "a", "b"), 0.0)) == []
    roomy = lanes(3, ("a", "c"), prefetch_evicts=False)
    assert loads(roomy.submit(entry("route", "a", "b"), 0.0)) == [("b", (), True)]


def test_a_likely_model_that_does_not_fit_is_passed_over_for_what_the_queue_needs() -> None:
    cache = lanes(2, ("a", "c")).cache  # full: a and c
    queue = TaskQueue()
    for task, model, then, rank in (("route", "a", ("b",), 1.0), ("later", "d", (), 2.0),
                                    ("last", "c", (), 3.0)):  # fmt: skip
        queue.push(replace(entry(task, model, *then, job=task), priority=rank))
    # b could only evict c, which "last" needs; d may evict it (needed later than d)
    assert likely.prefetch_candidate(cache, queue, 4, evict=True) == (
        "d",
        LoadPlan("d", ("c",), 4, 4, False),
    )
    # within depth 2 the scan ends past b, before d
    assert likely.prefetch_candidate(cache, queue, 2, evict=True) is None


# -- which models, for which worker ------------------------------------------------------------


def _task(name: str, model: str | None, *after: str) -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=10, output_bytes=100))


#: a router that likely runs ``tool`` (model n, 9 in 10), else ``other`` (model m, its own)
PICK = unfold_workflow(
    "pick",
    [_task("route", "m"), _task("tool", "n", "route"), _task("other", "m", "route")],
    branches=[Branch("route", {"tool": 9, "other": 1})],
)

#: the same, ``other`` likely
PICK_OTHER = unfold_workflow(
    "pick-other",
    [_task("route", "m"), _task("tool", "n", "route"), _task("other", "m", "route")],
    branches=[Branch("route", {"tool": 1, "other": 9})],
)

#: an agent: think (m) calls the tool (n) or stops; it likely takes all 3 steps
AGENT = unfold_workflow(
    "agent",
    [_task("think", "m"), _task("tool", "n", "think"), _task("answer", None, "think")],
    loops=[Loop(("think", "tool"), "think", max_iter=3, counts={3: 1})],
)

#: a static workflow: its second task's model loads once it is queued, as before
STATIC = Workflow("static", [_task("first", "m"), _task("then", "n", "first")])

WORKFLOWS = {wf.name: wf for wf in (PICK, PICK_OTHER, AGENT, STATIC)}


def _choices() -> ChoiceFrequencies:
    return ChoiceFrequencies(WORKFLOWS.get)


def test_the_likely_models_are_those_of_the_likely_option_planned_here() -> None:
    here = dict.fromkeys(PICK.tasks, "a")
    assert likely_models(PICK, "route", here, "a", _choices()) == ("n",)
    # planned elsewhere: not this worker's to load
    assert likely_models(PICK, "route", {**here, "tool": "b"}, "a", _choices()) == ()
    # a task that makes no choice, and a likely successor of the task's own model
    assert likely_models(PICK, "tool", here, "a", _choices()) == ()
    assert likely_models(PICK_OTHER, "route", here, "a", _choices()) == ()


def test_the_likely_models_follow_the_learned_choices() -> None:
    here = dict.fromkeys(PICK.tasks, "a")
    choices = _choices()
    for _ in range(40):  # the traffic says "other", the declaration "tool"
        choices.observe(PICK, "route", "other")
    assert likely_models(PICK, "route", here, "a", choices) == ()
    heard = _choices()  # what a peer learned: "tool", where "other" was declared likely
    heard.adopt("b", (("pick-other", "route", 0),))
    assert likely_models(PICK_OTHER, "route", here, "a", heard) == ("n",)


def test_a_loop_s_likely_tool_call_is_prefetched_and_its_bound_s_is_not() -> None:
    unfolding = AGENT.unfold
    assert unfolding is not None
    plan = dict.fromkeys(AGENT.tasks, "a")
    steps = sorted(t for t in AGENT.tasks if t.startswith("think@"))
    assert [likely_models(AGENT, t, plan, "a", _choices()) for t in steps] == [("n",), ("n",), ()]


# -- the worker core ---------------------------------------------------------------------------


def worker(
    policy: str = "compass", options: dict[str, Any] | None = None, names: tuple[str, ...] = ("a",)
) -> WorkerCore:
    """Worker a with one lane, a 10 GB cache holding m; n (1 GB) not resident."""
    profiles = Profiles(
        h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, net_fixed_s=1e-4,
        model_sizes={"m": GB, "n": GB}, workflows=WORKFLOWS.values(), staged=False,
    )  # fmt: skip
    cache = CacheCore(SlabPool(10 * GB, GB // 10), {"m": GB, "n": GB})
    plan = cache.plan_load("m")
    assert plan is not None
    cache.begin_load("m", plan)
    cache.finish_load("m")
    return build_core(
        "a", workflows=WORKFLOWS, policy=make_policy(policy, options=options),
        profiles=profiles, view=FakeView(names), cache=cache,
        options=CoreOptions(lanes=1, warm=False),
    )  # fmt: skip


def _run(core: WorkerCore, workflow: str = "pick") -> tuple[list[Instruction], list[Instruction]]:
    """Submit a job of ``workflow``: what the core did while its decision task ran (a load it
    began then ends before the task does), and after it finished (every load ends at once)."""
    during = core.handle(Submit(0.0, "j1", workflow, {}, 8, 0.0))
    (first,) = [s for s in during if isinstance(s, RunTask)]
    for step in list(during):
        if isinstance(step, LoadModel):
            during += core.handle(ModelLoaded(0.005, step.model, 0.001))
    after: list[Instruction] = []
    pending = core.handle(TaskDone(0.01, first.entry, None))
    while pending:
        step = pending.pop(0)
        after.append(step)
        if isinstance(step, LoadModel):
            pending += core.handle(ModelLoaded(0.02, step.model, 0.001))
    return during, after


def _ran(steps: list[Instruction]) -> list[tuple[str, bool | None]]:
    return [(s.entry.task, s.hit) for s in steps if isinstance(s, RunTask)]


def test_the_likely_successor_s_model_loads_while_the_choosing_task_runs() -> None:
    during, after = _run(worker())
    assert [(s.model, s.prefetch) for s in during if isinstance(s, LoadModel)] == [("n", True)]
    # the choice is drawn from the job's id: this job took the likely branch, whose model
    # was resident when it asked
    assert _ran(after) == [("tool", True)]
    assert not [s for s in after if isinstance(s, LoadModel)]


def test_switched_off_the_model_loads_only_once_the_choice_is_made() -> None:
    for core in (worker(options={"likely_prefetch": False}), worker("compass-chained")):
        during, after = _run(core)
        assert not [s for s in during if isinstance(s, LoadModel)]
        assert [(s.model, s.prefetch) for s in after if isinstance(s, LoadModel)] == [("n", False)]
        assert _ran(after) == [("tool", False)]


def test_a_static_workflow_s_successor_is_not_prefetched() -> None:
    during, after = _run(worker(), "static")
    assert not [s for s in during if isinstance(s, LoadModel)]
    assert [(s.model, s.prefetch) for s in after if isinstance(s, LoadModel)] == [("n", False)]
