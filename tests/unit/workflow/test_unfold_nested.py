"""Nested loops (a loop whose body holds another loop): unrolled with iteration tuples in the
names, a decision point per iteration of every enclosing loop, the skip rule applied per
level, and the declarations that cannot unroll refused (compass.workflow.unfold)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compass.errors import WorkflowError
from compass.workflow.choices import SKIPPED, Unfolding, stop
from compass.workflow.dag import Task, TaskProfile, Workflow
from compass.workflow.frequencies import ChoiceFrequencies
from compass.workflow.spec import parse_workload, workload_to_dict
from compass.workflow.unfold import (
    MAX_NESTED_ITERATIONS,
    Loop,
    run_chances,
    unfold_workflow,
)


def t(name: str, *after: str) -> Task:
    return Task(name, None, after, TaskProfile(exec_ms=10, output_bytes=100))


#: plan, then draft/check until check stops (the inner loop), then judge: all until judge
#: stops (the outer loop); check also reads the plan of its outer iteration
TASKS = [
    t("start"),
    t("plan", "start"),
    t("draft", "plan"),
    t("check", "draft", "plan"),
    t("judge", "check"),
    t("answer", "judge"),
]
OUTER = ("plan", "draft", "check", "judge")


def nested(outer: int = 3, inner: int = 2, **inner_options: Any) -> Workflow:
    loops = [Loop(OUTER, "judge", outer), Loop(("draft", "check"), "check", inner, **inner_options)]
    return unfold_workflow("nested", TASKS, loops=loops)


def unfolding(wf: Workflow) -> Unfolding:
    assert wf.unfold is not None
    return wf.unfold


# -- the unroll --------------------------------------------------------------------------------


def test_a_nested_loop_unrolls_with_an_iteration_tuple_in_each_name() -> None:
    wf = nested(3, 2)
    assert wf.order[:8] == (
        "start", "plan@0", "draft@0.0", "check@0.0", "draft@0.1", "check@0.1", "judge@0",
        "plan@1",
    )  # fmt: skip
    assert len(wf.order) == 2 + 3 * 2 + 3 * 2 * 2  # start, answer; plan, judge; draft, check
    assert wf.preds("draft@1.0") == ("plan@1",)  # the inner entry starts from its outer iteration
    assert wf.preds("draft@1.1") == ("check@1.0",)  # then from the previous inner iteration
    assert wf.preds("check@2.1") == ("draft@2.1", "plan@2")
    assert wf.preds("judge@1") == ("check@1.0", "check@1.1")  # the inner loop's last output
    assert wf.preds("plan@2") == ("judge@1",)
    assert wf.preds("answer") == ("judge@0", "judge@1", "judge@2")
    assert unfolding(wf).origin["check@2.1"] == "check"


def test_the_inner_loop_decides_afresh_in_every_outer_iteration() -> None:
    points = unfolding(nested(3, 2)).points
    for i in range(3):
        assert points[f"check@{i}.0"].labels == ("again", "stop")
        assert points[f"check@{i}.0"].options == (
            frozenset({f"draft@{i}.1"}),
            frozenset({f"judge@{i}"}),
        )
        assert points[f"check@{i}.1"].labels == ("stop",)  # the inner bound
    assert points["judge@2"].labels == ("stop",) and points["judge@0"].labels == ("again", "stop")


def test_a_single_loop_keeps_its_names() -> None:
    wf = unfold_workflow("one", [t("x"), t("y", "x")], loops=[Loop(("y",), "y", 3)])
    assert wf.order == ("x", "y@0", "y@1", "y@2")


# -- the skip rule, per level ------------------------------------------------------------------


def test_an_inner_loop_that_stops_skips_its_later_iterations_only() -> None:
    u = unfolding(nested(3, 3))
    route = u.route("check@1.0", stop("done"), "k", emulated=False)
    assert route.sends == (("judge@1", "done"),)
    # the later inner iterations: their check still hears of the plan, so it gets the marks
    assert ("check@1.1", "draft@1.1") in route.skips and ("judge@1", "check@1.2") not in route.skips
    choices = {"check@0.0": "again", "check@0.1": "stop", "judge@0": "again"}
    choices |= {"check@1.0": "stop", "judge@1": "again", "check@2.0": "again", "check@2.1": "again"}
    choices |= {"judge@2": "stop"}
    assert u.skipped_by(choices) == ("draft@0.2", "check@0.2", "draft@1.1", "check@1.1",
                                     "draft@1.2", "check@1.2")  # fmt: skip


def test_an_outer_loop_that_stops_skips_everything_after_inner_loops_included() -> None:
    u = unfolding(nested(3, 2))
    route = u.route("judge@0", stop("done"), "k", emulated=False)
    assert route.sends == (("answer", "done"),)
    assert route.skips == (("answer", "judge@1"), ("answer", "judge@2"))
    skipped = u.skipped_by({"check@0.0": "stop", "judge@0": "stop"})
    assert set(skipped) == {"draft@0.1", "check@0.1"} | {
        f"{task}@{i}{j}" for i in (1, 2) for task, j in [("plan", ""), ("judge", "")]
    } | {f"{task}@{i}.{j}" for i in (1, 2) for j in (0, 1) for task in ("draft", "check")}


def test_at_an_inner_loop_s_bound_its_body_after_until_never_runs_in_any_round() -> None:
    """An inner loop whose body goes on after its 'until' (draft, check, then a fix that only
    going on needs): at its bound, in every outer iteration, the fix is skipped."""
    tasks = [*TASKS[:4], t("fix", "check"), *TASKS[4:]]
    loops = [Loop((*OUTER, "fix"), "judge", 2), Loop(("draft", "check", "fix"), "check", 2)]
    u = unfolding(unfold_workflow("fixes", tasks, loops=loops))
    for i in range(2):
        assert u.points[f"check@{i}.1"].never == frozenset({f"fix@{i}.1"})
        assert u.points[f"check@{i}.0"].never == frozenset()
        route = u.route(f"check@{i}.1", "go on", "k", emulated=False)
        assert route.sends == ((f"judge@{i}", "go on"),)
        # the fix is dead: the next round's plan hears so from here; in the last round it is
        # a sink, reported as one that will not run
        dead = {p for _, p in route.skips} | set(route.dead_sinks)
        assert dead == {f"fix@{i}.1"}
    assert run_chances(unfold_workflow("fixes", tasks, loops=loops))["fix@0.1"] == 0.0


def test_an_input_from_outside_the_loop_does_not_keep_a_later_iteration_alive() -> None:
    """check@0.1 waits for draft@0.1 (skipped when the inner loop stopped) and plan@0 (ran):
    it is skipped, not run on a skip mark."""
    u = unfolding(nested(2, 2))
    assert u.side["check@0.1"] == frozenset({"plan@0"}) and "draft@0.0" not in u.side
    assert u.all_skipped("check@0.1", {"plan@0": "the plan", "draft@0.1": SKIPPED})
    assert not u.all_skipped("check@0.1", {"plan@0": SKIPPED, "draft@0.1": "a draft"})
    # the same in a single loop, where it was run before
    single = unfold_workflow(
        "single", [t("x"), t("a", "x"), t("b", "a", "x"), t("out", "b")],
        loops=[Loop(("a", "b"), "b", 3)],
    )  # fmt: skip
    assert unfolding(single).skipped_by({"b@0": "stop"}) == ("a@1", "b@1", "a@2", "b@2")
    assert run_chances(single)["b@2"] == run_chances(single)["a@2"] < 1.0


def test_each_inner_loop_draws_its_declared_count() -> None:
    always_two = run_chances(nested(3, 3, counts={2: 1}))
    for i in range(3):
        assert always_two[f"check@{i}.1"] == always_two[f"judge@{i}"] > 0
        assert always_two[f"check@{i}.2"] == 0.0
    spread = run_chances(nested(2, 3, counts={1: 1, 3: 1}), samples=2000)
    # within each outer iteration that ran, about half the inner loops ran three times
    assert spread["check@0.2"] == spread["check@0.1"]
    assert 0.4 < spread["check@0.2"] / spread["judge@0"] < 0.6


def test_learned_frequencies_move_an_inner_loop_s_likely_path() -> None:
    wf = nested(2, 3, counts={1: 3, 2: 1, 3: 1})
    frequencies = ChoiceFrequencies(lambda name: wf if name == wf.name else None)
    assert "draft@0.1" not in frequencies.likely(wf)  # stops at once, as declared
    for _ in range(60):
        frequencies.observe(wf, "check@0.0", "again")
    assert "draft@0.1" in frequencies.likely(wf)
    assert "draft@1.1" not in frequencies.likely(wf)  # learned per decision task


# -- declarations refused ----------------------------------------------------------------------


def test_the_product_of_nested_bounds_is_bounded() -> None:
    assert MAX_NESTED_ITERATIONS == 256
    nested(16, 16)  # 256 instances of draft: at the bound
    with pytest.raises(WorkflowError, match=r"'draft' would unroll to 16 x 17 = 272 instances"):
        nested(16, 17)


@pytest.mark.parametrize(
    ("loops", "problem"),
    [
        (
            [Loop(OUTER, "judge", 3), Loop(("check", "judge"), "judge", 2)],
            "two loops share the 'until' task 'judge'",
        ),
        (
            [Loop(OUTER, "judge", 3), Loop(("plan", "draft", "check"), "check", 2)],
            "holds its entry 'plan'",
        ),
        (
            [Loop(("plan", "draft", "check"), "check", 3), Loop(("check", "judge"), "judge", 2)],
            "overlapping bodies",
        ),
        ([Loop(("draft", "check"), "check", 3), Loop(("draft", "check"), "check", 2)], "same body"),
        ([Loop(OUTER, "judge", 3), Loop(("draft", "nope"), "draft", 2)], "unknown task 'nope'"),
        ([Loop(OUTER, "judge", 3), Loop(("draft",), "check", 2)], "'until' must be a task of"),
    ],
)
def test_bad_nestings_are_refused_with_what_is_wrong(loops: list[Loop], problem: str) -> None:
    with pytest.raises(WorkflowError, match=problem):
        unfold_workflow("bad", TASKS, loops=loops)


def test_a_nested_loop_may_not_hold_its_outer_loop_s_until() -> None:
    """Holding it, even as a task of its own body (not its 'until'), is refused: the outer
    loop's decision would be made once per inner iteration."""
    sink = TASKS[:-1]  # judge ends the workflow: nothing after the loop waits for it
    inner = Loop(("check", "judge"), "check", 2)
    with pytest.raises(WorkflowError, match="holds its 'until' 'judge'"):
        unfold_workflow("bad", sink, loops=[Loop(OUTER, "judge", 3), inner])


