"""The finish-time rule (:func:`compass.sched.cost.finish_row`) and the decisions that rank by it.

Planning, dynamic adjustment and join placement must all choose by the same numbers, in
absolute seconds on the caller's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from compass.sched import (
    POLICY_NAMES,
    CompassPolicy,
    Heartbeat,
    JobInfo,
    Policy,
    ViewSnapshot,
    adjust_successors,
    make_policy,
)
from compass.sched.cost import WorkflowCosts, finish_row
from compass.sched.policy import TIE_S
from compass.workflow import Profiles, Task, TaskProfile, Workflow

GB = 1_000_000_000
MB = 1_000_000
NOW = 100.0

FloatArray = npt.NDArray[np.float64]


def exact(expected: object) -> Any:
    """Equal to within float rounding: far below the planner's 1 ns tie."""
    return pytest.approx(expected, rel=0.0, abs=1e-9)


def t(name: str, *after: str, model: str | None = "m", ms: float = 100.0, out: int = 0) -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=ms, output_bytes=out, input_bytes=0))


def profiles(*wfs: Workflow) -> Profiles:
    # fetching m (1 GB) takes 1 s; 10 MB over the network 0.1 s plus 0.1 ms
    return Profiles(
        h2d_bytes_per_s=1e9,
        net_bytes_per_s=1e8,
        net_fixed_s=1e-4,
        model_sizes={"m": 1 * GB},
        workflows=wfs,
        staged=False,
    )


