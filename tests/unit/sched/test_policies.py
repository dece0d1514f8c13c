"""Every policy behind one interface: full, valid plans; the baselines' own behaviour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compass.errors import ConfigError, WorkerUnavailable
from compass.sched import POLICY_NAMES, JobInfo, ViewSnapshot, WorkerState, make_policy
from compass.sched.policies import worker_seed
from compass.workflow import Profiles, Task, TaskProfile, Workflow, load_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
WORKLOAD = load_workload(PAPER)
GB = 1_000_000_000


def cluster(n: int, seed: int = 0) -> ViewSnapshot:
    rng = np.random.default_rng(seed)
    models = sorted(WORKLOAD.models)
    states = []
    for i in range(n):
        held: set[str] = set()
        used = 0
        for m in rng.permutation(models):
            if used + WORKLOAD.models[m] <= 14 * GB:
                held.add(str(m))
                used += WORKLOAD.models[m]
        wait = float(rng.uniform(0.0, 2.0))
        states.append(WorkerState(f"w{i}", wait, frozenset(held), 14 * GB - used, 14 * GB))
    return ViewSnapshot.build(states)


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("n_workers", [1, 2, 5])
def test_every_policy_plans_every_paper_workflow(name: str, n_workers: int) -> None:
    view = cluster(n_workers)
    profiles = Profiles.from_workload(WORKLOAD)
    policy = make_policy(name)
    assert policy.name == name
    for k, wf in enumerate(WORKLOAD.workflows.values()):
        for ingress in (view.names[0], view.names[-1]):
            info = JobInfo(f"job-{k}-{ingress}", wf, ingress, 0)
            plan = policy.plan(info, view, profiles, 100.0)
            assert set(plan) == set(wf.order)
            assert set(plan.values()) <= set(view.names)
            for task in wf.order:
                if wf.preds(task):
                    moved = policy.adjust(info, task, plan, view, profiles, 100.5)
                    assert moved in view.names
                    assert not (wf.is_join(task) and moved != plan[task])


def test_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown policy 'fifo'.*compass.*jsq"):
        make_policy("fifo")
    with pytest.raises(ConfigError, match="adjust_threshold"):
        make_policy("compass", adjust_threshold=0)


def test_dynamic_flags() -> None:
    dynamic = {n for n in POLICY_NAMES if make_policy(n).dynamic}
    assert dynamic == {"compass", "compass_nocache", "compass_noload", "central", "jsq"}


def test_an_empty_view_is_a_clear_error() -> None:
    empty = ViewSnapshot.build([])
    wf = WORKLOAD.workflows["question_answer"]
    for name in POLICY_NAMES:
        with pytest.raises(WorkerUnavailable, match="no workers"):
            make_policy(name).plan(
                JobInfo("j", wf, "a", 0), empty, Profiles.from_workload(WORKLOAD), 0.0
            )


def test_hash_is_stable_and_spreads() -> None:
    view = cluster(5)
    profiles = Profiles.from_workload(WORKLOAD)
    wf = WORKLOAD.workflows["translation"]
    plans = [
        make_policy("hash").plan(JobInfo(f"j{k}", wf, "w0", 0), view, profiles, 0.0)
        for k in range(50)
    ]
    again = [
        make_policy("hash").plan(JobInfo(f"j{k}", wf, "w0", 0), view, profiles, 9.0)
        for k in range(50)
    ]
    assert plans == again
    assert len({p["generate"] for p in plans}) == 5


def test_round_robin_deals_in_name_order() -> None:
    view = cluster(3)
    profiles = Profiles.from_workload(WORKLOAD)
    policy = make_policy("round_robin")
    qa = WORKLOAD.workflows["question_answer"]
    first = policy.plan(JobInfo("j1", qa, "w0", 0), view, profiles, 0.0)
    second = policy.plan(JobInfo("j2", qa, "w0", 0), view, profiles, 0.0)
    assert [first["generate"], first["nli"], second["generate"], second["nli"]] == [
        "w0",
        "w1",
        "w2",
        "w0",
    ]


def test_random_is_reproducible_per_seed() -> None:
    view = cluster(5)
    profiles = Profiles.from_workload(WORKLOAD)
    wf = WORKLOAD.workflows["translation"]

    def plans(seed: int) -> list[dict[str, str]]:
        policy = make_policy("random", seed=seed)
        return [policy.plan(JobInfo(f"j{k}", wf, "w0", 0), view, profiles, 0.0) for k in range(20)]

    assert plans(1) == plans(1)
    assert plans(1) != plans(2)


def test_jsq_moves_roots_and_non_joins_to_the_shortest_queue() -> None:
    m = "m"
    wf = Workflow(
        "fan",
        [
            Task("r", m, (), TaskProfile(10.0, 10)),
            Task("x", m, ("r",), TaskProfile(10.0, 10)),
            Task("y", m, ("r",), TaskProfile(10.0, 10)),
            Task("j", None, ("x", "y"), TaskProfile(1.0, 10)),
        ],
    )
    profiles = Profiles(
        h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, model_sizes={m: GB}, workflows=[wf]
    )
    states = [WorkerState(f"w{i}", w, frozenset(), GB, 2 * GB) for i, w in enumerate([3, 2, 1, 4])]
    view = ViewSnapshot.build(states)
    policy = make_policy("jsq")
    info = JobInfo("job", wf, "w0", 0)
    plan = policy.plan(info, view, profiles, 0.0)
    assert plan["r"] == "w2"
    assert policy.adjust(info, "x", plan, view, profiles, 0.0) == "w2"
    assert policy.adjust(info, "j", plan, view, profiles, 0.0) == plan["j"]
    # HEFT ignores the queues entirely
    assert make_policy("heft").plan(info, view, profiles, 0.0)["r"] == "w0"


def test_every_worker_draws_its_own_random_sequence() -> None:
    assert worker_seed(0, "w0") == worker_seed(0, "w0")  # reproducible
    assert len({worker_seed(s, w) for s in (0, 1) for w in ("w0", "w1", "w2")}) == 6
    wf = WORKLOAD.workflows["translation"]
    view = cluster(5)
    profiles = Profiles.from_workload(WORKLOAD)
    plans = [
        [
            make_policy("random", seed=worker_seed(0, w)).plan(
                JobInfo(f"j{k}", wf, w, 0), view, profiles, 0.0
            )
            for k in range(3)
        ]
        for w in ("w0", "w1")
    ]
    assert plans[0] != plans[1]
