"""The simulated views: peers as of the last tick at least `staleness` old, self exact,
recent placements counted until a heartbeat settles them."""

from __future__ import annotations

import numpy as np
import pytest

from compass.errors import ConfigError
from compass.sched.view import Placement, ViewSnapshot
from compass.sim.state import ClusterState

HB = 0.010
GB = 1_000_000_000


def make_state(staleness: float = HB) -> ClusterState:
    return ClusterState(
        ("w0", "w1", "w2"),
        ["m", "n"],
        [10 * GB, 10 * GB, 10 * GB],
        lanes=1,
        heartbeat_s=HB,
        staleness_s=staleness,
        settle_s=2 * HB,
    )


def look(state: ClusterState, viewer: int, now: float, own_wait: float = 0.0) -> ViewSnapshot:
    state.advance(now)  # the simulator advances before every event
    return state.snapshot(viewer, now, own_wait)


def test_peers_are_seen_as_of_the_last_tick_at_least_staleness_old() -> None:
    state = make_state()
    state.advance(0.003)
    state.queue_changed(1, 0.5, ())
    # at 0.015 the view shows tick 0 (0.005 is less than one heartbeat ago): before the push
    assert look(state, 0, 0.015).wait_s[1] == 0.0
    assert look(state, 0, 0.0199).wait_s[1] == 0.0
    # at 0.021 it shows tick 1 (t = 0.010), after the push
    assert look(state, 0, 0.021).wait_s[1] == pytest.approx(0.5)


def test_running_work_counts_what_is_left_at_the_published_tick() -> None:
    state = make_state(staleness=0.0)
    state.advance(0.0)
    state.queue_changed(2, 0.2, ())
    state.queue_changed(2, 0.0, (0.2,))  # a lane took it, expected to end at 0.2
    # with no staleness the view at 0.055 shows tick 5 (t = 0.05): 0.15 s left
    assert look(state, 0, 0.055).wait_s[2] == pytest.approx(0.15)
    assert look(state, 0, 0.35).wait_s[2] == 0.0


def test_own_entry_is_exact_and_peers_lag() -> None:
    state = make_state()
    state.advance(0.001)
    state.cache_changed(1, "m", (), 7 * GB)
    view = state.snapshot(1, 0.002, own_wait_s=0.7)
    assert view.wait_s[1] == 0.7
    assert view.free_bytes[1] == 7 * GB
    assert bool(view.holds("m")[1])
    other = state.snapshot(0, 0.002, own_wait_s=0.0)
    assert not other.holds("m")[1]
    assert other.free_bytes[1] == 10 * GB
    later = look(state, 0, 0.0201)
    assert bool(later.holds("m")[1])
    assert later.free_bytes[1] == 7 * GB


def test_eviction_shows_up_in_the_view() -> None:
    state = make_state(staleness=0.0)
    state.advance(0.0)
    state.cache_changed(0, "m", (), 4 * GB)
    state.advance(0.004)
    state.cache_changed(0, "n", ("m",), 6 * GB)
    view = look(state, 2, 0.011)
    assert not view.holds("m")[0]
    assert bool(view.holds("n")[0])
    assert view.free_bytes[0] == 6 * GB


def test_placements_count_until_a_heartbeat_settles_them() -> None:
    state = make_state()
    state.note_placement(0, 2, Placement(0.5, "m", 3 * GB), now=0.021)
    view = look(state, 0, 0.021)
    assert view.wait_s[2] == pytest.approx(0.5)
    assert bool(view.holds("m")[2])
    assert view.free_bytes[2] == 7 * GB
    # only the placing worker counts it
    assert look(state, 1, 0.021).wait_s[2] == 0.0
    # settle_s = 0.02 after 0.021 is 0.041; the first heartbeat received after that is tick 4's,
    # received at 0.040 + staleness
    assert look(state, 0, 0.0499).wait_s[2] == pytest.approx(0.5)
    assert look(state, 0, 0.0501).wait_s[2] == 0.0
    assert state.pending(0) == 0


