"""Compass's batch-aware rule on crafted views: a batchable task goes where it joins a batch of
its model already queued, at its marginal cost, when its input arrives in time and the batch
has room and gains; planning, adjustment and join placement all use it, the baselines do not.
"""

from __future__ import annotations

from typing import Any

import pytest

from compass.sched import (
    POLICY_NAMES,
    ClusterView,
    CompassOptions,
    CompassPolicy,
    Heartbeat,
    JobInfo,
    ViewSnapshot,
    adjust_successors,
    make_policy,
    record_plan,
)
from compass.workflow import Profiles, Task, TaskProfile, Workflow
from compass.workflow.dag import linear_scale

GB = 1_000_000_000
MB = 1_000_000
NOW = 100.0
MILD = linear_scale(0.15, 8)  # a batch of b costs 1 + 0.15 (b - 1) runs


def exact(expected: float) -> Any:
    return pytest.approx(expected, rel=0.0, abs=1e-9)


def task(
    name: str,
    *after: str,
    model: str | None = "m",
    ms: float = 1000.0,
    batch: int = 8,
    scale: tuple[float, ...] = MILD,
) -> Task:
    profile = TaskProfile(exec_ms=ms, output_bytes=0, input_bytes=0, batch_scale=scale)
    return Task(name, model, after, profile, batch=batch if model is not None else 1)


def profiles(*wfs: Workflow) -> Profiles:
    # 10 MB over the network take 0.1 s plus 0.1 ms; fetching m (1 GB) takes 1 s
    return Profiles(
        h2d_bytes_per_s=1e9,
        net_bytes_per_s=1e8,
        net_fixed_s=1e-4,
        model_sizes={"m": GB, "n": GB},
        workflows=wfs,
        staged=False,
    )


def state(
    name: str,
    wait: float,
    models: tuple[str, ...] = ("m",),
    batches: dict[str, tuple[int, float]] | None = None,
) -> Heartbeat:
    return Heartbeat(name, wait, frozenset(models), 8 * GB, 10 * GB, batches=batches or {})


def one(**kw: Any) -> Workflow:
    return Workflow("one", [task("x", **kw)])


def crafted(count: int = 2, start: float = 0.2, a_models: tuple[str, ...] = ("m",)) -> ViewSnapshot:
    """a: 3 s of queue, but ``count`` tasks of m wait there to batch, the first starting in
    ``start`` s; b: 1.6 s of queue, no batch."""
    return ViewSnapshot.build([state("a", 3.0, a_models, {"m": (count, start)}), state("b", 1.6)])


def plan(view: ViewSnapshot, wf: Workflow, policy: str = "compass", **options: Any) -> str:
    """Where ``wf``'s task x goes for a job whose 10 MB input is at b (0.1 s away from a)."""
    chosen = make_policy(policy, options=options or None)
    found = chosen.plan(JobInfo("j", wf, "b", 10 * MB), view, profiles(wf), NOW)
    return found["x"]


def test_joins_a_queued_batch_on_the_worker_with_the_longer_wait() -> None:
    wf = one()
    view = crafted()
    assert plan(view, wf) == "a"
    # it finishes with the batch, start + exec x scale(3), not after a's 3 s of queue; ranked
    # with what it costs the two already queued (0.15 s each)
    policy = make_policy("compass")
    eft = policy.finish_times(JobInfo("j", wf, "b", 10 * MB), "x", {}, view, profiles(wf), NOW)
    assert eft[view.index("a")] == exact(NOW + 0.2 + 1.0 * 1.3 + 2 * 0.15)
    assert eft[view.index("b")] == exact(NOW + 1.6 + 1.0)


def test_not_when_joining_costs_the_batch_more_than_it_saves() -> None:
    # joining 4 queued: 0.2 + 1.6 + 4 x 0.15 = 2.4 s, before b's 2.6 s: it joins; joining 5:
    # its own finish (0.2 + 1.75 s) still beats b, but the five others each end 0.15 s later
    assert plan(crafted(count=4), one()) == "a"
    assert plan(crafted(count=5), one()) == "b"


def test_no_fetch_when_the_queued_batch_brings_the_model() -> None:
    # a does not hold m (a fetch would take 1 s): the queued batch brings it
    assert plan(crafted(a_models=()), one()) == "a"


def test_not_when_its_input_arrives_after_the_batch_starts() -> None:
    # the input needs 0.1001 s to reach a; the batch starts in 0.05 s
    assert plan(crafted(start=0.05), one()) == "b"
    assert plan(crafted(start=0.11), one()) == "a"


def test_not_when_the_batch_is_full() -> None:
    assert plan(crafted(count=3), one()) == "a"  # joins as the 4th: 0.2 + 1.45 + 0.45 s
    assert plan(crafted(count=3), one(batch=3)) == "b"  # its own limit is 3
    full = ViewSnapshot.build([state("a", 3.0, ("m",), {"m": (8, 0.0)}), state("b", 1.6)])
    assert plan(full, one()) == "b"  # a batch of 8 has no room, however soon it starts


