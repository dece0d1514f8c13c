"""The Compass planner and its adjustment, on crafted views."""

from __future__ import annotations

import pytest

from compass.errors import ModelTooLarge
from compass.sched import (
    DEFAULT_ADJUST_THRESHOLD,
    ClusterView,
    CompassPolicy,
    Heartbeat,
    JobInfo,
    ViewSnapshot,
    adjust_successors,
    make_policy,
    record_plan,
)
from compass.sched.heartbeat import DEGRADED_WAIT_S
from compass.sched.policy import LARGE_CLUSTER
from compass.workflow import Profiles, Task, TaskProfile, Workflow

GB = 1_000_000_000
MB = 1_000_000


def t(
    name: str,
    *after: str,
    model: str | None = "m",
    ms: float = 100.0,
    out: int = 1000,
    inp: int = 0,
) -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=ms, output_bytes=out, input_bytes=inp))


def worker(
    name: str,
    wait: float = 0.0,
    models: tuple[str, ...] = (),
    free: int = 10 * GB,
    capacity: int = 10 * GB,
) -> Heartbeat:
    return Heartbeat(name, wait, frozenset(models), free, capacity)


def profiles(*wfs: Workflow, net: float = 1e9, h2d: float = 1e9, **sizes: int) -> Profiles:
    models = {"m": 1 * GB} | sizes
    return Profiles(
        h2d_bytes_per_s=h2d,
        net_bytes_per_s=net,
        net_fixed_s=1e-4,
        model_sizes=models,
        workflows=wfs,
        staged=False,
    )


def job(wf: Workflow, ingress: str = "a", input_bytes: int = 0, job_id: str = "j1") -> JobInfo:
    return JobInfo(job_id, wf, ingress, input_bytes)


ONE = Workflow("one", [t("x", inp=1000)])


def test_prefers_the_worker_holding_the_model() -> None:
    view = ViewSnapshot.build([worker("a"), worker("b", models=("m",)), worker("c")])
    p = profiles(ONE)
    assert make_policy("compass").plan(job(ONE), view, p, 0.0) == {"x": "b"}
    # blind to the cache, the tie goes to the ingress
    assert make_policy("compass_nocache").plan(job(ONE), view, p, 0.0) == {"x": "a"}


def test_stays_at_the_ingress_holding_a_large_input_on_a_slow_network() -> None:
    view = ViewSnapshot.build([worker("a", wait=0.5, models=("m",)), worker("b", models=("m",))])
    slow = profiles(ONE, net=1 * MB)  # 3 MB take 3 s
    fast = profiles(ONE, net=10 * GB)
    policy = make_policy("compass")
    assert policy.plan(job(ONE, input_bytes=3 * MB), view, slow, 0.0) == {"x": "a"}
    assert policy.plan(job(ONE, input_bytes=3 * MB), view, fast, 0.0) == {"x": "b"}


def test_shorter_queue_when_the_model_is_everywhere() -> None:
    view = ViewSnapshot.build(
        [worker("a", 0.5, ("m",)), worker("b", 0.1, ("m",)), worker("c", 0.3, ("m",))]
    )
    p = profiles(ONE)
    assert make_policy("compass").plan(job(ONE), view, p, 10.0) == {"x": "b"}
    # without the load term every worker looks idle: the ingress wins the tie
    assert make_policy("compass_noload").plan(job(ONE), view, p, 10.0) == {"x": "a"}


DIAMOND = Workflow(
    "diamond",
    [
        t("r", model=None, ms=1.0, out=20 * MB),
        t("x", "r", model="mx", out=10 * MB),
        t("y", "r", model="my", out=1 * MB),
        t("j", "x", "y", model=None, ms=1.0),
    ],
)


def test_join_goes_where_its_larger_input_is() -> None:
    # x can only run cheaply on b, y on c; the join follows the 10 MB output, not the 1 MB one
    view = ViewSnapshot.build(
        [worker("a"), worker("b", models=("mx",)), worker("c", models=("my",))]
    )
    p = profiles(DIAMOND, net=100 * MB, mx=5 * GB, my=5 * GB)
    plan = make_policy("compass").plan(job(DIAMOND), view, p, 0.0)
    assert plan["x"] == "b"
    assert plan["y"] == "c"
    assert plan["j"] == "b"


