"""The worker core runs workflows decided at run time (compass.core.unfold): real task
functions choose, several cores pass outputs and skip marks to each other, and the ingress
answers once every sink ran or was skipped."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from compass.core.assemble import CoreOptions, build_core
from compass.core.events import Answer, Instruction, Received, Send, Submit, TaskDone
from compass.core.lanes import RunTask
from compass.core.messages import ResultMsg, TaskMsg
from compass.core.state import WorkerCore
from compass.core.unfold import ChainedStep
from compass.errors import DeadlineExceeded, WorkflowError
from compass.objective import NO_OBJECTIVE, Objective
from compass.sched import make_policy
from compass.workflow import Profiles, Task, TaskProfile, Workflow
from compass.workflow.choices import SKIPPED, choose, fan_out, is_skipped, stop
from compass.workflow.unfold import Branch, FanOut, Loop, unfold_workflow

from .test_state import GB, FakeView, resident_cache

# -- workflows with real functions -------------------------------------------------------------


def _t(name: str, fn: Any, *after: str, model: str | None = "m") -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=10, output_bytes=100), fn=fn)


def _route(module: Any, x: int) -> Any:
    return choose(x, "double" if x % 2 == 0 else "negate")


ROUTER = unfold_workflow(
    "router",
    [
        _t("route", _route),
        _t("double", lambda m, route: 2 * route, "route"),
        _t("negate", lambda m, route: -route, "route"),
        _t("report", lambda m, double, negate: (double, negate), "double", "negate", model=None),
    ],
    branches=[Branch("route", {"double": 1, "negate": 1})],
)

#: a fork to two sinks, one of which the branch skips
SPLIT = unfold_workflow(
    "split",
    [
        _t("route", _route),
        _t("double", lambda m, route: 2 * route, "route"),
        _t("negate", lambda m, route: -route, "route"),
    ],
    branches=[Branch("route", {"double": 1, "negate": 1})],
)

FAN = unfold_workflow(
    "fan",
    [
        _t("split", lambda m, x: fan_out(range(x))),
        _t("square", lambda m, split: split * split, "split"),
        _t("total", lambda m, square: ("sum", square), "square", model=None),
    ],
    fanouts=[FanOut("split", "square", "total", max_width=5)],
)


def _think(module: Any, x: Any = None, carry: Any = None) -> Any:
    """An agent's model: it counts its steps and stops on its own output at 3."""
    steps = 1 if carry is None else carry + 1
    if steps >= 3:
        return stop(steps)
    return choose(steps, "look" if steps % 2 else "act")


AGENT = unfold_workflow(
    "agent",
    [
        _t("think", _think),
        _t("look", lambda m, think: think, "think"),
        _t("act", lambda m, think: think, "think"),
        _t("answer", lambda m, think: f"answered after {think}", "think", model=None),
    ],
    branches=[Branch("think", {"look": 1, "act": 1})],
    loops=[Loop(("think", "look", "act"), "think", max_iter=5)],
)


def _stubborn(module: Any, x: Any = None, carry: Any = None) -> Any:
    """An agent's model that always asks for another tool: only the loop's bound ends it."""
    steps = 1 if carry is None else carry + 1
    return choose(steps, "look")


#: never stops by itself: it reaches its bound of 3 steps
STUBBORN = unfold_workflow(
    "stubborn",
    [
        _t("think", _stubborn),
        _t("look", lambda m, think: think, "think"),
        _t("act", lambda m, think: think, "think"),
        _t("answer", lambda m, think: f"answered after {think}", "think", model=None),
    ],
    branches=[Branch("think", {"look": 1, "act": 1})],
    loops=[Loop(("think", "look", "act"), "think", max_iter=3)],
)

#: emulated: its choices are drawn
EMULATED = unfold_workflow(
    "emulated",
    [Task("route", "m", (), TaskProfile(10, 100))]
    + [Task(name, "m", ("route",), TaskProfile(10, 100)) for name in ("p", "q", "r")],
    branches=[Branch("route", {"p": 1, "q": 1, "r": 1})],
)

WORKFLOWS = {wf.name: wf for wf in (ROUTER, SPLIT, FAN, AGENT, STUBBORN, EMULATED)}


