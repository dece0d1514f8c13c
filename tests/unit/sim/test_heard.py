"""What a simulated bounded view's planner knows of its candidates, and when
(compass.sim.heard): a watched candidate fresh, an unwatched one as last heard and aged, a
cache change seen only once its rumor (or a push) reached the planner."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from compass.cache.policy import CacheCore
from compass.sim import SimResult, engine, job_arrivals, simulate
from compass.sim.heard import _FEW, LINK_S, Heard, Told, rumor_delays
from compass.sim.settings import SimSettings
from compass.sim.state import ClusterState
from compass.sim.traffic import CacheKey, ViewTraffic, view_traffic
from compass.workflow import load_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
GB = 1_000_000_000
GAP = 0.001
LEASE = 2.0
EMPTY: CacheKey = (frozenset(), frozenset())
RUMOR_S = 0.3  # every rumor takes this long, here


def bounded(workers: int = 3) -> tuple[ClusterState, ViewTraffic]:
    """A bounded view's cluster state over ``workers`` idle workers: pushes a 1 ms gap and a
    link apart, rumors ``RUMOR_S`` on their way."""
    state = ClusterState(
        tuple(f"w{i}" for i in range(workers)), ["m"], [10 * GB] * workers, lanes=1,
        heartbeat_s=GAP, staleness_s=LINK_S, settle_s=2 * GAP,
    )  # fmt: skip
    heard = Heard(
        state.models, state.held, [state.told(i) for i in range(workers)], state.told,
        lease_s=LEASE, delays=np.array([RUMOR_S]), seed=0,
    )  # fmt: skip
    state.heard = heard
    traffic = ViewTraffic(
        state.names, [EMPTY] * workers, lease_s=LEASE, min_gap_s=GAP, max_rate=20000.0,
        heard=heard,
    )  # fmt: skip
    return state, traffic


def queue(state: ClusterState, traffic: ViewTraffic, worker: int, now: float, s: float) -> None:
    """``worker``'s queue holds ``s`` seconds from ``now`` on (as the engine tells both)."""
    state.advance(now)
    traffic.catch_up(worker, now)
    state.queue_changed(worker, s, ())
    traffic.changed(worker, now, EMPTY)


def wait_seen(state: ClusterState, viewer: int, peer: int, now: float) -> float:
    state.advance(now)
    among = np.array(sorted({viewer, peer}), dtype=np.intp)
    snap = state.snapshot(viewer, now, 0.0, among=among)
    return float(snap.wait_s[snap.positions[f"w{peer}"]])


def test_an_unwatched_candidate_shows_what_was_last_heard_aged() -> None:
    state, traffic = bounded()
    queue(state, traffic, 1, 0.1, 5.0)  # w1 has 5 s queued; w0 has heard nothing of it
    assert wait_seen(state, 0, 1, 0.15) == 0.0  # its state at start (no rumor since)
    traffic.planned(0, [0, 1], 0.2)  # w0 watches w1 until 0.2 + link + 2 s
    queue(state, traffic, 1, 1.0, 6.0)  # pushed to w0: seen fresh
    assert wait_seen(state, 0, 1, 1.01) == pytest.approx(6.0)
    queue(state, traffic, 1, 2.5, 9.0)  # after the lease: w0 does not hear it
    # the last push (the state of 1.0, received a link later), aged by the time since
    assert wait_seen(state, 0, 1, 3.0) == pytest.approx(6.0 - (3.0 - 1.0 - LINK_S))
    assert wait_seen(state, 0, 1, 8.0) == 0.0  # aged to nothing: floored at 0
    # w2 never watched w1 and heard no rumor: w1 as at start
    assert wait_seen(state, 2, 1, 3.0) == 0.0


