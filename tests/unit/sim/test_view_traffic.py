"""The messages a bounded view's real workers would send, counted in the simulator
(compass.sim.traffic): watch asks by the lease rule, state pushes to live watchers with the
real loop's spacing, rumors of cache changes; none for the mesh. Counting them changes no
outcome; what they tell the planners (compass.sim.heard) does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from compass.cache.policy import CacheCore
from compass.sim import Arrival, SimResult, engine, job_arrivals, simulate
from compass.sim.compare import SimConfig, compare_policies
from compass.sim.settings import SimSettings
from compass.sim.state import ClusterState
from compass.sim.traffic import CacheKey, ViewTraffic, view_traffic
from compass.workflow import load_workload

from .test_engine import hand_workload, run

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
EMPTY: CacheKey = (frozenset(), frozenset())
A: CacheKey = (frozenset(), frozenset({"a"}))  # loading a
AB: CacheKey = (frozenset({"a"}), frozenset({"b"}))


def traffic(workers: int) -> ViewTraffic:
    return ViewTraffic(
        [f"w{i}" for i in range(workers)],
        [EMPTY] * workers,
        lease_s=2.0,
        min_gap_s=0.001,
        max_rate=20000.0,
    )


def test_asks_follow_the_lease_and_pushes_go_to_live_watchers_a_gap_apart() -> None:
    t = traffic(3)
    t.planned(0, [0, 1, 2], 0.0)  # w0 asks w1 and w2 (not itself), each until 2.0
    assert t.asks == 2
    t.planned(0, [0, 1], 0.5)  # 1.5 s of lease left: not due
    t.planned(0, [1], 1.2)  # 0.8 s left, under half a lease: renewed, until 3.2
    assert t.asks == 3
    t.planned(1, [1], 1.2)  # only itself: nothing to ask
    assert t.asks == 3
    t.changed(1, 1.3, EMPTY)  # sent at once to its one watcher, w0
    assert (t.pushes, t.cache_changes) == (1, 0)
    t.changed(1, 1.3003, A)  # within the 1 ms gap: waits for it to end ...
    t.changed(1, 1.3006, AB)  # ... with this one
    assert t.pushes == 1
    t.changed(1, 1.8, AB)  # the two went together at 1.301, one rumor; this one at once
    assert (t.pushes, t.cache_changes) == (3, 1)
    t.changed(2, 2.5, EMPTY)  # w0's lease on w2 ended at 2.0: nobody to send to
    assert t.pushes == 3
    t.changed(1, 3.0, A)  # w0 still watches w1 (until 3.2); the cache changed back
    t.changed(1, 3.0005, A)
    assert (t.pushes, t.cache_changes) == (4, 2)
    t.finish()  # the change still waiting for its gap is sent at 3.001
    assert (t.pushes, t.cache_changes) == (5, 2)
    t.changed(1, 4.0, A)  # w0's lease ended at 3.2
    assert t.pushes == 5


def test_a_watch_asked_after_a_send_came_due_does_not_get_it() -> None:
    t = traffic(2)
    t.changed(1, 0.0, EMPTY)
    t.changed(1, 0.0005, A)  # due at 0.001, still unsent when w0 asks at 0.002
    t.planned(0, [1], 0.002)
    assert (t.asks, t.pushes, t.cache_changes) == (1, 0, 1)
    t.changed(1, 0.0025, A)  # a gap after 0.001: sent, to w0 now
    assert t.pushes == 1


def test_the_gap_grows_with_the_watchers() -> None:
    t = traffic(41)
    for planner in range(1, 41):  # 40 watchers of w0: 40 / 20,000 per s, a 2 ms gap
        t.planned(planner, [0], 0.0)
    t.changed(0, 0.0, EMPTY)
    t.changed(0, 0.0015, EMPTY)  # within 2 ms: sent at 0.002
    assert t.pushes == 40
    t.changed(0, 0.0025, EMPTY)  # the one of 0.002 went; this one within 2 ms of it
    assert t.pushes == 80
    t.finish()
    assert (t.asks, t.pushes) == (40, 120)


# a model-less task that runs where its 100 MB input lies (moving it costs more than the
# task), and one that needs model "a"; no warming or prefetching, so the caches change only
# for a job's own load
WORKLOAD = hand_workload(
    {"a": 100},
    {
        wf: {
            "best_ms": 100,
            "tasks": {
                "t": {"exec_ms": 100, "input_kb": 100_000, "output_kb": 1, "after": [], **extra}
            },
        }
        for wf, extra in (("plain", {}), ("model", {"model": "a"}))
    },
)


def counts(arrivals: list[Arrival], view: str) -> tuple[int, int, int]:
    result = run(WORKLOAD, arrivals, view=view, candidates=1, prefetch=False, warm=False)
    assert all(j.latency_s is not None for j in result.jobs)
    return result.view_asks, result.view_pushes, result.cache_changes


def test_two_workers_by_hand() -> None:
    # Client i enters at w{i}; with K = 1 each plans over itself and the other, and each job
    # runs at its ingress for 100 ms (a start and an end: two state changes).
    arrivals = [
        Arrival(0.0, "plain", 0),  # w0 asks w1 (a 10 s lease, until 10.0); w0 has no watcher
        Arrival(0.5, "plain", 1),  # w1 asks w0 (until 10.5); w0 watches it: 2 pushes
        Arrival(1.0, "plain", 0),  # w0's lease on w1 is not due; w1 watches w0: 2 pushes
        Arrival(11.0, "plain", 0),  # due again: an ask; w1's lease on w0 ended at 10.5
    ]
    assert counts(arrivals, "bounded") == (3, 4, 0)
    # a model: its load begins (a is loading) and ends (a is resident), two rumors; the
    # second job hits the cache. Nobody watches w0.
    arrivals = [Arrival(0.0, "model", 0), Arrival(1.0, "model", 0)]
    assert counts(arrivals, "bounded") == (1, 0, 2)
    assert counts(arrivals, "mesh") == (0, 0, 0)


def sim_json(view: str) -> dict[str, object]:
    config = SimConfig(
        workload=str(PAPER), workers=12, policies=("compass",), jobs=150, load=2.0, view=view
    )
    report = compare_policies(config).report
    runs: dict[str, object] = report["runs"]["compass"]
    return runs


def test_compass_sim_reports_the_counts_for_a_bounded_view_only() -> None:
    bounded, mesh = sim_json("bounded"), sim_json("mesh")
    for key in ("view_asks", "view_pushes", "cache_changes"):
        assert key not in mesh
        value = bounded[key]
        assert isinstance(value, int) and value > 0, (key, value)


REAL_TRAFFIC = view_traffic


def counting_only(state: ClusterState, caches: Sequence[CacheCore], seed: int) -> ViewTraffic:
    """The bounded view's messages counted, and nothing told to the planners."""
    traffic = REAL_TRAFFIC(state, caches, seed)
    state.heard = traffic.heard = None
    return traffic


@pytest.mark.parametrize("seed", [0, 1])
def test_counting_changes_no_outcome(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    paper = load_workload(PAPER)
    arrivals = job_arrivals(
        list(paper.workflows), 120, process="poisson", mean_interval_s=2.0, load=6, seed=seed
    )

    def once() -> SimResult:
        return simulate(paper, SimSettings(workers=10, policy="compass", view="bounded"), arrivals)

    modelled = once()
    monkeypatch.setattr(engine, "view_traffic", counting_only)
    counted = once()
    assert counted.view_asks > 0
    monkeypatch.setattr(engine, "view_traffic", lambda state, caches, seed: None)
    plain = once()
    assert (plain.view_asks, plain.view_pushes, plain.cache_changes) == (0, 0, 0)
    assert plain.jobs == counted.jobs and plain.tasks == counted.tasks
    assert (plain.events, plain.horizon_s, plain.loads) == (
        counted.events, counted.horizon_s, counted.loads,
    )  # fmt: skip
    # what the messages tell the planners (compass.sim.heard) does change the plans
    assert modelled.jobs != counted.jobs