@pytest.mark.parametrize("inner", [["judge"], ["draft", "check", "judge"], ["check", "judge"]])
def test_loops_that_share_an_until_are_refused_in_a_spec_as_in_python(inner: list[str]) -> None:
    """A decision task takes one loop's options (again or stop): an inner loop that ended at
    its outer loop's 'until' would need one decision to say which loop goes on."""
    data = spec()
    data["workflows"]["refine"]["loops"]["inner"] = {
        "body": inner, "until": "judge", "max_iter": 2,
    }  # fmt: skip
    with pytest.raises(WorkflowError, match=r"'refine'.*share the 'until' task 'judge'"):
        parse_workload(data, source="nested.json")


# -- the workload spec -------------------------------------------------------------------------


def spec() -> dict[str, Any]:
    return {
        "cluster": {"workers": 2, "gpu_memory_mb": 1000, "h2d_gbps": 1, "d2h_gbps": 1,
                    "net_gbps": 1},
        "models": {"m": {"size_mb": 100}},
        "workflows": {"refine": {
            "tasks": {
                "plan": {"model": "m", "exec_ms": 5, "output_kb": 1},
                "draft": {"model": "m", "exec_ms": 20, "output_kb": 1, "after": ["plan"]},
                "check": {"model": "m", "exec_ms": 5, "output_kb": 1, "after": ["draft"]},
                "judge": {"model": "m", "exec_ms": 5, "output_kb": 1, "after": ["check"]},
            },
            "loops": {
                "outer": {"body": ["plan", "draft", "check", "judge"], "until": "judge",
                          "max_iter": 3, "counts": [1, 3]},
                "inner": {"body": ["draft", "check"], "until": "check", "max_iter": 4,
                          "counts": {"1": 1, "2": 2, "4": 1}},
            },
        }},
    }  # fmt: skip


def test_a_spec_declares_a_nested_loop_and_writes_it_back() -> None:
    workload = parse_workload(spec(), source="nested.json")
    wf = workload.workflows["refine"]
    assert sum(n.startswith("draft@") for n in wf.order) == 12
    back = parse_workload(json.loads(json.dumps(workload_to_dict(workload))), source="w")
    assert back.workflows["refine"].order == wf.order
    assert unfolding(back.workflows["refine"]).points == unfolding(wf).points


def test_a_spec_with_nested_loops_over_the_bound_names_the_workflow() -> None:
    data = spec()
    data["workflows"]["refine"]["loops"]["inner"]["max_iter"] = 100
    data["workflows"]["refine"]["loops"]["inner"].pop("counts")
    with pytest.raises(WorkflowError, match=r"'refine'.*3 x 100 = 300 instances"):
        parse_workload(data, source="nested.json")