def test_a_watched_candidate_is_fresh_from_the_answer_to_its_ask() -> None:
    state, traffic = bounded()
    queue(state, traffic, 1, 0.1, 5.0)
    traffic.planned(0, [0, 1], 0.2)
    # the plan that asked still saw the old state; the answer arrives two links later
    assert wait_seen(state, 0, 1, 0.2) == 0.0
    assert wait_seen(state, 0, 1, 0.2 + 3 * LINK_S) == pytest.approx(5.0)
    queue(state, traffic, 1, 0.5, 2.0)  # each change pushed, seen within a gap and a link
    assert wait_seen(state, 0, 1, 0.5 + GAP + 2 * LINK_S) == pytest.approx(2.0)
    traffic.planned(0, [0, 1], 1.5)  # renewed before the lease ends: watched throughout
    queue(state, traffic, 1, 3.0, 7.0)
    assert wait_seen(state, 0, 1, 3.0 + GAP + 2 * LINK_S) == pytest.approx(7.0)


def load(state: ClusterState, traffic: ViewTraffic, worker: int, now: float) -> None:
    """``worker`` begins loading model m at ``now``."""
    state.advance(now)
    traffic.catch_up(worker, now)
    state.cache_changed(worker, "m", (), 9 * GB)
    state.queue_changed(worker, 0.0, ())
    traffic.changed(worker, now, (frozenset(), frozenset({"m"})))


def test_a_cache_change_is_seen_once_its_rumor_arrives_or_at_once_by_a_watcher() -> None:
    state, traffic = bounded()
    traffic.planned(1, [1, 2], 0.5)  # w1 watches w2; w0 does not
    load(state, traffic, 2, 1.0)
    for now, w0_sees in ((1.01, False), (1.0 + RUMOR_S - 0.001, False), (1.0 + RUMOR_S, True)):
        state.advance(now)
        (held,) = state.holders(0, now, ["m"])
        assert bool(held[2]) is w0_sees, now
        among = np.array([0, 2], dtype=np.intp)
        assert bool(state.snapshot(0, now, 0.0, among=among).holds("m")[1]) is w0_sees
    state.advance(1.01)
    (held,) = state.holders(1, 1.01, ["m"])  # the watcher: with the push
    assert bool(held[2])
    # a planner that asks for a watch gets the cache with the answer, before the rumor
    state2, traffic2 = bounded()
    load(state2, traffic2, 2, 1.0)
    traffic2.planned(0, [0, 2], 1.05)
    state2.advance(1.06)
    assert bool(state2.holders(0, 1.06, ["m"])[0][2])


def idle(workers: int, delays: np.ndarray, seed: int = 0) -> Heard:
    """What ``workers`` idle workers hear of each other, their rumors ``delays`` away."""
    initial = [Told(0.0, 0.0, (), 1, {}, {}) for _ in range(workers)]
    return Heard(
        ("a", "b"), np.zeros((2, workers), dtype=np.bool_), initial,
        lambda worker, at: Told(at, 0.0, (), 1, {}, {}), lease_s=LEASE, delays=delays, seed=seed,
    )  # fmt: skip


def test_a_lease_ends_a_lease_after_its_ask_in_whatever_order_they_were_asked() -> None:
    heard = idle(3, np.array([RUMOR_S]))
    heard.watch(0, [1], 5.0)
    heard.watch(0, [2], 1.0)  # asked for at an earlier time: its lease ends first
    ends = 1.0 + LINK_S + LEASE
    heard.advance(ends)
    assert heard.watching(0).tolist() == [False, True, True]
    heard.advance(ends + 0.001)
    assert heard.watching(0).tolist() == [False, True, False]
    assert not heard.watched(0, 2, ends + 0.001)
    heard.watch(0, [1], 6.0)  # renewed: its first end passes, and it is still watched
    heard.advance(5.0 + LINK_S + LEASE + 0.001)
    assert heard.watching(0).tolist() == [False, True, False]
    heard.advance(6.0 + LINK_S + LEASE + 0.001)
    assert not heard.watching(0).any()