@pytest.mark.parametrize("scale", [linear_scale(1.0, 8), ()])
def test_not_when_the_curve_gains_nothing(scale: tuple[float, ...]) -> None:
    assert plan(crafted(), one(scale=scale)) == "b"


def test_not_for_a_task_that_does_not_batch_or_another_model() -> None:
    assert plan(crafted(), one(batch=1)) == "b"
    wf = one(model="n")
    view = ViewSnapshot.build([state("a", 3.0, ("n",), {"m": (2, 0.2)}), state("b", 1.6, ("n",))])
    assert plan(view, wf) == "b"


def test_not_when_turned_off_nor_for_the_baselines() -> None:
    assert plan(crafted(), one(), batch_aware=False) == "b"
    wf = one()
    view = crafted()
    on = {"compass", "compass_nocache", "compass_noadjust", "central", "compass-chained"}
    for name in POLICY_NAMES:
        policy = make_policy(name)
        assert policy.batch_aware == (name in on), name
        if name in on or name in {"compass_noload", "heft"}:
            continue  # those two count no queue at all
        eft = policy.finish_times(JobInfo("j", wf, "b", 10 * MB), "x", {}, view, profiles(wf), NOW)
        assert eft[view.index("a")] >= NOW + 3.0 + 1.0, name  # behind a's whole queue
    # no queues, no batch to join
    assert not CompassPolicy(options=CompassOptions(use_load=False)).batch_aware
    with pytest.raises(Exception, match="unknown compass option"):
        make_policy("compass", options={"batch_awre": True})


# r (tiny, no model) feeds s1 and s2, two tasks of model m: one job's batchable siblings
FAN = Workflow(
    "fan",
    [
        task("r", model=None, ms=1.0),
        task("s1", "r"),
        task("s2", "r"),
        task("z", "s1", "s2", model=None, ms=1.0),
    ],
)


def test_a_plan_batches_its_own_same_model_siblings() -> None:
    # a idle, b busy 0.9 s. Blind, s2 goes to b (1.9 s) rather than after s1 on a (2.0 s);
    # aware, it joins s1's batch on a (done at 1.151 s)
    view = ViewSnapshot.build([state("a", 0.0), state("b", 0.9)])
    p = profiles(FAN)
    info = JobInfo("j", FAN, "a", 0)
    aware = make_policy("compass").plan(info, view, p, NOW)
    blind = make_policy("compass", options={"batch_aware": False}).plan(info, view, p, NOW)
    assert (aware["s1"], aware["s2"]) == ("a", "a")
    assert (blind["s1"], blind["s2"]) == ("a", "b")


def test_adjustment_places_siblings_into_one_batch() -> None:
    view = ViewSnapshot.build([state("a", 0.0), state("b", 0.9)])
    p = profiles(FAN)
    info = JobInfo("j", FAN, "a", 0)
    planned = {"r": "a", "s1": "a", "s2": "b", "z": "a"}
    aware = adjust_successors(make_policy("compass"), info, "r", planned, view, p, NOW)
    blind_policy = make_policy("compass", options={"batch_aware": False})
    blind = adjust_successors(blind_policy, info, "r", planned, view, p, NOW)
    assert (aware["s1"], aware["s2"]) == ("a", "a")
    assert (blind["s1"], blind["s2"]) == ("a", "b")


def test_adjustment_keeps_a_task_that_joins_a_batch_on_its_planned_worker() -> None:
    # x's input is on a (its predecessor ran there); a's queue is 3 s long but x joins a batch
    # starting now, adding 0.05 s: within the 0.1 x exec threshold, so it stays, though the
    # idle b would finish 0.05 s sooner
    wf = Workflow(
        "two", [task("w", model=None, ms=1.0), task("x", "w", scale=linear_scale(0.05, 8))]
    )
    view = ViewSnapshot.build([state("a", 3.0, batches={"m": (1, 0.0)}), state("b", 0.0)])
    info = JobInfo("j", wf, "a", 0)
    p = profiles(wf)
    plan_ = {"w": "a", "x": "a"}
    assert make_policy("compass").adjust(info, "x", plan_, view, p, NOW) == "a"
    blind = make_policy("compass", options={"batch_aware": False})
    assert blind.adjust(info, "x", plan_, view, p, NOW) == "b"
    # with a queue there that it would not join (its batch is full), it moves
    full = ViewSnapshot.build([state("a", 3.0, batches={"m": (8, 0.0)}), state("b", 0.0)])
    assert make_policy("compass").adjust(info, "x", plan_, full, p, NOW) == "b"