class Cluster:
    """Cores of ``names`` passing messages to each other in order; a task runs its function
    (an emulated one outputs None). Records every task run and every message sent."""

    def __init__(
        self,
        names: Sequence[str] = ("a", "b", "c"),
        policy: str = "compass",
        options: dict[str, Any] | None = None,
        workflows: Mapping[str, Workflow] = WORKFLOWS,
    ) -> None:
        self.views = {n: FakeView(names) for n in names}
        profiles = Profiles(
            h2d_bytes_per_s=1e9,
            net_bytes_per_s=1e9,
            net_fixed_s=1e-4,
            model_sizes={"m": GB},
            workflows=workflows.values(),
            staged=False,
        )
        self.cores: dict[str, WorkerCore] = {
            n: build_core(
                n,
                workflows=workflows,
                policy=make_policy(policy, options=options),
                profiles=profiles,
                view=self.views[n],
                cache=resident_cache("m"),
                options=CoreOptions(lanes=8, warm=False),
            )
            for n in names
        }
        self.now = 0.0  # each task run takes 0.1 s of it
        self.ran: list[tuple[str, str, str]] = []  # (job, task, worker)
        self.sent: list[Send] = []
        self.answers: dict[str, Answer] = {}

    def submit(
        self,
        job: str,
        workflow: str,
        at: str = "a",
        objective: Objective = NO_OBJECTIVE,
        **inputs: Any,
    ) -> Answer:
        submit = Submit(self.now, job, workflow, inputs, 8, self.now, objective=objective)
        self._drain(at, self.cores[at].handle(submit))
        return self.answers[job]

    def _drain(self, first: str, steps: list[Instruction]) -> None:
        pending = [(first, s) for s in steps]
        while pending:
            where, step = pending.pop(0)
            core = self.cores[where]
            if isinstance(step, RunTask):
                entry = step.entry
                self.ran.append((entry.job_id, entry.task, where))
                task = core.workflow(entry.workflow).tasks[entry.task]
                output = None if task.fn is None else task.call(None, entry.inputs)
                self.now += 0.1
                pending += [(where, s) for s in core.handle(TaskDone(self.now, entry, output))]
            elif isinstance(step, Send):
                self.sent.append(step)
                event = Received(self.now, where, step.msg)
                pending += [(step.peer, s) for s in self.cores[step.peer].handle(event)]
            elif isinstance(step, Answer):
                self.answers[step.job_id] = step

    def tasks_run(self, job: str) -> list[str]:
        return [task for j, task, _ in self.ran if j == job]


def spread(cluster: Cluster) -> None:
    """Make every worker look busy but the next one: plans spread over the cluster."""
    for n, view in cluster.views.items():
        for m in view.waits:
            view.waits[m] = 0.0 if m != n else 5.0


# -- the rules ---------------------------------------------------------------------------------


def test_a_branch_runs_its_choice_and_the_join_gets_a_skipped_mark_for_the_other() -> None:
    cluster = Cluster()
    spread(cluster)
    answer = cluster.submit("a-1", "router", x=4)
    assert answer.error is None and answer.value == (8, SKIPPED)
    assert sorted(cluster.tasks_run("a-1")) == ["double", "report", "route"]
    odd = cluster.submit("a-2", "router", x=3)
    assert odd.value == (SKIPPED, -3)
    assert "double" not in cluster.tasks_run("a-2")


def test_a_skipped_sink_is_reported_and_the_job_answers_with_the_sink_that_ran() -> None:
    cluster = Cluster(("a",))
    answer = cluster.submit("a-1", "split", x=5)
    # one sink ran: the answer is its output, as a static workflow of one sink answers
    assert answer.error is None and answer.value == -5
    assert sorted(cluster.tasks_run("a-1")) == ["negate", "route"]
    both = Cluster(("a",))
    # the ingress waited for the skipped sink's report: it answers once, with the output
    assert both.submit("a-2", "split", x=2).value == 4 and len(both.answers) == 1


def test_a_fan_out_runs_one_copy_per_item_and_the_join_gets_their_list_in_order() -> None:
    cluster = Cluster()
    spread(cluster)
    answer = cluster.submit("a-1", "fan", x=3)
    assert answer.error is None and answer.value == ("sum", [0, 1, 4])
    assert sorted(cluster.tasks_run("a-1")) == ["split", "square#0", "square#1", "square#2",
                                                "total"]  # fmt: skip
    # copies 3 and 4 never run: their worker hears nothing of them, the join hears of them
    marks = [s.msg for s in cluster.sent if isinstance(s.msg, TaskMsg) and is_skipped(s.msg.value)]
    assert {m.source for m in marks if m.task == "total"} <= {"square#3", "square#4"}


def test_a_loop_stops_on_the_model_s_own_output() -> None:
    cluster = Cluster()
    spread(cluster)
    answer = cluster.submit("a-1", "agent", x=0)
    assert answer.error is None and answer.value == "answered after 3"
    assert cluster.tasks_run("a-1") == ["think@0", "look@0", "think@1", "act@1", "think@2",
                                        "answer"]  # fmt: skip


