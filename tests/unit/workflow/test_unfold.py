"""Branches, fan-outs and bounded loops: declared, validated, unrolled, and routed by the skip
rule (compass.workflow.unfold and compass.workflow.choices)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from compass.errors import WorkflowError
from compass.sched.unfold import shortest_remaining_s
from compass.workflow.batching import apply_batching
from compass.workflow.choices import SKIPPED, Unfolding, choose, fan_out, stop
from compass.workflow.dag import Task, TaskProfile, Workflow
from compass.workflow.profile import Profiles
from compass.workflow.spec import load_workload, parse_workload, workload_to_dict
from compass.workflow.unfold import (
    Branch,
    FanOut,
    Loop,
    likely_workflow,
    run_chances,
    unfold_workflow,
)

AGENT_LOOP = Path(__file__).parents[3] / "bench" / "workloads" / "agent-loop.json"


def t(name: str, *after: str, ms: float = 10.0, model: str | None = None, fn: Any = None) -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=ms, output_bytes=100), fn=fn)


def unfolding(wf: Workflow) -> Unfolding:
    assert wf.unfold is not None
    return wf.unfold


def agent(max_iter: int = 3) -> Workflow:
    tasks = [t("llm", ms=100), t("a", "llm"), t("b", "llm"), t("answer", "llm", ms=1)]
    return unfold_workflow(
        "agent",
        tasks,
        branches=[Branch("llm", {"a": 3, "b": 1})],
        loops=[Loop(("llm", "a", "b"), "llm", max_iter)],
    )


# -- declaration -------------------------------------------------------------------------------


def test_a_workflow_without_choices_stays_the_static_workflow() -> None:
    wf = unfold_workflow("plain", [t("x"), t("y", "x")])
    assert wf.unfold is None and wf.order == ("x", "y")


def test_a_loop_unrolls_to_its_bound_and_its_exit_waits_for_every_iteration() -> None:
    wf = agent(3)
    assert wf.order == (
        "llm@0", "a@0", "b@0", "llm@1", "a@1", "b@1", "llm@2", "a@2", "b@2", "answer",
    )  # fmt: skip
    assert wf.preds("llm@1") == ("a@0", "b@0")  # the next iteration starts from the body's end
    assert wf.preds("answer") == ("llm@0", "llm@1", "llm@2")
    assert wf.unfold is not None and wf.unfold.origin["a@2"] == "a"
    last = unfolding(wf).points["llm@2"]
    assert last.labels == ("stop",)  # the bound: the last iteration can only stop


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"branches": [Branch("x", {"y": 1, "nope": 1})]}, "'nope', which is not one of its"),
        ({"branches": [Branch("x", {"y": 1})]}, "two or more"),
        ({"loops": [Loop(("y",), "y", 0)]}, "a loop needs a bound"),
        ({"loops": [Loop(("y",), "z", 3)]}, "'until' must be a task of its body"),
        ({"loops": [Loop(("x", "y"), "x", 3)]}, "'z' waits for body task 'y'"),
        ({"fanouts": [FanOut("x", "y", "z", 0)]}, "max_width must be an integer"),
        ({"fanouts": [FanOut("x", "z", "y", 4)]}, "must wait for 'x' alone"),
        ({"branches": [Branch("x", {"y": -1, "w": 1})]}, "weights must be numbers >= 0"),
    ],
)
def test_bad_declarations_are_refused_with_what_is_wrong(
    kwargs: dict[str, Any], problem: str
) -> None:
    tasks = [t("x"), t("y", "x"), t("w", "x"), t("z", "y", "w")]
    with pytest.raises(WorkflowError, match=problem):
        unfold_workflow("bad", tasks, **kwargs)


def test_a_loop_entry_that_cannot_take_the_carried_output_is_refused_at_declaration() -> None:
    def llm(module: Any, prompt: Any = None) -> Any:  # no 'carry': iteration 2 could not run
        return prompt

    tasks = [t("llm", fn=llm), t("a", "llm", fn=lambda m, llm: llm),
             t("b", "llm", fn=lambda m, llm: llm)]  # fmt: skip
    loop = Loop(("llm", "a", "b"), "llm", 3)
    with pytest.raises(WorkflowError, match=r"cannot be called with \(module, carry\)"):
        unfold_workflow("agent", tasks, loops=[loop])


# -- routes and the skip rule ------------------------------------------------------------------


def test_a_loop_that_stops_skips_every_later_iteration_in_one_step() -> None:
    wf = agent(3)
    route = unfolding(wf).route("llm@0", stop("done"), "k", emulated=False)
    assert route.sends == (("answer", "done"),)
    # the tools of this iteration and everything after are dead: the exit hears of the
    # iterations that will not come, the tools of the last one are sinks never to run
    assert route.skips == (("answer", "llm@1"), ("answer", "llm@2"))
    assert set(route.dead_sinks) == {"a@2", "b@2"}


@pytest.mark.parametrize("told", [choose("q", "a"), stop("q"), "q"])
def test_at_the_bound_the_body_after_until_never_runs_whatever_until_says(told: Any) -> None:
    """The last iteration can only stop: its tools are skipped (sinks that will never run),
    whether the model asked for one, said stop, or returned a plain output."""
    wf = agent(3)
    rules = unfolding(wf)
    assert rules.points["llm@2"].never == frozenset({"a@2", "b@2"})
    route = rules.route("llm@2", told, "k", emulated=False)
    assert route.sends == (("answer", "q"),) and route.label == "stop"
    assert route.skips == () and set(route.dead_sinks) == {"a@2", "b@2"}
    assert rules.runs("llm@2", 0) == frozenset({"answer"})


def test_an_emulated_job_at_the_bound_draws_no_tool_after_its_last_step() -> None:
    rules = unfolding(agent(3))
    for job in range(50):
        route = rules.route("llm@2", None, f"{job}|llm@2", emulated=True)
        assert [s for s, _ in route.sends] == ["answer"]
    assert run_chances(agent(3))["a@2"] == 0.0 == run_chances(agent(3))["b@2"]


def test_a_job_record_counts_the_tools_after_the_bound_as_skipped() -> None:
    rules = unfolding(agent(3))
    skipped = rules.skipped_by({"llm@0": "a", "llm@1": "b", "llm@2": "stop"})
    assert set(skipped) == {"b@0", "a@1", "a@2", "b@2"}
    # before the last choice is heard, what follows it is unknown, except what never runs
    assert set(rules.skipped_by({"llm@0": "a", "llm@1": "b"})) == {"b@0", "a@1", "a@2", "b@2"}


def test_the_likely_path_through_every_iteration_ends_without_a_tool() -> None:
    tasks = [t("llm", ms=100), t("a", "llm"), t("b", "llm"), t("answer", "llm", ms=1)]
    wf = unfold_workflow(
        "long", tasks, branches=[Branch("llm", {"a": 3, "b": 1})],
        loops=[Loop(("llm", "a", "b"), "llm", 3, counts={3: 1})],
    )  # fmt: skip
    assert likely_workflow(wf).order == ("llm@0", "a@0", "llm@1", "a@1", "llm@2", "answer")


def test_a_branch_sends_to_its_choice_and_marks_the_others_skipped() -> None:
    wf = agent(3)
    route = unfolding(wf).route("llm@0", choose("q", "b"), "k", emulated=False)
    assert route.sends == (("b@0", "q"),) and route.label == "b"
    # going on, not stopping: the exit hears this iteration will not be the last; a@0 is
    # dead, and llm@1, which still waits for b@0, hears that a@0 will not come
    assert route.skips == (("answer", "llm@0"), ("llm@1", "a@0")) and route.dead_sinks == ()


def test_a_plain_output_of_a_branch_is_refused_naming_the_choices() -> None:
    wf = agent(3)
    with pytest.raises(WorkflowError, match=r"return compass\.choose"):
        unfolding(wf).route("llm@0", "just text", "k", emulated=False)
    with pytest.raises(WorkflowError, match="'c', which is not one of its branches"):
        unfolding(wf).route("llm@0", choose("x", "c"), "k", emulated=False)


def test_a_fan_out_gives_each_copy_its_item_and_skips_the_rest() -> None:
    tasks = [t("x"), t("c", "x"), t("j", "c")]
    wf = unfold_workflow("fan", tasks, fanouts=[FanOut("x", "c", "j", 4)])
    route = unfolding(wf).route("x", fan_out(["p", "q"]), "k", emulated=False)
    assert route.sends == (("c#0", "p"), ("c#1", "q"))
    assert route.skips == (("j", "c#2"), ("j", "c#3"))
    with pytest.raises(WorkflowError, match="max_width is 4"):
        unfolding(wf).route("x", list(range(5)), "k", emulated=False)


def test_draws_follow_the_declared_counts() -> None:
    """A loop's stop chance per iteration is set so that the number of iterations drawn has
    the declared distribution (here: 2 three times as often as 3, never 1)."""
    tasks = [t("step"), t("out", "step")]
    wf = unfold_workflow("l", tasks, loops=[Loop(("step",), "step", 3, counts={2: 3, 3: 1})])
    iterations: Counter[int] = Counter()
    rules = unfolding(wf)
    for job in range(4000):
        i = 0
        while rules.route(f"step@{i}", None, f"{job}|step@{i}", emulated=True).label != "stop":
            i += 1
        iterations[i + 1] += 1
    assert iterations[1] == 0
    assert 2.6 < iterations[2] / iterations[3] < 3.4


def test_run_chances_give_how_often_each_task_runs() -> None:
    """What the physical bound counts: a later iteration runs only as often as jobs get there."""
    chances = run_chances(agent(3))  # 1, 2 or 3 iterations alike; tool a three times b's
    assert chances["llm@0"] == 1.0 == chances["answer"]
    assert chances["llm@1"] == pytest.approx(2 / 3, abs=0.05)
    assert chances["llm@2"] == pytest.approx(1 / 3, abs=0.05)
    assert chances["a@0"] == pytest.approx(0.75 * 2 / 3, abs=0.05)
    assert set(run_chances(unfold_workflow("s", [t("x")])).values()) == {1.0}


def test_the_likely_workflow_takes_each_most_likely_choice() -> None:
    wf = agent(3)
    # the loop goes on at first (it stops after 1, 2 or 3 iterations alike), through 'a'
    assert likely_workflow(wf).order == ("llm@0", "a@0", "llm@1", "answer")


def test_the_shortest_remaining_path_stops_the_loop_now() -> None:
    wf = agent(3)
    profiles = Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, workflows=[wf])
    left = shortest_remaining_s(wf, profiles, "w0")
    # a job at any LLM step can still stop there: its least work left is that step and the answer
    assert left["llm@0"] == pytest.approx(0.101) == left["llm@1"]
    assert left["llm@2"] == pytest.approx(0.101)  # at the bound too: no tool runs after it
    assert left["a@0"] == pytest.approx(0.010 + 0.101)


# -- the spec ----------------------------------------------------------------------------------


def test_the_agent_loop_workload_parses_into_unrolled_workflows() -> None:
    workload = load_workload(AGENT_LOOP)
    agent_wf = workload.workflows["agent"]
    assert agent_wf.unfold is not None
    assert len([n for n in agent_wf.order if n.startswith("llm@")]) == 7
    fan = workload.workflows["retrieval"]
    assert len(fan.preds("generate")) == 20
    assert fan.unfold is not None and fan.unfold.points["retrieve"].weights[1] == 0.0
    assert unfolding(workload.workflows["router"]).points["route"].labels[0] == "expert_a"


@pytest.mark.parametrize("batching", [False, True])
def test_choices_survive_a_batching_transform_and_the_spec_writer(batching: bool) -> None:
    """Worker processes get a transformed workload as a file: its choices must come back."""
    workload = apply_batching(load_workload(AGENT_LOOP), batching=batching, gain="mild")
    back = parse_workload(json.loads(json.dumps(workload_to_dict(workload))), source="w")
    for name, wf in workload.workflows.items():
        assert unfolding(wf).points == unfolding(load_workload(AGENT_LOOP).workflows[name]).points
        again = back.workflows[name]
        assert again.order == wf.order and dict(again.tasks) == dict(wf.tasks)
        assert unfolding(again).points == unfolding(wf).points
    assert workload.workflows["agent"].tasks["llm@3"].batch == (8 if batching else 1)


def test_a_spec_loop_without_a_bound_names_its_key() -> None:
    data = {
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 1, "d2h_gbps": 1,
                    "net_gbps": 1},
        "models": {},
        "workflows": {"w": {"tasks": {"x": {"exec_ms": 1, "output_kb": 1}},
                            "loops": {"l": {"body": ["x"], "until": "x"}}}},
    }  # fmt: skip
    with pytest.raises(WorkflowError, match=r"workflows\.w\.loops\.l\.max_iter: expected an"):
        parse_workload(data, source="s.json")


def test_a_skip_mark_is_a_plain_string_that_crosses_the_wire() -> None:
    assert isinstance(SKIPPED, str)