def test_join_placement_counts_joining_a_batch() -> None:
    # r ran on c; p1 and p2 (model n, 10 ms) stay on the idle c; the join j (model m) then
    # joins the task of m queued on a (done at 0.5 + 1.15 s, ranked 0.15 s later for the
    # task it delays) rather than fetching m to c (0.02 + 1 + 1 s) or queueing on b (1.6 + 1 s)
    wf = Workflow(
        "join",
        [
            task("r", model=None, ms=1.0),
            task("p1", "r", model="n", ms=10.0, batch=1),
            task("p2", "r", model="n", ms=10.0, batch=1),
            task("j", "p1", "p2"),
        ],
    )
    view = ViewSnapshot.build(
        [
            state("a", 3.0, ("m", "n"), {"m": (1, 0.5)}),
            state("b", 1.6, ("m",)),
            state("c", 0.0, ("n",)),
        ]
    )
    info = JobInfo("j", wf, "c", 0)
    p = profiles(wf)
    planned = {"r": "c", "p1": "c", "p2": "c", "j": "b"}
    aware = adjust_successors(make_policy("compass"), info, "r", planned, view, p, NOW)
    blind_policy = make_policy("compass", options={"batch_aware": False})
    blind = adjust_successors(blind_policy, info, "r", planned, view, p, NOW)
    assert (aware["p1"], aware["p2"], aware["j"]) == ("c", "c", "a")
    assert blind["j"] == "c"


def test_a_job_planned_before_the_next_heartbeat_joins_the_batch_the_last_one_opened() -> None:
    # the ingress i is busy; b busy 0.2 s, c 0.7 s, all holding m. The first job's x goes to b;
    # the second, planned before b's heartbeat shows it, joins it there (done at 1.35 s, ranked
    # 0.15 s later for the first) rather than queueing on c (1.7 s). Counted as a whole run, x
    # would have made b look busy until 1.2 s, and the second would have gone to c.
    wf = one()
    for aware, expected in ((True, "b"), (False, "c")):
        view = ClusterView("i", heartbeat_s=0.01)
        view.update_self(state("i", 10.0))
        view.apply_heartbeat(state("b", 0.2), now=NOW)
        view.apply_heartbeat(state("c", 0.7), now=NOW)
        policy = make_policy("compass", options={"batch_aware": aware})
        p = profiles(wf)
        first = JobInfo("j1", wf, "i", 0)
        placed = policy.plan(first, view.snapshot(NOW), p, NOW)
        assert placed == {"x": "b"}
        record_plan(view, first, placed, p, NOW, planner="i", batch_aware=policy.batch_aware)
        second = JobInfo("j2", wf, "i", 0)
        assert policy.plan(second, view.snapshot(NOW + 0.001), p, NOW + 0.001) == {"x": expected}


def test_the_fanout_view_counts_a_sibling_that_joined_a_batch_as_busy_until_its_ranked_finish() -> (
    None
):
    # r ran on a; s1 (model m) joins the batch of m queued on a (one task, from 0.2 s; ranked
    # at 0.2 + 1.15 + 0.15 = 1.5 s); s2 (model n, does not batch) then sees a busy until 1.5 s
    # (done at 2.5 s) and goes to b (2.42 s). Counting s1's join at its share of the batch only
    # (a's queue 1.35 s, s2 staying) measured worse: docs/RESULTS.md, "Batching".
    wf = Workflow(
        "mix",
        [
            task("r", model=None, ms=1.0),
            task("s1", "r"),
            task("s2", "r", model="n", batch=1),
            task("z", "s1", "s2", model=None, ms=1.0),
        ],
    )
    view = ViewSnapshot.build(
        [state("a", 1.2, ("m", "n"), {"m": (1, 0.2)}), state("b", 1.42, ("m", "n"))]
    )
    planned = {"r": "a", "s1": "a", "s2": "a", "z": "a"}
    found = adjust_successors(
        make_policy("compass"), JobInfo("j", wf, "a", 0), "r", planned, view, profiles(wf), NOW
    )
    assert (found["s1"], found["s2"]) == ("a", "b")


def stepwise(**kw: Any) -> Workflow:
    """One step-wise task x of m: 10 steps of 100 ms, whose steps batch (up to 8 jobs)."""
    profile = TaskProfile(exec_ms=1000.0, output_bytes=0, input_bytes=0, batch_scale=MILD, steps=10)
    return Workflow("one", [Task("x", "m", (), profile, batch=8, **kw)])


def running(count: int) -> ViewSnapshot:
    """a: 3 s of queue, but a step batch of m with ``count`` members runs there (it takes a
    task at its next step); b: 1.6 s of queue, no batch."""
    return ViewSnapshot.build([state("a", 3.0, ("m",), {"m/steps": (count, 0.0)}), state("b", 1.6)])


def test_a_step_batch_is_joined_where_the_task_itself_ends_first() -> None:
    wf = stepwise()
    # joining 5 members: its own finish, 0.1001 s (its input's way to a) + 1.0 x 1.75 s,
    # beats b's 1.6 + 1.0 s; a queued batch of 5 would not be joined (what the join costs
    # the five others, 5 x 0.15 s, tips it), but a running batch's members are partway through
    assert plan(running(5), wf) == "a"
    policy = make_policy("compass")
    view = running(5)
    eft = policy.finish_times(JobInfo("j", wf, "b", 10 * MB), "x", {}, view, profiles(wf), NOW)
    assert eft[view.index("a")] == exact(NOW + 0.1001 + 1.0 * 1.75)
    assert plan(running(8), wf) == "b"  # a batch of 8 has no room