@pytest.mark.parametrize("policy", ["compass", "compass-chained", "jsq"])
def test_a_loop_at_its_bound_answers_without_running_the_tool_its_model_asked_for(
    policy: str,
) -> None:
    cluster = Cluster(policy=policy)
    spread(cluster)
    answer = cluster.submit("a-1", "stubborn", x=0)
    # one answer, the exit's: the last step's tool never ran, so it is no sink that ran
    assert answer.error is None and answer.value == "answered after 3"
    assert cluster.tasks_run("a-1") == ["think@0", "look@0", "think@1", "look@1", "think@2",
                                        "answer"]  # fmt: skip
    assert answer.record["choices"]["think@2"] == "stop"
    assert {"look@2", "act@2"} <= set(answer.record["skipped"])


def test_a_bad_choice_fails_its_job_naming_the_task_and_the_worker_serves_on() -> None:
    def bad(module: Any, x: int) -> Any:
        return x  # a branch that does not say which way

    wrong = unfold_workflow(
        "wrong",
        [_t("route", bad), _t("p", lambda m, route: route, "route"),
         _t("q", lambda m, route: route, "route")],
        branches=[Branch("route", {"p": 1, "q": 1})],
    )  # fmt: skip
    WORKFLOWS["wrong"] = wrong
    try:
        cluster = Cluster(("a",))
        answer = cluster.submit("a-1", "wrong", x=1)
        assert isinstance(answer.error, WorkflowError)
        assert "'route'" in str(answer.error) and "compass.choose" in str(answer.error)
        assert cluster.submit("a-2", "router", x=2).value == (4, SKIPPED)
    finally:
        del WORKFLOWS["wrong"]


def test_emulated_choices_are_drawn_the_same_on_every_policy() -> None:
    runs = {}
    for policy in ("compass", "compass-chained", "jsq"):
        cluster = Cluster(policy=policy)
        for k in range(12):
            assert cluster.submit(f"a-{k}", "emulated").error is None
        runs[policy] = [tuple(sorted(cluster.tasks_run(f"a-{k}"))) for k in range(12)]
    assert runs["compass"] == runs["compass-chained"] == runs["jsq"]
    chosen = {tasks[1] if tasks[0] == "route" else tasks[0] for tasks in runs["compass"]}
    assert len(chosen) > 1  # not one fixed way


def test_chained_steps_go_through_the_ingress_as_new_jobs() -> None:
    cluster = Cluster(policy="compass-chained")
    for view in cluster.views.values():  # the ingress is busy: every task runs on a peer
        view.waits["a"] = 5.0
    assert cluster.submit("a-1", "agent", x=0).value == "answered after 3"
    steps = [s for s in cluster.sent if isinstance(s.msg, ResultMsg)
             and isinstance(s.msg.value, ChainedStep)]  # fmt: skip
    assert steps and all(s.peer == "a" for s in steps)  # each choice back to the ingress
    # what the ingress sends on is aged from its own send, not from the job's submission
    onward = [s.msg for s in cluster.sent if isinstance(s.msg, TaskMsg)]
    assert [(m.source, m.t0) for m in onward if m.task == "look@0"] == [("think@0", 0.1)]


def test_a_chained_job_counts_as_load_one_step_at_a_time() -> None:
    """A user's client submits one step at a time, knowing nothing of the rest: at admission
    only the first step (the first think) counts in its worker's wait, and each later step
    counts when the ingress sends it on, as a fresh job's plan would."""
    cluster = Cluster(policy="compass-chained")
    view = cluster.views["a"]
    view.waits["a"] = 5.0  # busy: the job's tasks are placed on its peers, and counted there
    cluster.cores["a"].handle(Submit(0.0, "a-1", "agent", {"x": 0}, 8, 0.0))
    assert len(view.placed) == 1
    cluster = Cluster(policy="compass-chained")
    view = cluster.views["a"]
    view.waits["a"] = 5.0
    assert cluster.submit("a-1", "agent", x=0).value == "answered after 3"
    # the choices are made on the peers, and sent on by the ingress: its view counts the
    # first think, then each tool with the think it feeds (those placed on peers)
    assert len(view.placed) >= 1 + 2
    assert set(view.jobs) == {"a-1"}


def test_compass_counts_as_load_one_step_at_a_time_unless_told_the_likely_path() -> None:
    """Compass counts a job's first step at admission, and each later step on the worker
    whose choice starts it (the work of later steps comes later than the next heartbeats);
    with ``count_likely_path`` the whole likely path at admission, as before."""
    counts = {}
    for likely_path in (False, True):
        cluster = Cluster(options={"count_likely_path": likely_path})
        spread(cluster)
        cluster.cores["a"].handle(Submit(0.0, "a-1", "agent", {"x": 0}, 8, 0.0))
        counts[likely_path] = len(cluster.views["a"].placed)
    assert counts[False] == 1 < counts[True]
    cluster = Cluster(options={"count_likely_path": False})
    spread(cluster)
    assert cluster.submit("a-1", "agent", x=0).value == "answered after 3"
    choices = [w for _, task, w in cluster.ran if task.startswith("think")][:-1]
    # each choice (but the last, a stop to the model-less answer) counted the step it starts
    # on its own worker's view
    assert all(cluster.views[w].placed for w in choices)


