"""Where a task of a workflow decided at run time ranks in a queue (compass.sched.unfold,
compass.core.estimates): by the expected best time of a job that reached it (compass), by its
step's best time as a job of its own (compass-chained), or by its workflow's likely path's."""

from __future__ import annotations

from pathlib import Path

import pytest

from compass.core.unfold import rank_basis
from compass.sched import make_policy
from compass.sched.unfold import expected_best_s, step_best_s
from compass.workflow.dag import Task, TaskProfile, Workflow
from compass.workflow.profile import Profiles
from compass.workflow.spec import load_workload
from compass.workflow.unfold import Loop, unfold_workflow

from ..worker.test_unfold_core import Cluster

AGENT_LOOP = Path(__file__).parents[3] / "bench" / "workloads" / "agent-loop.json"


def _agent() -> Workflow:
    """A think model (100 ms) that calls a tool (10 ms) and thinks again: 1-4 thinks."""
    tasks = [
        Task("think", "m", (), TaskProfile(exec_ms=100, output_bytes=100)),
        Task("tool", "m", ("think",), TaskProfile(exec_ms=10, output_bytes=100)),
        Task("answer", None, ("think",), TaskProfile(exec_ms=1, output_bytes=100)),
    ]
    return unfold_workflow("agent", tasks, loops=[Loop(("think", "tool"), "think", max_iter=4)])


def _profiles(*workflows: Workflow) -> Profiles:
    return Profiles(
        h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, net_fixed_s=1e-4,
        model_sizes={"m": 1 << 30}, workflows=workflows, staged=False,
    )  # fmt: skip


def _weights(workflow: Workflow, go_on: float) -> dict[str, tuple[float, ...]]:
    """Each decision task goes on with ``go_on`` and stops otherwise."""
    unfolding = workflow.unfold
    assert unfolding is not None
    weights = {}
    for task, point in unfolding.points.items():
        weights[task] = tuple(
            (1.0 - go_on) if i == point.stop else go_on / (len(point.options) - 1)
            for i in range(len(point.options))
        )
    return weights


def test_a_job_deeper_in_its_loop_is_expected_to_take_longer() -> None:
    wf = _agent()
    profiles = _profiles(wf)
    weights = _weights(wf, 0.5)
    best = expected_best_s(wf, profiles, "w", weights.__getitem__)
    thinks = [best[f"think@{k}"] for k in range(4)]
    assert thinks == sorted(thinks) and thinks[0] < thinks[-1]
    # every job runs the first think: its figure is the mean best time of the jobs drawn,
    # between one think (0.1 s and the answer) and four with three tools
    assert 0.101 < thinks[0] < 0.431
    # the last think is reached only by jobs that ran the three earlier thinks and tools
    assert thinks[-1] >= 4 * 0.1 + 3 * 0.01
    # the same figures every time (fixed draws)
    assert expected_best_s(wf, profiles, "w", weights.__getitem__) == best


def test_the_expected_best_time_follows_the_weights() -> None:
    wf = _agent()
    profiles = _profiles(wf)
    short = expected_best_s(wf, profiles, "w", _weights(wf, 0.1).__getitem__)
    long = expected_best_s(wf, profiles, "w", _weights(wf, 0.9).__getitem__)
    assert short["think@0"] < long["think@0"]


def test_a_chained_step_is_measured_from_a_choice_to_the_next() -> None:
    workload = load_workload(AGENT_LOOP)
    agent = workload.workflows["agent"]
    profiles = Profiles.from_workload(workload)
    step = step_best_s(agent, profiles, "w0")
    assert step["llm@0"] == pytest.approx(0.140)  # the first LLM call is a job of its own
    # a tool call and the LLM call it feeds are one step (the longest tool counts)
    assert step["search@0"] == pytest.approx(0.035 + 0.140)
    assert step["llm@1"] == pytest.approx(0.160 + 0.140)
    assert step["answer"] == pytest.approx(0.001)
    router = workload.workflows["router"]
    step = step_best_s(router, profiles, "w0")
    assert step["route"] == pytest.approx(0.008)
    assert step["expert_c"] == pytest.approx(0.095 + 0.001)


def test_each_policy_ranks_by_its_own_basis() -> None:
    assert rank_basis(make_policy("compass")) == "progress"
    assert rank_basis(make_policy("compass-chained")) == "step"
    assert rank_basis(make_policy("compass", options={"progress_rank": False})) is None
    assert rank_basis(make_policy("jsq")) is None


def test_a_queue_ranks_a_deep_step_of_a_loop_later() -> None:
    """Two tasks whose jobs arrived at once: under compass the one deep in its loop ranks
    later (it is expected to take longer); without progress ranks both rank as their
    workflow's likely path does (static workflows always do: the reference simulations)."""
    ranks: dict[str, dict[str, float]] = {}
    options: dict[str, bool]
    for label, options in (("progress", {}), ("flat", {"progress_rank": False})):
        core = Cluster().cores["a"]
        core.estimates.policy = make_policy("compass", options=options)
        agent = core.workflow("agent")
        for t in ("think@0", "think@3"):
            rank = core.estimates.rank(agent, 1.0, t)
            assert rank is not None
            ranks.setdefault(label, {})[t] = rank
    assert ranks["progress"]["think@0"] < ranks["progress"]["think@3"]
    assert ranks["flat"]["think@0"] == ranks["flat"]["think@3"]
    chained = Cluster(policy="compass-chained").cores["a"]
    agent = chained.workflow("agent")
    slack = chained.estimates.policy.deadline_slack
    assert slack is not None
    # a chained step ranks as a job of its own (10 ms a task): the first think alone, a later
    # one after a tool
    assert chained.estimates.rank(agent, 1.0, "think@0") == pytest.approx(1.0 + slack * 0.01)
    assert chained.estimates.rank(agent, 1.0, "think@3") == pytest.approx(1.0 + slack * 0.02)