def test_keeps_a_join_and_its_inputs_together_when_transfer_is_expensive() -> None:
    view = ViewSnapshot.build([worker("a", models=("mx", "my")), worker("b", models=("mx", "my"))])
    slow = profiles(DIAMOND, net=10 * MB, mx=GB, my=GB)
    plan = make_policy("compass").plan(job(DIAMOND), view, slow, 0.0)
    assert set(plan.values()) == {"a"}
    # with a fast network the two branches run in parallel on two workers
    fast = profiles(DIAMOND, net=1000 * GB, mx=GB, my=GB)
    plan = make_policy("compass").plan(job(DIAMOND), view, fast, 0.0)
    assert plan["x"] != plan["y"]


def test_spreads_jobs_planned_back_to_back_between_heartbeats() -> None:
    wf = Workflow("q", [t("x")])
    p = profiles(wf)
    names = ("a", "b", "c", "d")

    def run(record: bool) -> list[str]:
        view = ClusterView("a")
        view.update_self(worker("a", models=("m",)))
        for name in names[1:]:
            view.apply_heartbeat(worker(name, models=("m",)), now=0.0)
        policy = make_policy("compass")
        chosen = []
        for k in range(4):
            info = job(wf, job_id=f"j{k}")
            plan = policy.plan(info, view.snapshot(0.001), p, 0.001)
            if record:
                record_plan(view, info, plan, p, 0.001)
            chosen.append(plan["x"])
        return chosen

    assert sorted(run(record=True)) == list(names)
    assert run(record=False) == ["a"] * 4  # what herding looks like