def test_a_plan_counts_as_load_only_the_tasks_the_job_will_likely_run() -> None:
    """The unrolled agent holds five iterations of both tools; counting them all in the
    peers' waits would make them look busy with work that never comes."""
    cluster = Cluster()
    view = cluster.views["a"]
    view.waits["a"] = 5.0  # busy: the job's tasks are placed on its peers, and counted there
    cluster.cores["a"].handle(Submit(0.0, "a-1", "agent", {"x": 0}, 8, 0.0))
    assert AGENT.unfold is not None
    likely = AGENT.unfold.likely
    # iterations 1-5 alike: it likely goes on until the stop is the likeliest option, at the
    # fourth step (a tie between the tools goes to the first declared)
    assert likely == {"think@0", "look@0", "think@1", "look@1", "think@2", "look@2", "think@3",
                      "answer"}  # fmt: skip
    # the model-less answer is counted too; nothing of the later iterations is
    assert 0 < len(view.placed) <= len(likely) < len(AGENT.order)


def test_a_loop_that_can_no_longer_make_its_deadline_is_dropped_at_its_next_step() -> None:
    """Each step takes 0.1 s here. The least work left at any step is to stop: the job is
    not dropped at its start for the iterations it might run, but at the first step that
    starts past what even stopping there could make."""
    cluster = Cluster(("a",))
    answer = cluster.submit("a-1", "agent", objective=Objective(deadline_s=0.25), x=0)
    assert isinstance(answer.error, DeadlineExceeded)
    assert cluster.tasks_run("a-1") == ["think@0", "look@0", "think@1"]
    # with time for its three steps and the answer, it finishes
    assert cluster.submit("a-2", "agent", objective=Objective(deadline_s=2.0), x=0).error is None


def test_the_ingress_records_the_choices_a_job_made_and_the_tasks_it_skipped() -> None:
    """Each decision task tells the ingress its choice (a ChoseMsg): the job's record holds
    them, in words by declared task, and the unrolled tasks it skipped (what `compass status`
    and the dashboard show)."""
    cluster = Cluster()
    spread(cluster)
    agent = cluster.submit("a-1", "agent", x=0)
    ran = cluster.tasks_run("a-1")
    assert agent.record["choices"] == {"think@0": "look", "think@1": "act", "think@2": "stop"}
    assert agent.record["taken"] == "think: 3 iterations (look, act)"
    assert agent.record["skipped"] == [t for t in AGENT.order if t not in ran]
    fan = cluster.submit("a-2", "fan", x=3).record
    assert (fan["taken"], fan["skipped"]) == ("split: width 3", ["square#3", "square#4"])
    assert cluster.submit("a-3", "router", x=3).record["skipped"] == ["double"]
    # a choice the ingress has not heard (it crossed another link): what follows is unknown,
    # not skipped
    assert AGENT.unfold is not None
    assert AGENT.unfold.skipped_by({"think@0": "look"}) == ("act@0",)


def test_the_ingress_learns_the_likely_path_from_the_choices_it_hears() -> None:
    """Declared, the agent likely loops four times with its first tool; its jobs here all
    stop at the third step after a look and an act. The ingress learns that path from the
    choices reported to it, and plans and ranks with it (its best time moves too)."""
    cluster = Cluster()
    spread(cluster)
    core = cluster.cores["a"]
    assert AGENT.unfold is not None
    declared = AGENT.unfold.likely
    best_before = core.estimates.best_s(AGENT)
    counted_before = _counted(cluster, "before")
    for k in range(40):
        cluster.submit(f"a-{k}", "agent", x=0)
    ran = set(cluster.tasks_run("a-0"))
    assert core.estimates.choices.likely(AGENT) == ran != declared
    assert core.estimates.best_s(AGENT) < best_before  # three steps, not four
    # a fresh plan counts as load what the job will now likely run: two tasks fewer
    assert _counted(cluster, "after") == counted_before - 2
    # and tells its peers the decision tasks whose likely option moved
    assert ("agent", "think@2", 2) in core.estimates.choices.spread()


def _counted(cluster: Cluster, job: str) -> int:
    """How many tasks a fresh plan of an agent job at busy worker a counts on its peers."""
    view = cluster.views["a"]
    view.placed.clear()
    waits = dict(view.waits)
    view.waits["a"] = 5.0
    cluster.cores["a"].handle(Submit(cluster.now, job, "agent", {"x": 0}, 8, cluster.now))
    view.waits.update(waits)
    return len(view.placed)
