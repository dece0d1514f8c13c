"""Random workflows and clusters: every policy still returns a full, valid plan."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from compass._bench.plan import run
from compass.sched import POLICY_NAMES, Heartbeat, JobInfo, ViewSnapshot, make_policy
from compass.sched.cost import WorkflowCosts
from compass.workflow import Profiles, Task, TaskProfile, Workflow

MODELS = {"m0": 300, "m1": 700, "m2": 1000}


@st.composite
def workflows(draw: st.DrawFn) -> Workflow:
    n = draw(st.integers(1, 7))
    tasks = []
    for i in range(n):
        after = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        tasks.append(
            Task(
                f"t{i}",
                draw(st.sampled_from([None, *MODELS])),
                tuple(f"t{j}" for j in sorted(after)),
                TaskProfile(
                    exec_ms=draw(st.floats(0, 50)),
                    output_bytes=draw(st.integers(0, 10**6)),
                    input_bytes=0 if after else draw(st.integers(0, 10**6)),
                ),
            )
        )
    return Workflow("rand", list(reversed(tasks)))


@st.composite
def views(draw: st.DrawFn) -> ViewSnapshot:
    n = draw(st.integers(1, 6))
    states = []
    for i in range(n):
        capacity = draw(st.sampled_from([1000, 1500, 3000]))
        models = draw(st.sets(st.sampled_from(sorted(MODELS))))
        used = min(capacity, sum(MODELS[m] for m in models))
        wait = draw(st.floats(0, 5))
        states.append(Heartbeat(f"w{i}", wait, frozenset(models), capacity - used, capacity))
    return ViewSnapshot.build(states)


@settings(max_examples=60, deadline=None)
@given(wf=workflows(), view=views(), ingress=st.integers(0, 6), now=st.floats(0, 1e6))
def test_random_plans_are_complete_and_valid(
    wf: Workflow, view: ViewSnapshot, ingress: int, now: float
) -> None:
    profiles = Profiles(
        h2d_bytes_per_s=1e4, net_bytes_per_s=1e5, net_fixed_s=1e-4, model_sizes=MODELS
    )
    ingress_name = f"w{ingress}"  # sometimes not in the view: the client came from outside
    info = JobInfo("job", wf, ingress_name, 0)
    costs = WorkflowCosts(wf, profiles, view.names)
    position = {t: k for k, t in enumerate(costs.rank_order)}
    assert all(position[p] < position[t] for t, ps in enumerate(costs.preds) for p in ps)
    for name in POLICY_NAMES:
        policy = make_policy(name)
        plan = policy.plan(info, view, profiles, now)
        assert list(plan) == list(wf.order)
        assert set(plan.values()) <= set(view.names)
        for task in wf.order:
            assert policy.adjust(info, task, plan, view, profiles, now) in view.names


def test_plan_benchmark_runs_and_reports_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "results" / "plan.json"
    result = run(str(out), quick=True)
    assert out.exists()
    assert set(result["plan_us"]) == {"5", "20", "80", "240"}
    for row in result["plan_us"].values():
        assert set(row) == {"translation", "question_answer", "img_to_sound", "object_detection"}
        assert all(value > 0 for value in row.values())