def test_eviction_penalty_and_models_brought_by_earlier_tasks() -> None:
    wf = Workflow(
        "fan",
        [t("r", model=None, ms=0.0, out=0), t("x", "r", ms=100), t("y", "r", ms=100)],
    )
    p = profiles(wf)  # fetching m takes 1 s; 2 s when the cache must evict first
    view = ViewSnapshot.build([worker("a"), worker("b", free=GB // 2)])
    plan = make_policy("compass").plan(job(wf), view, p, 0.0)
    # x brings m to a; y then finds it there (1.1 s + 0.1) rather than evicting on b (2.1 s)
    assert plan == {"r": "a", "x": "a", "y": "a"}
    # where b has room, y runs there in parallel (1 s fetch + 0.1) instead of queueing
    view = ViewSnapshot.build([worker("a"), worker("b")])
    plan = make_policy("compass").plan(job(wf), view, p, 0.0)
    assert {plan["x"], plan["y"]} == {"a", "b"}


def test_never_places_a_model_where_it_cannot_fit() -> None:
    p = profiles(ONE)
    view = ViewSnapshot.build(
        [worker("a", models=(), free=GB // 2, capacity=GB // 2), worker("b", wait=30.0)]
    )
    assert make_policy("compass").plan(job(ONE), view, p, 0.0) == {"x": "b"}
    tiny = ViewSnapshot.build([worker("a", free=10, capacity=10)])
    with pytest.raises(ModelTooLarge, match="'m'"):
        make_policy("compass").plan(job(ONE), tiny, p, 0.0)


def test_measured_slow_worker_is_avoided() -> None:
    view = ViewSnapshot.build([worker("a", models=("m",)), worker("b", models=("m",))])
    p = profiles(ONE)
    policy = make_policy("compass")
    assert policy.plan(job(ONE), view, p, 0.0) == {"x": "a"}
    for _ in range(5):
        p.observe_exec("one", "x", "a", 1.0)  # a turns out ten times slower than b
        p.observe_exec("one", "x", "b", 0.1)
    assert p.exec_s("one", "x", "a") > 2 * p.exec_s("one", "x", "b")
    assert policy.plan(job(ONE), view, p, 0.0) == {"x": "b"}


CHAIN = Workflow("chain", [t("x", ms=100), t("y", "x", ms=100), t("z", "x", "y", ms=100)])


def test_adjust_keeps_a_join_even_on_an_overloaded_worker() -> None:
    view = ViewSnapshot.build([worker("a", 50.0, ("m",)), worker("b", 0.0, ("m",))])
    plan = {"x": "a", "y": "a", "z": "a"}
    policy = make_policy("compass")
    assert policy.adjust(job(CHAIN), "z", plan, view, profiles(CHAIN), 0.0) == "a"


def test_adjust_keeps_the_plan_under_the_threshold() -> None:
    plan = {"x": "b", "y": "a", "z": "a"}
    p = profiles(CHAIN)
    paper = make_policy("compass", adjust_threshold=1.5)  # the paper's rule: 1.5 x 0.1 s
    at_limit = ViewSnapshot.build([worker("a", 0.15, ("m",)), worker("b", 0.0, ("m",))])
    assert paper.adjust(job(CHAIN), "y", plan, at_limit, p, 0.0) == "a"
    over = ViewSnapshot.build([worker("a", 0.16, ("m",)), worker("b", 0.0, ("m",))])
    assert paper.adjust(job(CHAIN), "y", plan, over, p, 0.0) == "b"
    assert (
        make_policy("compass", adjust_threshold=2.0).adjust(job(CHAIN), "y", plan, over, p, 0.0)
        == "a"
    )
    # compass's default keeps the plan only while the wait is within a tenth of the task
    assert DEFAULT_ADJUST_THRESHOLD == 0.1
    within = ViewSnapshot.build([worker("a", 0.01, ("m",)), worker("b", 0.0, ("m",))])
    assert make_policy("compass").adjust(job(CHAIN), "y", plan, within, p, 0.0) == "a"
    beyond = ViewSnapshot.build([worker("a", 0.025, ("m",)), worker("b", 0.0, ("m",))])
    assert make_policy("compass").adjust(job(CHAIN), "y", plan, beyond, p, 0.0) == "b"


def test_adjust_moves_an_overloaded_task_to_the_smallest_wait_plus_fetch() -> None:
    plan = {"x": "a", "y": "a", "z": "a"}
    p = profiles(CHAIN)  # fetching m costs 1 s
    view = ViewSnapshot.build(
        [worker("a", 5.0, ("m",)), worker("b", 0.0), worker("c", 0.6, ("m",)), worker("d", 0.9)]
    )
    assert make_policy("compass").adjust(job(CHAIN), "y", plan, view, p, 0.0) == "c"
    # the ablations: no adjustment, or no load information, keep the plan
    assert make_policy("compass_noadjust").adjust(job(CHAIN), "y", plan, view, p, 0.0) == "a"
    assert make_policy("compass_noload").adjust(job(CHAIN), "y", plan, view, p, 0.0) == "a"
    # without the cache term the idle worker looks best
    assert make_policy("compass_nocache").adjust(job(CHAIN), "y", plan, view, p, 0.0) == "b"


def test_adjust_counts_the_output_transfer_from_the_finishing_worker() -> None:
    wf = Workflow("big", [t("x", out=50 * MB), t("y", "x")])
    plan = {"x": "a", "y": "c"}
    view = ViewSnapshot.build(
        [worker("a", 0.35, ("m",)), worker("b", 0.0, ("m",)), worker("c", 9.0, ("m",))]
    )
    slow = profiles(wf, net=100 * MB)  # moving the output costs 0.5 s
    assert make_policy("compass").adjust(job(wf), "y", plan, view, slow, 0.0) == "a"
    fast = profiles(wf, net=100 * GB)
    assert make_policy("compass").adjust(job(wf), "y", plan, view, fast, 0.0) == "b"


def test_adjust_replaces_a_worker_that_left_but_never_moves_a_join() -> None:
    """A task planned on a worker out of the view (it left, or drains) moves; a join stays
    where it was planned: each of its predecessors' workers adjusts it on its own, and moving
    it there split its inputs between two workers, each waiting for the other half (a drain
    held such jobs for its whole timeout). Where the worker is really gone, its jobs are
    planned again by their ingress."""
    plan = {"x": "a", "y": "gone", "z": "gone"}
    view = ViewSnapshot.build([worker("a", 0.0, ("m",)), worker("b", 0.0, ("m",))])
    p = profiles(CHAIN)
    for name in ("compass", "compass_noadjust", "heft", "compass_noload"):
        assert make_policy(name).adjust(job(CHAIN), "y", plan, view, p, 0.0) == "a"
        assert make_policy(name).adjust(job(CHAIN), "z", plan, view, p, 0.0) == "gone"


def test_central_plans_at_the_lowest_name() -> None:
    view = ViewSnapshot.build([worker("c"), worker("b")])
    central = make_policy("central")
    assert central.planner(view) == "b"
    assert isinstance(central, CompassPolicy)
    assert central.plan(job(ONE, ingress="b"), view, profiles(ONE), 0.0) == {"x": "b"}
    assert make_policy("compass").planner(view) is None


# a fan-out: r on its own, three branches of different lengths, a join with no model
FAN = Workflow(
    "fan",
    [
        t("r", model=None, ms=1.0),
        t("short", "r", ms=100),
        t("mid", "r", ms=200),
        t("long", "r", ms=300),
        t("join", "short", "mid", "long", model=None, ms=1.0),
    ],
)


def fan_view() -> ViewSnapshot:
    # r finished on a, which is busy for 5 s; b, c, d are idle and hold m
    return ViewSnapshot.build(
        [
            worker("a", 5.0, ("m",)),
            worker("b", 0.0, ("m",)),
            worker("c", 0.0, ("m",)),
            worker("d", 0.0, ("m",)),
        ]
    )


def test_siblings_are_spread_instead_of_piling_onto_one_idle_worker() -> None:
    policy = make_policy("compass")
    p = profiles(FAN)
    plan = dict.fromkeys(FAN.order, "a")
    view = fan_view()
    # each sibling alone, on the same snapshot, picks the same idle worker: the herd
    alone = {s: policy.adjust(job(FAN), s, plan, view, p, 0.0) for s in ("short", "mid", "long")}
    assert set(alone.values()) == {"b"}
    new = adjust_successors(policy, job(FAN), "r", plan, view, p, 0.0)
    assert {new["short"], new["mid"], new["long"]} == {"b", "c", "d"}
    assert new["long"] == "b"  # the longest branch (highest rank) chooses first
    assert new["r"] == "a"
    assert plan == dict.fromkeys(FAN.order, "a")  # the caller's plan is not modified


def test_a_join_fed_only_by_the_siblings_follows_its_last_input() -> None:
    policy = make_policy("compass")
    new = adjust_successors(
        policy, job(FAN), "r", dict.fromkeys(FAN.order, "a"), fan_view(), profiles(FAN), 0.0
    )
    # 'long' finishes last; its worker's lane frees just as the join's last input is there
    assert new["join"] == new["long"] != "a"


def test_the_paper_policies_and_ablations_keep_joins_where_they_were() -> None:
    plan = dict.fromkeys(FAN.order, "a")
    for name in ("jsq", "compass_noadjust", "compass_noload", "hash", "heft"):
        new = adjust_successors(
            make_policy(name), job(FAN), "r", plan, fan_view(), profiles(FAN), 0.0
        )
        assert new["join"] == "a", name
    # jsq moves every non-join to a short queue, now one per sibling
    new = adjust_successors(make_policy("jsq"), job(FAN), "r", plan, fan_view(), profiles(FAN), 0.0)
    assert {new["short"], new["mid"], new["long"]} == {"b", "c", "d"}
    # the static policies change nothing
    for name in ("hash", "heft", "compass_noadjust"):
        assert (
            adjust_successors(
                make_policy(name), job(FAN), "r", plan, fan_view(), profiles(FAN), 0.0
            )
            == plan
        )


def test_a_join_with_an_input_from_elsewhere_is_not_moved() -> None:
    # 'other' feeds 'mid' too: mid may already hold an input sent with the old plan
    wf = Workflow(
        "mixed",
        [
            t("r", model=None, ms=1.0),
            t("other", model=None, ms=1.0),
            t("short", "r", ms=100),
            t("mid", "r", "other", ms=200),
            t("join", "short", "mid", model=None, ms=1.0),
        ],
    )
    plan = dict.fromkeys(wf.order, "a")
    new = adjust_successors(
        make_policy("compass"), job(wf), "r", plan, fan_view(), profiles(wf), 0.0
    )
    assert new["join"] == "a"
    assert new["short"] != "a"  # the non-join successor still moves off the busy worker


# -- host lanes: model-less tasks off the GPU queue ------------------------------------------

HOSTED = Workflow(
    "hosted",
    [
        t("decode", model=None, ms=50.0, inp=10 * MB, out=10 * MB),
        t("infer", "decode", ms=100.0, out=1000),
        t("post", "infer", model=None, ms=50.0),
    ],
)


def test_with_host_lanes_a_model_less_task_ignores_the_gpu_queue() -> None:
    # the ingress a holds the 10 MB input but its GPU is busy for 2 s; b is idle and holds m
    view = ViewSnapshot.build([worker("a", 2.0), worker("b", 0.0, ("m",))])
    p = profiles(HOSTED, net=100 * MB)  # moving 10 MB costs 0.1 s
    shared = make_policy("compass").plan(job(HOSTED, input_bytes=10 * MB), view, p, 0.0)
    hosted = make_policy("compass", host_lanes=True).plan(
        job(HOSTED, input_bytes=10 * MB), view, p, 0.0
    )
    # on GPU lanes, decoding at a would wait 2 s behind its queue: move the input to b
    assert shared == {"decode": "b", "infer": "b", "post": "b"}
    # on host lanes a decodes at once; only the inference moves to the idle GPU, and the
    # post-processing runs where the inference ran without waiting for b's lane
    assert hosted == {"decode": "a", "infer": "b", "post": "b"}


def test_with_host_lanes_a_degraded_worker_gets_no_model_less_task_either() -> None:
    """A degraded worker (too many stuck threads) starts no task on any lane: its reported
    wait keeps host-lane tasks off it as well, though they ignore GPU queues otherwise."""
    view = ViewSnapshot.build(
        [worker("a", 2.0 + DEGRADED_WAIT_S), worker("b", 0.0, ("m",)), worker("c", 0.0)]
    )
    p = profiles(HOSTED, net=100 * MB)
    hosted = make_policy("compass", host_lanes=True)
    plan = hosted.plan(job(HOSTED, input_bytes=10 * MB), view, p, 0.0)
    assert "a" not in plan.values()  # the input at a moves rather than wait for ever
    healthy = ViewSnapshot.build([worker("a", 2.0), worker("b", 0.0, ("m",)), worker("c", 0.0)])
    assert hosted.plan(job(HOSTED, input_bytes=10 * MB), healthy, p, 0.0)["decode"] == "a"


def test_with_host_lanes_a_model_less_task_is_not_counted_in_the_wait() -> None:
    view = ClusterView("a", heartbeat_s=1.0)
    view.update_self(worker("a"))
    view.apply_heartbeat(worker("b"), 0.0)
    p = profiles(HOSTED)
    plan = {"decode": "b", "infer": "b", "post": "b"}
    record_plan(view, job(HOSTED), plan, p, 0.0, host_lanes=True)
    assert view.snapshot(0.0).wait_s[1] == pytest.approx(0.1)  # infer only
    record_plan(view, job(HOSTED, job_id="j2"), plan, p, 0.0)
    assert view.snapshot(0.0).wait_s[1] == pytest.approx(0.1 + 0.2)  # all three


def test_with_host_lanes_adjust_leaves_a_model_less_task_where_it_was_planned() -> None:
    view = ViewSnapshot.build([worker("a", 5.0, ("m",)), worker("b", 0.0, ("m",))])
    p = profiles(HOSTED)
    plan = {"decode": "a", "infer": "a", "post": "a"}
    shared = make_policy("compass")
    hosted = make_policy("compass", host_lanes=True)
    assert shared.adjust(job(HOSTED), "post", plan, view, p, 0.0) == "b"
    assert hosted.adjust(job(HOSTED), "post", plan, view, p, 0.0) == "a"
    # a task with a model still escapes a's 5 s queue
    assert hosted.adjust(job(HOSTED), "infer", plan, view, p, 0.0) == "b"


def test_without_sibling_counting_every_successor_is_placed_on_one_snapshot() -> None:
    plan = dict.fromkeys(FAN.order, "a")
    policy = make_policy("compass", options={"counts_siblings": False})
    new = adjust_successors(policy, job(FAN), "r", plan, fan_view(), profiles(FAN), 0.0)
    # the paper's rule: each sibling sees the same idle worker, so all three pile onto it
    assert {new["short"], new["mid"], new["long"]} == {"b"}
    counted = adjust_successors(
        make_policy("compass"), job(FAN), "r", plan, fan_view(), profiles(FAN), 0.0
    )
    assert {counted["short"], counted["mid"], counted["long"]} == {"b", "c", "d"}


def test_without_moving_joins_a_join_stays_where_it_was_planned() -> None:
    plan = dict.fromkeys(FAN.order, "a")
    policy = make_policy("compass", options={"moves_joins": False})
    assert policy.joins_fed_by(FAN, "r") == ()
    new = adjust_successors(policy, job(FAN), "r", plan, fan_view(), profiles(FAN), 0.0)
    assert new["join"] == "a"
    # the siblings still spread: only the join rule changed
    assert {new["short"], new["mid"], new["long"]} == {"b", "c", "d"}
    assert make_policy("compass").joins_fed_by(FAN, "r") == ("join",)


@pytest.mark.parametrize(
    ("size", "holders", "ingress", "chosen"),
    [
        (10, (1, 3, 5), 4, 1),  # a small cluster: the lowest index among the ties
        (LARGE_CLUSTER, (10, 20, 30), 25, 30),  # a large one: the first from the ingress on
        (LARGE_CLUSTER, (10, 20, 30), 31, 10),  # ... wrapping around
    ],
)
def test_ties_go_to_the_lowest_index_or_in_a_large_cluster_from_the_ingress_on(
    size: int, holders: tuple[int, ...], ingress: int, chosen: int
) -> None:
    wf = Workflow("one", [t("x", ms=100)])
    names = [f"w{i:03d}" for i in range(size)]
    view = ViewSnapshot.build(
        worker(n, models=("m",) if i in holders else ()) for i, n in enumerate(names)
    )
    plan = CompassPolicy("compass").plan(job(wf, ingress=names[ingress]), view, profiles(wf), 0.0)
    assert plan == {"x": names[chosen]}
