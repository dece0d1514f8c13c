"""Every policy behind one interface: full, valid plans; the baselines' own behaviour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compass.errors import ConfigError, WorkerUnavailable
from compass.sched import POLICY_NAMES, Heartbeat, JobInfo, ViewSnapshot, make_policy
from compass.sched.policies import hash_worker, worker_seed
from compass.sim import job_arrivals, simulate
from compass.sim.settings import SimSettings
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
        states.append(Heartbeat(f"w{i}", wait, frozenset(held), 14 * GB - used, 14 * GB))
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
    assert dynamic == {
        "compass", "compass_nocache", "compass_noload", "central", "jsq", "jit", "compass-chained"
    }  # fmt: skip


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
    states = [Heartbeat(f"w{i}", w, frozenset(), GB, 2 * GB) for i, w in enumerate([3, 2, 1, 4])]
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


# jit: r -> x with a model; r -> y -> z without, y's output 1 GB; a join of x and z
LOCAL = Workflow(
    "local",
    [
        Task("r", "m", (), TaskProfile(100.0, 10, 10)),
        Task("x", "m2", ("r",), TaskProfile(100.0, 10)),
        Task("y", None, ("r",), TaskProfile(100.0, GB)),
        Task("z", None, ("y",), TaskProfile(100.0, 10)),
        Task("j", None, ("x", "z"), TaskProfile(1.0, 10)),
    ],
)


def local_profiles() -> Profiles:
    # a 1 GB model takes 1 s to fetch; moving 1 GB between GPUs takes 3 s (net, d2h, h2d)
    return Profiles(
        h2d_bytes_per_s=1e9,
        net_bytes_per_s=1e9,
        net_fixed_s=1e-6,
        model_sizes={"m": GB, "m2": GB},
        workflows=[LOCAL],
    )


def local_view(
    waits: list[float], m2_on: set[int], m_on: frozenset[int] = frozenset()
) -> ViewSnapshot:
    return ViewSnapshot.build(
        Heartbeat(
            f"w{i}",
            w,
            frozenset({"m2"} if i in m2_on else set()) | ({"m"} if i in m_on else set()),
            2 * GB,
            4 * GB,
        )
        for i, w in enumerate(waits)
    )


def test_jit_follows_the_model_unless_the_queue_costs_more_than_the_fetch() -> None:
    policy = make_policy("jit")
    profiles = local_profiles()
    info = JobInfo("job", LOCAL, "w0", 0)
    plan = dict.fromkeys(LOCAL.order, "w3")
    plan["r"] = "w0"
    # w1 holds m2 and waits 0.5 s longer than w2: cheaper than w2's 1 s fetch
    view = local_view([3.0, 2.5, 2.0, 4.0], m2_on={1})
    assert policy.adjust(info, "x", plan, view, profiles, 0.0) == "w1"
    assert make_policy("jsq").adjust(info, "x", plan, view, profiles, 0.0) == "w2"
    # 1.5 s longer: more than the fetch, so the shortest queue wins
    view = local_view([3.0, 3.5, 2.0, 4.0], m2_on={1})
    assert policy.adjust(info, "x", plan, view, profiles, 0.0) == "w2"
    # a tie keeps the current worker: w3 holds m2 too and waits as long as w1
    view = local_view([3.0, 2.5, 2.0, 2.5], m2_on={1, 3})
    assert policy.adjust(info, "x", plan, view, profiles, 0.0) == "w3"
    # the 1 GB input stays where it is (3 s to move) though w2's queue is 1 s shorter
    view = local_view([3.0, 2.5, 2.0, 4.0], m2_on={1})
    plan["y"] = "w0"
    assert policy.adjust(info, "z", plan, view, profiles, 0.0) == "w0"
    assert make_policy("jsq").adjust(info, "z", plan, view, profiles, 0.0) == "w2"
    # joins stay where they were planned, whatever the queues
    assert policy.adjust(info, "j", plan, view, profiles, 0.0) == "w3"


def test_jit_never_picks_a_worker_too_small_for_the_model() -> None:
    policy = make_policy("jit")
    profiles = local_profiles()
    states = [
        Heartbeat("w0", 5.0, frozenset(), 2 * GB, 4 * GB),
        Heartbeat("w1", 0.0, frozenset(), GB // 2, GB // 2),
    ]
    view = ViewSnapshot.build(states)
    info = JobInfo("job", LOCAL, "w0", 0)
    plan = dict.fromkeys(LOCAL.order, "w1")
    assert policy.adjust(info, "x", plan, view, profiles, 0.0) == "w0"


def test_jit_hashes_the_plan_as_hash_does_and_places_roots_by_locality() -> None:
    policy = make_policy("jit")
    profiles = local_profiles()
    even = local_view([1.0] * 4, m2_on=set())
    for k in range(20):
        # the ingress outside the view and equal queues: nothing to choose between
        info = JobInfo(f"j{k}", LOCAL, "client", 0)
        assert policy.plan(info, even, profiles, 0.0) == make_policy("hash").plan(
            info, even, profiles, 0.0
        )
    # the root's model on w2: it goes there; every other task keeps its hashed worker
    view = local_view([1.0, 1.0, 1.2, 0.5], m2_on=set(), m_on=frozenset({2}))
    for k in range(20):
        info = JobInfo(f"j{k}", LOCAL, "client", 0)
        plan = policy.plan(info, view, profiles, 0.0)
        hashed = make_policy("hash").plan(info, view, profiles, 0.0)
        assert plan["r"] == "w2"
        assert {t: w for t, w in plan.items() if t != "r"} == {
            t: w for t, w in hashed.items() if t != "r"
        }


def test_jit_only_chooses_workers_in_the_view() -> None:
    policy = make_policy("jit")
    profiles = local_profiles()
    view = local_view([1.0, 1.0, 1.0, 1.0], m2_on=set())
    info = JobInfo("job", LOCAL, "gone", 0)
    plan = dict.fromkeys(LOCAL.order, "gone")
    # the input and the planned worker are both outside the view: the hashed worker in it
    for task in ("x", "y", "z", "j"):
        expected = hash_worker("job", task, view.names)
        assert policy.adjust(info, task, plan, view, profiles, 0.0) == expected
    # a model that only the departed worker held is fetched anew, wherever is cheapest
    view = local_view([2.0, 1.0, 3.0, 4.0], m2_on=set())
    assert policy.adjust(info, "x", plan, view, profiles, 0.0) == "w1"
    assert policy.plan(info, view, profiles, 0.0)["r"] == "w1"


def test_jit_counts_earlier_roots_where_the_next_one_looks() -> None:
    wf = Workflow(
        "two_roots",
        [
            Task("a", "m", (), TaskProfile(1000.0, 10)),
            Task("b", "m", (), TaskProfile(1000.0, 10)),
            Task("j", None, ("a", "b"), TaskProfile(1.0, 10)),
        ],
    )
    profiles = Profiles(
        h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, model_sizes={"m": GB}, workflows=[wf]
    )
    # w0 holds m: a goes there; b then sees w0 busy 1 s longer, and w1 (1 s fetch, 0.5 s
    # shorter queue) is cheaper
    view = ViewSnapshot.build(
        [
            Heartbeat("w0", 0.5, frozenset({"m"}), GB, 4 * GB),
            Heartbeat("w1", 0.0, frozenset(), 2 * GB, 4 * GB),
        ]
    )
    plan = make_policy("jit").plan(JobInfo("job", wf, "client", 0), view, profiles, 0.0)
    assert sorted([plan["a"], plan["b"]]) == ["w0", "w1"]


def test_jit_and_jsq_finish_every_paper_job_in_the_simulator() -> None:
    arrivals = job_arrivals(
        list(WORKLOAD.workflows),
        200,
        process="poisson",
        mean_interval_s=WORKLOAD.arrivals.mean_interval_ms_per_client / 1000.0,
        seed=0,
    )
    results = {
        name: simulate(WORKLOAD, SimSettings(workers=5, policy=name, seed=0), arrivals)
        for name in ("jsq", "jit")
    }
    for result in results.values():
        summary = result.summary()
        assert summary["completed"] == 200
        assert summary["failed"] == 0
    # following the models loads about a tenth of jsq's bytes (seeds 0, 1, 2: 65 GB vs 614 GB)
    assert results["jit"].model_bytes_loaded <= results["jsq"].model_bytes_loaded


def test_compass_options_change_its_settings_and_bad_ones_are_refused() -> None:
    from compass.sched.planner import CompassPolicy

    policy = make_policy("compass", options={"oldest_job_first": True, "adjust_threshold": 1.5})
    assert isinstance(policy, CompassPolicy)
    assert policy.oldest_job_first is True and policy.options.adjust_threshold == 1.5
    assert make_policy("compass").oldest_job_first is False
    with pytest.raises(ConfigError, match="unknown compass option 'colour'"):
        make_policy("compass", options={"colour": "red"})
    with pytest.raises(ConfigError, match="'compass' only"):
        make_policy("jsq", options={"dynamic": False})


def test_hash_places_a_job_alike_whatever_its_ingress_instance() -> None:
    # the real worker's ids carry its random instance, the simulator's do not
    names = ("w0", "w1", "w2", "w3", "w4")
    for n in range(1, 50):
        for task in ("a", "b", "aggregate"):
            simulated = hash_worker(f"w1-{n}", task, names)
            assert hash_worker(f"w1-3fa2c1d0e9b7-{n}", task, names) == simulated
            assert hash_worker(f"w1-a1b2c3d4e5f6-{n}", task, names) == simulated