def test_a_job_does_not_see_its_own_placements_but_other_jobs_do() -> None:
    state = make_state()
    state.note_placement(0, 2, Placement(0.5, "m", 3 * GB, job="j1"), now=0.021)
    state.note_placement(0, 2, Placement(0.25, job="j2"), now=0.021)
    state.advance(0.021)
    own = state.snapshot(0, 0.021, 0.0, without="j1")
    assert own.wait_s[2] == pytest.approx(0.25)
    assert not own.holds("m")[2]
    assert own.free_bytes[2] == 10 * GB
    other = state.snapshot(0, 0.021, 0.0, without="j3")
    assert other.wait_s[2] == pytest.approx(0.75)
    assert bool(other.holds("m")[2])
    assert other.free_bytes[2] == 7 * GB


def test_placements_stop_counting_once_they_would_have_run() -> None:
    state = make_state()
    state.note_placement(0, 1, Placement(0.004), now=0.0)
    assert look(state, 0, 0.003).wait_s[1] == pytest.approx(0.004)
    assert look(state, 0, 0.005).wait_s[1] == 0.0


def test_two_placements_of_one_model_fetch_it_once() -> None:
    state = make_state()
    state.note_placement(0, 1, Placement(0.1, "n", 2 * GB), now=0.0)
    state.note_placement(0, 1, Placement(0.2, "n", 2 * GB), now=0.0)
    view = look(state, 0, 0.001)
    assert view.wait_s[1] == pytest.approx(0.3)
    assert view.free_bytes[1] == 8 * GB


def test_snapshots_are_read_only_and_do_not_leak_into_each_other() -> None:
    state = make_state()
    first = look(state, 0, 0.0)
    with pytest.raises(ValueError, match="read-only"):
        first.wait_s[1] = 5.0
    with pytest.raises(ValueError, match="read-only"):
        first.holds("m")[1] = True
    state.note_placement(0, 1, Placement(0.3, "m", GB), now=0.0)
    second = look(state, 0, 0.0)
    assert second.wait_s[1] == pytest.approx(0.3)
    assert first.wait_s[1] == 0.0
    assert not first.holds("m")[1]


def test_from_arrays_checks_lengths() -> None:
    names = ("w0", "w1")
    cap = np.array([GB, GB], dtype=np.int64)
    view = ViewSnapshot.from_arrays(names, np.zeros(2), cap.copy(), cap, {})
    assert view.index("w1") == 1
    assert view.min_capacity_bytes == GB
    with pytest.raises(ConfigError, match="2 names"):
        ViewSnapshot.from_arrays(names, np.zeros(3), cap.copy(), cap, {})


def test_names_must_be_sorted() -> None:
    with pytest.raises(ConfigError, match="sorted"):
        ClusterState(
            ("w1", "w0"), ["m"], [GB, GB], lanes=1, heartbeat_s=HB, staleness_s=HB, settle_s=HB
        )


def test_a_view_at_a_priority_shows_running_work_and_the_queued_work_of_that_level_up() -> None:
    state = make_state(staleness=0.0)
    state.advance(0.0)
    # w1: 3 s queued in all, of which 1 s at level 1 and 0.5 s at level 2; a run ends at 0.4
    state.queue_changed(1, 3.0, (0.4,), None, {1: 1.0, 2: 0.5})
    state.queue_changed(2, 2.0, ())  # w2: only level-0 work
    at = 0.105  # shows tick 10 (t = 0.1): 0.3 s of the run left
    assert look(state, 0, at).wait_s[1] == pytest.approx(3.3)
    high = state.snapshot(0, at, 0.25, priority=1)
    assert high.wait_s[0] == 0.25  # its own wait, as the caller computed it for the level
    assert high.wait_s[1] == pytest.approx(1.8) and high.wait_s[2] == 0.0
    assert state.snapshot(0, at, 0.0, priority=2).wait_s[1] == pytest.approx(0.8)
    # a placement counts at its own level and below only
    state.note_placement(0, 2, Placement(1.0, job="j", priority=1), at)
    assert state.snapshot(0, at, 0.0, priority=1).wait_s[2] == pytest.approx(1.0)
    assert state.snapshot(0, at, 0.0, priority=2).wait_s[2] == 0.0
    assert state.snapshot(0, at, 0.0).wait_s[2] == pytest.approx(3.0)
    state.advance(0.2)
    state.queue_changed(1, 3.0, (0.4,))  # the level-1 and 2 work is gone
    state.advance(0.21)  # publishes tick 21 (t = 0.21): 0.19 s of the run left
    assert state.snapshot(0, 0.21, 0.0, priority=1).wait_s[1] == pytest.approx(0.19)
