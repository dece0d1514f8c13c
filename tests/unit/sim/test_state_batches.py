"""The simulated views carry each worker's queued batches like its wait: peers as of the last
published tick (what was left of the wait before the first batch starts then), self exact."""

from __future__ import annotations

import pytest

from compass.sched.view import BatchCurve, Placement, ViewSnapshot
from compass.sim.state import ClusterState
from compass.workflow.dag import linear_scale

HB = 0.010
GB = 1_000_000_000


def make_state(staleness: float = 0.0) -> ClusterState:
    return ClusterState(
        ("w0", "w1", "w2"),
        ["m", "n"],
        [10 * GB] * 3,
        lanes=1,
        heartbeat_s=HB,
        staleness_s=staleness,
        settle_s=2 * HB,
    )


def look(
    state: ClusterState,
    viewer: int,
    now: float,
    own: dict[str, tuple[int, float]] | None = None,
) -> ViewSnapshot:
    state.advance(now)
    return state.snapshot(viewer, now, 0.0, own)


def test_no_batches_no_arrays() -> None:
    state = make_state()
    state.advance(0.001)
    state.queue_changed(1, 0.5, (), {})
    view = look(state, 0, 0.025)
    assert not view.batches
    assert view.batched("m") is None


def test_published_batches_age_like_the_wait() -> None:
    state = make_state()
    state.advance(0.002)
    # at 0.002 w1 holds 3 batchable tasks of m, the first to start in 0.1 s (at 0.102)
    state.queue_changed(1, 0.4, (0.102,), {"m": (3, 0.1)})
    # the view at 0.005 still shows tick 0 (before the event): nothing
    assert look(state, 0, 0.005).batched("m") is None
    # at 0.055 it shows tick 5 (t = 0.05): 0.052 s are left before the batch starts
    rows = look(state, 0, 0.055).batched("m")
    assert rows is not None
    assert rows[0].tolist() == [0, 3, 0]
    assert rows[1][1] == pytest.approx(0.052)
    assert look(state, 0, 0.055).wait_s[1] == pytest.approx(0.4 + 0.052)
    # past its expected start, nothing is left of it (the published start never goes below 0)
    late = look(state, 0, 0.2).batched("m")
    assert late is not None
    assert late[1][1] == 0.0
    # the queue changed: the batch left (it started), and the next capture shows none
    state.advance(0.21)
    state.queue_changed(1, 0.0, (0.5,), {})
    assert look(state, 0, 0.225).batched("m") is None


def test_own_batches_are_exact_and_replace_the_published_ones() -> None:
    state = make_state(staleness=HB)
    state.advance(0.001)
    state.queue_changed(1, 0.4, (), {"m": (2, 0.3)})
    state.queue_changed(2, 0.4, (), {"m": (1, 0.2)})
    published = look(state, 0, 0.025).batched("m")
    assert published is not None
    assert published[0].tolist() == [0, 2, 1]
    # w1 looks at itself: its own queue's batches (seconds from now), not the tick's
    own = look(state, 1, 0.025, {"m": (4, 0.05), "n": (1, 0.0)})
    rows, n_rows = own.batched("m"), own.batched("n")
    assert rows is not None
    assert n_rows is not None
    assert rows[0].tolist() == [0, 4, 1]
    assert rows[1][1] == 0.05
    assert n_rows[0].tolist() == [0, 1, 0]
    # its batch left since the tick: its own entry shows none, the others' stay
    gone = look(state, 1, 0.025, {}).batched("m")
    assert gone is not None
    assert gone[0].tolist() == [0, 0, 1]
    # w2 looking at itself with none left: w1's published batch is still there
    only_w1 = look(state, 2, 0.025, {}).batched("m")
    assert only_w1 is not None
    assert only_w1[0].tolist() == [0, 2, 0]
    # once no worker publishes any, the model has no arrays at all
    state.advance(0.03)
    state.queue_changed(1, 0.4, (), {})
    state.queue_changed(2, 0.4, (), {})
    assert look(state, 0, 0.065).batched("m") is None
    # snapshots never write into the published rows
    assert published[0].tolist() == [0, 2, 1]


def test_a_placed_batchable_task_joins_a_published_batch_or_leads_the_next() -> None:
    curve = BatchCurve(linear_scale(0.15, 8), 8)
    state = make_state()
    state.advance(0.002)
    state.queue_changed(1, 0.4, (0.102,), {"m": (1, 0.1)})  # w1: one task of m, from 0.102
    state.note_placement(0, 1, Placement(0.3, "m", GB, curve=curve), now=0.051)
    state.note_placement(0, 2, Placement(0.3, "m", GB, curve=curve), now=0.051)
    view = look(state, 0, 0.051)
    rows = view.batched("m")
    assert rows is not None
    # on w1 it joins: the batch waits 0.052 s more and the queue grows by 0.15 of a run
    assert rows[0].tolist() == [0, 2, 1]
    assert rows[1][1] == pytest.approx(0.052)
    assert view.wait_s[1] == pytest.approx(0.4 + 0.052 + 0.3 * 0.15)
    # on the idle w2 it leads a batch starting now, and the queue grows by a whole run
    assert rows[1][2] == 0.0
    assert view.wait_s[2] == pytest.approx(0.3)
    # another viewer sees only what was published
    other = look(state, 2, 0.051).batched("m")
    assert other is not None and other[0].tolist() == [0, 1, 0]