def test_the_unwatched_candidates_are_those_watched_says_at_every_step() -> None:
    """Heard.unwatched (one step over a snapshot's candidates) agrees with watched, peer by
    peer, over random asks, renewals and lapses: before an answer arrives, while a lease
    holds, after it lapses, asked again."""
    draw = random.Random(7)
    heard = idle(12, np.array([RUMOR_S]))
    now = 0.0
    for _ in range(400):
        now += draw.choice([LINK_S / 2, LINK_S, 0.3, 1.1, LEASE / 2])
        heard.advance(now)
        viewer = draw.randrange(12)
        if draw.random() < 0.5:
            heard.watch(viewer, draw.sample(range(12), draw.randint(1, 4)), now)
        among = np.array(sorted(draw.sample(range(12), draw.randint(1, 12))), dtype=np.intp)
        expected = [j for j, peer in enumerate(among.tolist())
                    if not heard.watched(viewer, peer, now)]  # fmt: skip
        assert heard.unwatched(viewer, among, now) == expected


def test_the_holders_heard_are_each_peers_newest_rumor_heard_however_many_are_in_flight() -> None:
    workers = 6
    heard = idle(workers, np.linspace(0.01, 1.0, 40), seed=3)
    rng = random.Random(5)
    sizes = set()
    for step in range(200):
        now = step * 0.01
        heard.advance(now)
        if step < 80:  # a rumor of a worker's new cache, sometimes with watchers pushed it
            worker = rng.randrange(workers)
            models = frozenset(rng.sample(("a", "b"), rng.randrange(3)))
            heard.rumor(worker, now, models, rng.sample(range(workers), rng.randrange(2)))
        if step % 7 == 0:  # a watch's answer brings a peer's rumors in flight at once
            viewer, peer = rng.sample(range(workers), 2)
            heard.watch(viewer, [peer], now)
        sizes.add(min(heard.in_flight(), _FEW + 1))
        for viewer in range(workers):
            rows = heard.holders(viewer, now, [0, 1])
            for peer in range(workers):
                seen = [bool(row[peer]) for row in rows]
                assert seen == heard.residency(viewer, peer, now).tolist(), (now, viewer, peer)
    assert sizes == set(range(_FEW + 2))  # none, a few, and more than a few in flight


def test_rumor_delays_follow_the_rules_and_are_deterministic() -> None:
    small = rumor_delays(20, period_s=0.1, fanout=2, sync_s=5.0)
    large = rumor_delays(1000, period_s=0.1, fanout=2, sync_s=156.0)
    again = rumor_delays.__wrapped__(1000, period_s=0.1, fanout=2, sync_s=156.0)
    np.testing.assert_array_equal(large, again)
    # a few periods, more in a larger cluster (log n): 1.5 and 3.9 periods at the median
    assert 0.05 < float(np.median(small)) < float(np.median(large)) < 0.6
    assert float(np.percentile(large, 99)) < 1.0


def run(seed: int) -> SimResult:
    paper = load_workload(PAPER)
    arrivals = job_arrivals(
        list(paper.workflows), 150, process="poisson", mean_interval_s=2.0, load=5.0, seed=1
    )
    return simulate(
        paper, SimSettings(workers=12, policy="compass", seed=seed, view="bounded"), arrivals
    )


def test_a_modelled_bounded_run_is_deterministic_for_a_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = run(0), run(0)
    assert a.jobs == b.jobs and a.tasks == b.tasks
    assert a.jobs != run(1).jobs
    assert all(j.latency_s is not None for j in a.jobs)
    # and it is the modelled view that plans: without what is heard, other plans
    real = view_traffic

    def counted(state: ClusterState, caches: Sequence[CacheCore], seed: int) -> ViewTraffic:
        traffic = real(state, caches, seed)
        state.heard = traffic.heard = None
        return traffic

    monkeypatch.setattr(engine, "view_traffic", counted)
    assert run(0).jobs != a.jobs