def crafted_view() -> ViewSnapshot:
    """a: busy 0.5 s, holds m; b: idle, m not resident; c: busy 0.2 s, m not resident and
    too little free cache for it (a fetch there must evict first)."""
    return ViewSnapshot.build(
        [
            Heartbeat("a", 0.5, frozenset({"m"}), 9 * GB, 10 * GB),
            Heartbeat("b", 0.0, frozenset(), 10 * GB, 10 * GB),
            Heartbeat("c", 0.2, frozenset(), GB // 2, 10 * GB),
        ]
    )


# x ran on a and left 10 MB for y
PAIR = Workflow("pair", [t("x", out=10 * MB), t("y", "x")])


def row_of_y(
    view: ViewSnapshot, *, avail: FloatArray | None, have: npt.NDArray[np.bool_] | None
) -> FloatArray:
    costs = WorkflowCosts(PAIR, profiles(PAIR), view.names)
    y = PAIR.index["y"]
    fetch = None
    if have is not None:
        fetch = (have, view.free_bytes, view.capacity_bytes, view.min_capacity_bytes)
    return finish_row(costs, y, [view.index("a")], [NOW], avail, fetch)[0]


def test_finish_row_counts_queue_wait_model_fetch_and_input_transfer() -> None:
    view = crafted_view()
    eft = row_of_y(view, avail=view.wait_s + NOW, have=view.holds("m"))
    # a: its input is there, m is resident; the lane frees at 100.5; runs 0.1 s
    # b: input arrives at 100.1001, fetches m for 1 s, runs 0.1 s
    # c: input arrives at 100.1001 but the lane frees at 100.2; evicting doubles the fetch
    assert eft.tolist() == exact([100.6, 101.2001, 102.3])


def test_finish_row_without_a_queue_or_without_the_cache_term() -> None:
    view = crafted_view()
    # a task on a host lane starts when its input arrives
    off_lane = row_of_y(view, avail=None, have=view.holds("m"))
    assert off_lane.tolist() == exact([100.1, 101.2001, 102.2001])
    # a planner blind to the cache
    blind = row_of_y(view, avail=view.wait_s + NOW, have=None)
    assert blind.tolist() == exact([100.6, 100.2001, 100.3])


def test_finish_row_of_a_root_and_of_a_join() -> None:
    view = crafted_view()
    wf = Workflow("join", [t("r"), t("s"), t("j", "r", "s", model=None, ms=10.0)])
    p = profiles(wf)
    p.observe_output("join", "r", 10 * MB)  # each measurement moves the estimate by alpha
    costs = WorkflowCosts(wf, p, view.names)
    out_r = costs.out_bytes[wf.index["r"]]
    assert out_r == pytest.approx(0.2 * 10 * MB)
    # a root receives the job's 5 MB from the ingress (b)
    root = finish_row(costs, wf.index["r"], [1], [NOW], view.wait_s + NOW, None, 5 * MB)[0]
    assert root.tolist() == exact([100.6, 100.1, 100.3])
    # a join waits for its last input: r's 2 MB from a at 100.0 (0.0201 s away from b and c),
    # s's empty output from c at 101.0 (the fixed 0.1 ms away from a and b)
    join = finish_row(costs, wf.index["j"], [0, 2], [NOW, 101.0], view.wait_s + NOW, None)[0]
    assert join.tolist() == exact([101.0001 + 0.01, 101.0001 + 0.01, 101.0 + 0.01])


def test_a_worker_whose_cache_cannot_hold_the_model_never_finishes() -> None:
    small = ViewSnapshot.build(
        [
            Heartbeat("a", 0.0, frozenset(), GB // 2, GB // 2),
            Heartbeat("b", 3.0, frozenset(), 10 * GB, 10 * GB),
        ]
    )
    eft = row_of_y(small, avail=small.wait_s + NOW, have=small.holds("m"))
    assert eft[0] == np.inf
    assert eft[1] == exact(NOW + 3.0 + 1.0 + 0.1)


# -- decisions rank by it -----------------------------------------------------------------


def job(wf: Workflow, ingress: str = "a") -> JobInfo:
    return JobInfo("j1", wf, ingress, 0)


def test_planning_places_each_task_at_the_smallest_finish() -> None:
    view = crafted_view()
    p = profiles(PAIR)
    plan = make_policy("compass").plan(job(PAIR), view, p, NOW)
    # x: a 100.6, b 101.1, c 102.3 -> a; then y on a after x (100.7), elsewhere later
    assert plan == {"x": "a", "y": "a"}
    # the same plan, with a's lane busy until x's finish, is what finish_row ranks first
    costs = WorkflowCosts(PAIR, p, view.names)
    avail = view.wait_s + NOW
    avail[0] = 100.6
    fetch = (view.holds("m"), view.free_bytes, view.capacity_bytes, view.min_capacity_bytes)
    eft = finish_row(costs, PAIR.index["y"], [0], [100.6], avail, fetch)[0]
    assert int(eft.argmin()) == view.index(plan["y"])
    assert eft[0] == exact(100.7)


def test_adjustment_moves_a_task_to_the_worker_the_rule_ranks_first() -> None:
    view = crafted_view()
    p = profiles(PAIR)
    policy = make_policy("compass")
    plan = {"x": "a", "y": "a"}  # a is busy 0.5 s, more than 0.25 x y's 0.1 s: y moves
    finish = policy.finish_times(job(PAIR), "y", plan, view, p, NOW)
    assert finish.tolist() == exact([100.6, 101.2001, 102.3])
    assert policy.adjust(job(PAIR), "y", plan, view, p, NOW) == "a"  # staying is fastest
    # once b holds m, b is first
    warm = ViewSnapshot.build(
        [
            Heartbeat("a", 0.5, frozenset({"m"}), 9 * GB, 10 * GB),
            Heartbeat("b", 0.0, frozenset({"m"}), 9 * GB, 10 * GB),
            Heartbeat("c", 0.2, frozenset(), GB // 2, 10 * GB),
        ]
    )
    finish = policy.finish_times(job(PAIR), "y", plan, warm, p, NOW)
    assert finish.tolist() == exact([100.6, 100.2001, 102.3])
    assert policy.adjust(job(PAIR), "y", plan, warm, p, NOW) == "b"


def random_view(rng: np.random.Generator, n: int) -> ViewSnapshot:
    states = []
    for i in range(n):
        # one cache at least can hold every model
        capacity = 10 * GB if i == 0 else int(rng.choice([GB // 2, 2 * GB, 10 * GB]))
        models = frozenset(m for m in ("m", "n") if rng.random() < 0.4)
        used = min(capacity, GB * len(models))
        wait = float(rng.choice([0.0, rng.uniform(0.0, 0.05), rng.uniform(0.0, 3.0)]))
        states.append(Heartbeat(f"w{i}", wait, models, capacity - used, capacity))
    return ViewSnapshot.build(states)


FAN = Workflow(
    "fan",
    [
        t("r", model=None, ms=1.0, out=10 * MB),
        t("short", "r", ms=100, out=MB),
        t("mid", "r", model="n", ms=200, out=5 * MB),
        t("long", "r", ms=300, out=MB),
        t("join", "short", "mid", "long", model=None, ms=1.0),
    ],
)


@pytest.mark.parametrize("name", ["compass", "compass_nocache", "central"])
@pytest.mark.parametrize("now", [0.0, 1234.5])
def test_every_move_goes_to_a_worker_ranked_first(name: str, now: float) -> None:
    rng = np.random.default_rng(7)
    p = profiles(FAN)
    p.set_model_bytes("n", GB)
    policy = make_policy(name)
    moves = 0
    for _ in range(150):
        view = random_view(rng, int(rng.integers(2, 7)))
        names = view.names
        plan = {task: names[int(rng.integers(0, len(names)))] for task in FAN.order}
        for task in ("short", "mid", "long"):
            moved = policy.adjust(job(FAN, names[0]), task, plan, view, p, now)
            if moved == plan[task]:
                continue
            moves += 1
            eft = policy.finish_times(job(FAN, names[0]), task, plan, view, p, now)
            assert eft[view.index(moved)] <= eft.min() + TIE_S
    assert moves > 50  # the check above ran


class Recording:
    """A policy that is not a :class:`CompassPolicy`: it delegates to one and records what
    :func:`adjust_successors` asked, so the protocol alone must carry what it needs."""

    def __init__(self, inner: CompassPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self.dynamic = inner.dynamic
        self.oldest_job_first = inner.oldest_job_first
        self.warms_cache = inner.warms_cache
        self.host_lanes = inner.host_lanes
        self.counts_siblings = inner.counts_siblings
        self.batch_aware = inner.batch_aware
        self.deadline_slack = inner.deadline_slack
        self.finishes: dict[str, FloatArray] = {}
        self.joins_finish: dict[str, tuple[int, float]] = {}
        self.joins_wait: list[float] = []

    def plan(
        self, job: JobInfo, view: ViewSnapshot, profiles: Profiles, now: float
    ) -> dict[str, str]:
        return self.inner.plan(job, view, profiles, now)

    def adjust(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> str:
        return self.inner.adjust(job, task, plan, view, profiles, now)

    def finish_times(
        self,
        job: JobInfo,
        task: str,
        plan: Mapping[str, str],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> FloatArray:
        found = self.inner.finish_times(job, task, plan, view, profiles, now)
        self.finishes[task] = found
        return found

    def joins_fed_by(self, wf: Workflow, finished: str) -> tuple[str, ...]:
        return self.inner.joins_fed_by(wf, finished)

    def place_joins(
        self,
        job: JobInfo,
        finished: str,
        plan: Mapping[str, str],
        finish: Mapping[str, tuple[int, float]],
        view: ViewSnapshot,
        profiles: Profiles,
        now: float,
    ) -> dict[str, str]:
        self.joins_finish = dict(finish)
        self.joins_wait = view.wait_s.tolist()
        moves = self.inner.place_joins(job, finished, plan, finish, view, profiles, now)
        # the join goes where the rule, fed the siblings' finishes, ranks it first
        wf = job.workflow
        costs = self.inner.costs(wf, profiles, view)
        for j, target in moves.items():
            preds = wf.preds(j)
            eft = finish_row(
                costs,
                wf.index[j],
                [finish[q][0] for q in preds],
                [finish[q][1] for q in preds],
                view.wait_s + now,
                None,
            )[0]
            assert eft[view.index(target)] <= eft.min() + TIE_S
        return moves

    def planner(self, view: ViewSnapshot) -> str | None:
        return self.inner.planner(view)


def fan_view() -> ViewSnapshot:
    # r finished on a, busy for 5 s; b, c, d are idle and hold m; only d holds n
    return ViewSnapshot.build(
        [
            Heartbeat("a", 5.0, frozenset({"m"}), 9 * GB, 10 * GB),
            Heartbeat("b", 0.0, frozenset({"m"}), 9 * GB, 10 * GB),
            Heartbeat("c", 0.0, frozenset({"m"}), 9 * GB, 10 * GB),
            Heartbeat("d", 0.0, frozenset({"m", "n"}), 8 * GB, 10 * GB),
        ]
    )


@pytest.mark.parametrize("now", [0.0, 5000.25])
def test_siblings_count_until_the_rules_finish_and_the_join_follows_them(now: float) -> None:
    p = profiles(FAN)
    p.set_model_bytes("n", GB)
    plan = dict.fromkeys(FAN.order, "a")
    recording = Recording(CompassPolicy())
    policy: Policy = recording
    new = adjust_successors(policy, job(FAN), "r", plan, fan_view(), p, now)
    # the same plan as Compass itself: nothing depends on the policy's class
    assert new == adjust_successors(CompassPolicy(), job(FAN), "r", plan, fan_view(), p, now)
    assert {new["short"], new["mid"], new["long"]} == {"b", "c", "d"}
    assert new["mid"] == "d"  # where n is resident
    assert new["join"] == new["long"]  # the last input's worker
    # each sibling counts until the finish the rule gives on its worker, in absolute time
    finish = recording.joins_finish
    assert set(finish) == {"short", "mid", "long"}
    for task, (i, done) in finish.items():
        assert fan_view().names[i] == new[task]
        assert done == recording.finishes[task][i]
        # and the view the join is placed on has its worker busy until then
        assert recording.joins_wait[i] == exact(done - now)
    # long (0.3 s) chose first, on b (lowest index among the idle); mid (0.2 s) on d; short
    # (0.1 s) on c; each waits 0.1001 s for r's 10 MB
    assert finish["long"][1] == exact(now + 0.1001 + 0.3)
    assert finish["mid"][1] == exact(now + 0.1001 + 0.2)
    assert finish["short"][1] == exact(now + 0.1001 + 0.1)


def test_decisions_do_not_depend_on_the_clocks_origin() -> None:
    rng = np.random.default_rng(3)
    p = profiles(FAN)
    p.set_model_bytes("n", GB)
    for _ in range(40):
        view = random_view(rng, int(rng.integers(1, 6)))
        names = view.names
        plan = {task: names[int(rng.integers(0, len(names)))] for task in FAN.order}
        for name in ("compass", "compass_nocache", "jsq"):
            early, late = make_policy(name), make_policy(name)
            info = job(FAN, names[0])
            assert early.plan(info, view, p, 0.0) == late.plan(info, view, p, 777.0)
            assert adjust_successors(early, info, "r", plan, view, p, 0.0) == adjust_successors(
                late, info, "r", plan, view, p, 777.0
            )
            shifted = late.finish_times(info, "mid", plan, view, p, 777.0)
            base = early.finish_times(info, "mid", plan, view, p, 0.0)
            assert shifted.tolist() == pytest.approx((base + 777.0).tolist(), abs=1e-9)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_answers_what_adjustment_needs(name: str) -> None:
    p = profiles(FAN)
    p.set_model_bytes("n", GB)
    policy = make_policy(name, host_lanes=True)
    assert isinstance(policy.host_lanes, bool)
    joins = policy.joins_fed_by(FAN, "r")
    moves_joins = name in ("compass", "compass_nocache", "central", "compass-chained")
    assert joins == (("join",) if moves_joins else ())
    assert policy.joins_fed_by(FAN, "short") == ()
    plan = dict.fromkeys(FAN.order, "a")
    eft = policy.finish_times(job(FAN), "short", plan, fan_view(), p, NOW)
    assert eft.shape == (4,)
    assert bool(np.all(eft > NOW))
    finish = {"short": (1, NOW + 1.0), "mid": (3, NOW + 2.0), "long": (2, NOW + 3.0)}
    moved = policy.place_joins(job(FAN), "r", plan, finish, fan_view(), p, NOW)
    assert moved == ({"join": "c"} if moves_joins else {})


def test_fewest_bytes_over_a_few_ties_matches_the_vector_rule() -> None:
    """A few ties are summed in a Python loop, many with numpy: the same worker, for roots,
    chains and joins, with or without a model, in a small cluster and a large one."""
    from compass.sched.eft import _fewest_bytes_array, fewest_bytes

    wf = Workflow(
        "diamond",
        [
            t("r", out=3 * MB),
            t("x", "r", out=5 * MB),
            t("y", "r", model=None, out=5 * MB),
            t("j", "x", "y", out=MB),
        ],
    )
    rng = np.random.default_rng(7)
    for n in (8, 80):  # below and above LARGE_CLUSTER (64)
        names = tuple(f"w{i:02d}" for i in range(n))
        costs = WorkflowCosts(wf, profiles(wf), names)
        for _ in range(300):
            task = wf.order[int(rng.integers(len(wf.order)))]
            k = wf.index[task]
            ties = np.sort(rng.choice(n, size=int(rng.integers(2, min(n, 32) + 1)), replace=False))
            sources = [int(s) for s in rng.integers(-1, n, size=max(1, len(costs.preds[k])))]
            ingress = int(rng.integers(-1, n))
            have = rng.random(n) < 0.3 if rng.random() < 0.8 else None
            root_bytes = int(rng.integers(0, 3)) * MB
            prefer = int(rng.choice([-1, int(rng.choice(ties)), int(rng.integers(n))]))
            args = (ties, costs, k, sources, ingress, root_bytes, have, prefer)
            assert fewest_bytes(*args) == _fewest_bytes_array(*args)


def test_fewest_bytes_picks_the_tie_moving_least_then_the_preferred_one() -> None:
    from compass.sched.eft import fewest_bytes

    costs = WorkflowCosts(PAIR, profiles(PAIR), ("a", "b", "c", "d"))
    y = PAIR.index["y"]
    ties = np.array([1, 2, 3])
    have = np.array([False, False, True, True])
    # x's 10 MB output on c: c moves nothing, d the output, b the output and the model
    assert fewest_bytes(ties, costs, y, [2], -1, 0, have, -1) == 2
    # with the output on a, c and d both move only the output: the preferred one, else the
    # lowest index
    assert fewest_bytes(ties, costs, y, [0], -1, 0, have, 3) == 3
    assert fewest_bytes(ties, costs, y, [0], -1, 0, have, -1) == 2
    assert fewest_bytes(ties, costs, y, [0], -1, 0, have, 1) == 2  # b must fetch the model
