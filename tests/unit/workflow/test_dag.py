"""Workflow validation, orders and upward rank."""

from __future__ import annotations

import itertools

import pytest

from compass.errors import InvalidInputs, ModelTooLarge, WorkflowError
from compass.workflow import Task, TaskProfile, Workflow


def task(name: str, *after: str, model: str | None = None, ms: float = 1.0, out: int = 0) -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=ms, output_bytes=out))


def test_empty_workflow_is_an_error() -> None:
    with pytest.raises(WorkflowError, match="'w' has no tasks"):
        Workflow("w", [])


def test_duplicate_task_names_are_an_error() -> None:
    with pytest.raises(WorkflowError, match="duplicate task name 'a'"):
        Workflow("w", [task("a"), task("a")])


def test_unknown_dependency_names_both_tasks() -> None:
    with pytest.raises(WorkflowError, match="task 'b' waits for unknown task 'x'"):
        Workflow("w", [task("a"), task("b", "x")])


def test_self_dependency_is_an_error() -> None:
    with pytest.raises(WorkflowError, match="task 'a' waits for itself"):
        Workflow("w", [task("a", "a")])


def test_repeated_dependency_is_an_error() -> None:
    with pytest.raises(WorkflowError, match="lists 'a' twice"):
        Workflow("w", [task("a"), task("b", "a", "a")])


def test_cycle_names_exactly_the_tasks_on_it() -> None:
    tasks = [task("root"), task("a", "root", "c"), task("b", "a"), task("c", "b"), task("d", "c")]
    with pytest.raises(WorkflowError, match="has a cycle") as info:
        Workflow("w", tasks)
    cycle = info.value.detail["cycle"]
    assert cycle[0] == cycle[-1]
    assert set(cycle) == {"a", "b", "c"}
    assert len(cycle) == 4
    # each step of the reported cycle is a real dependency, in execution direction
    after = {t.name: t.after for t in tasks}
    for first, second in itertools.pairwise(cycle):
        assert first in after[second]
    assert " -> ".join(cycle) in str(info.value)


def test_bad_task_fields_are_errors() -> None:
    with pytest.raises(WorkflowError, match="exec_ms"):
        TaskProfile(exec_ms=-1.0, output_bytes=0)
    with pytest.raises(WorkflowError, match="output_bytes"):
        TaskProfile(exec_ms=1.0, output_bytes=-5)
    with pytest.raises(WorkflowError, match="after"):
        Task("a", None, "b", TaskProfile(1.0, 0))  # type: ignore[arg-type]
    with pytest.raises(WorkflowError, match="best_ms"):
        Workflow("w", [task("a")], best_ms=0)


def test_topological_order_is_stable_and_valid() -> None:
    wf = Workflow("w", [task("join", "b", "a"), task("b", "a"), task("a"), task("solo")])
    assert wf.order == ("a", "b", "join", "solo")
    assert list(wf.tasks) == list(wf.order)
    assert dict(wf.index) == {"a": 0, "b": 1, "join": 2, "solo": 3}
    # declared in a valid order: kept as declared
    wf2 = Workflow("w", [task("a"), task("x", "a"), task("b"), task("y", "b")])
    assert wf2.order == ("a", "x", "b", "y")


def test_structure_queries() -> None:
    wf = Workflow(
        "w",
        [task("r", model="m1"), task("x", "r", model="m2"), task("y", "r"), task("j", "x", "y")],
    )
    assert wf.roots == ("r",)
    assert wf.sinks == ("j",)
    assert wf.preds("j") == ("x", "y")
    assert wf.succs("r") == ("x", "y")
    assert wf.is_join("j")
    assert not wf.is_join("x")
    assert wf.models == frozenset({"m1", "m2"})
    with pytest.raises(WorkflowError, match="no task 'nope'"):
        wf.preds("nope")


def test_upward_rank_matches_hand_computation() -> None:
    # a -> b, a -> c, (b, c) -> d; at 1e6 B/s: out(a) 1 ms, out(b) 2 ms, out(c) 0
    wf = Workflow(
        "w",
        [
            task("a", ms=10, out=1000),
            task("b", "a", ms=20, out=2000),
            task("c", "a", ms=5, out=0),
            task("d", "b", "c", ms=1, out=50),
        ],
    )
    rank = wf.upward_rank(1e6)
    assert rank["d"] == pytest.approx(0.001)
    assert rank["b"] == pytest.approx(0.020 + 0.002 + 0.001)
    assert rank["c"] == pytest.approx(0.005 + 0.0 + 0.001)
    assert rank["a"] == pytest.approx(0.010 + 0.001 + 0.023)
    assert wf.upward_rank(1e6) is rank  # cached per bandwidth
    assert wf.upward_rank(1e9)["a"] == pytest.approx(0.034 - 0.001 - 0.002 + 3e-6)


def test_check_models() -> None:
    wf = Workflow("w", [task("a", model="big"), task("b", "a")])
    wf.check_models({"big": 10}, capacity_bytes=10)
    wf.check_models({"big": 10}, capacity_bytes=None)
    with pytest.raises(WorkflowError, match="unknown model 'big'"):
        wf.check_models({"small": 1}, capacity_bytes=None)
    with pytest.raises(ModelTooLarge, match="'big'"):
        wf.check_models({"big": 11}, capacity_bytes=10)


def test_check_inputs_names_missing_and_unexpected() -> None:
    wf = Workflow("w", [task("a")], inputs=("image", "question"))
    wf.check_inputs({"image": 1, "question": 2})
    with pytest.raises(InvalidInputs) as info:
        wf.check_inputs({"image": 1, "extra": 3})
    text = str(info.value)
    assert "missing 'question'" in text
    assert "unexpected 'extra'" in text
    assert info.value.detail == {"missing": ["question"], "unexpected": ["extra"]}
    # no declared inputs: anything goes
    Workflow("w", [task("a")]).check_inputs({"whatever": 1})


def test_an_emulated_run_takes_its_longest_member_times_the_lead_s_batch_curve() -> None:
    from compass.workflow.dag import emulated_run_s

    lead = TaskProfile(exec_ms=80.0, output_bytes=1, batch_scale=(1.0, 1.5, 1.8))
    longer = TaskProfile(exec_ms=100.0, output_bytes=1)
    assert emulated_run_s(lead, [lead]) == pytest.approx(0.080)  # alone: its own time
    assert emulated_run_s(lead, [lead, longer, lead]) == pytest.approx(0.100 * 1.8)
    plain = TaskProfile(exec_ms=50.0, output_bytes=1)  # no curve: its runs one after another
    assert emulated_run_s(plain, [plain, plain]) == pytest.approx(0.100)
