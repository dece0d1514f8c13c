"""The worker core runs a nested loop (compass.core.unfold, compass.workflow.unfold): real task
functions stop the inner loop and the outer one on their own outputs; the skip rule ends the
iterations that will not come, level by level, across several cores."""

from __future__ import annotations

from typing import Any

from compass.workflow import Task, TaskProfile
from compass.workflow.choices import stop
from compass.workflow.unfold import Loop, unfold_workflow

from .test_unfold_core import Cluster, spread

INNER, OUTER = 4, 3


def _plan(module: Any, x: Any = None, carry: Any = None) -> Any:
    """The outer loop's entry: counts its iterations, keeps the log of the inner stops."""
    if carry is None:
        return {"outer": 0, "inner": 0, "log": ()}
    return {"outer": carry["outer"] + 1, "inner": 0, "log": carry["log"]}


def _draft(module: Any, plan: Any = None, carry: Any = None) -> Any:
    """The inner loop's entry: from the plan at first, then from the previous check."""
    state = plan if carry is None else carry
    return {**state, "inner": state["inner"] + 1}


def _check(module: Any, draft: Any, plan: Any) -> Any:
    """Stops the inner loop at its third iteration in outer iteration 1, else at its first;
    also reads its outer iteration's plan (an input from outside the inner loop)."""
    assert plan["outer"] == draft["outer"]
    if draft["inner"] == (3 if draft["outer"] == 1 else 1):
        return stop({**draft, "log": (*draft["log"], f"{draft['outer']}:{draft['inner']}")})
    return draft  # goes on


def _judge(module: Any, check: Any) -> Any:
    return stop(check) if check["outer"] == 1 else check


def _t(name: str, fn: Any, *after: str) -> Task:
    return Task(name, "m", after, TaskProfile(exec_ms=10, output_bytes=100), fn=fn)


NESTED = unfold_workflow(
    "nested",
    [
        _t("plan", _plan),
        _t("draft", _draft, "plan"),
        _t("check", _check, "draft", "plan"),
        _t("judge", _judge, "check"),
        _t("answer", lambda m, judge: judge["log"], "judge"),
    ],
    loops=[
        Loop(("plan", "draft", "check", "judge"), "judge", OUTER),
        Loop(("draft", "check"), "check", INNER),
    ],
)


def test_a_nested_loop_stops_its_inner_loop_at_iteration_2_of_outer_iteration_1() -> None:
    cluster = Cluster(workflows={"nested": NESTED})
    spread(cluster)
    answer = cluster.submit("n-1", "nested", x=0)
    assert answer.error is None and answer.value == ("0:1", "1:3")
    ran = cluster.tasks_run("n-1")
    assert ran == [
        "plan@0", "draft@0.0", "check@0.0", "judge@0",
        "plan@1", "draft@1.0", "check@1.0", "draft@1.1", "check@1.1", "draft@1.2", "check@1.2",
        "judge@1", "answer",
    ]  # fmt: skip
    # the rest was skipped, not run on a skip mark (check@1.3 heard plan@1, which ran), and
    # the ingress knows so: its record lists every unrolled task that did not run
    assert answer.record["skipped"] == [t for t in NESTED.order if t not in ran]
    assert answer.record["choices"]["check@1.2"] == "stop"
    assert answer.record["choices"]["check@1.1"] == "again"
    assert answer.record["choices"]["judge@1"] == "stop"
    # the tasks of the cores are all done: nothing waits for inputs that will never come
    for core in cluster.cores.values():
        assert len(core.inbox) == 0


def test_the_same_job_on_one_core_runs_the_same_tasks() -> None:
    one = Cluster(("a",), workflows={"nested": NESTED})
    answer = one.submit("n-1", "nested", x=0)
    assert answer.value == ("0:1", "1:3") and len(one.tasks_run("n-1")) == 13


def test_the_job_s_record_counts_inner_iterations_per_outer_iteration() -> None:
    cluster = Cluster(("a",), workflows={"nested": NESTED})
    record = cluster.submit("n-1", "nested", x=0).record
    assert record["taken"] == "check: 1, 3 iterations; judge: 2 iterations"
