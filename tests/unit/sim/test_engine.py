"""The simulator end to end: hand-computed latencies, caching, every policy, determinism,
and the paper's headline comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compass.errors import ConfigError
from compass.sched import POLICY_NAMES
from compass.sim import Arrival, SimResult, job_arrivals, simulate
from compass.sim.modes import SPREAD_FROM
from compass.sim.settings import SimSettings
from compass.workflow import Workload, load_workload, parse_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
MB = 1_000_000
# the hand-made cluster: bandwidths in bytes/s, fixed network latency in s
H2D, D2H, NET, FIXED = 10e9, 5e9, 1e9, 100e-6


def hand_workload(models: dict[str, float], workflows: dict[str, Any]) -> Workload:
    return parse_workload(
        {
            "name": "hand",
            "cluster": {
                "workers": 2,
                "gpu_memory_mb": 1000,
                "h2d_gbps": H2D / 1e9,
                "d2h_gbps": D2H / 1e9,
                "net_gbps": NET / 1e9,
                "net_fixed_us": FIXED * 1e6,
            },
            "models": {name: {"size_mb": size} for name, size in models.items()},
            "workflows": workflows,
        }
    )


def fetch(mb: float) -> float:
    return mb * MB / H2D


def transfer(nbytes: float) -> float:
    """GPU to GPU across workers: fixed + network + device-to-host + host-to-device."""
    return FIXED + nbytes / NET + nbytes / D2H + nbytes / H2D


def run(workload: Workload, arrivals: list[Arrival], **kwargs: Any) -> SimResult:
    kwargs.setdefault("slab_bytes", MB)
    kwargs.setdefault("workers", 2)
    kwargs.setdefault("policy", "compass")
    return simulate(workload, SimSettings(**kwargs), arrivals)


def tasks_of(result: SimResult, job_id: str) -> dict[str, Any]:
    return {t.task: t for t in result.tasks if t.job_id == job_id}


# A chain whose two models do not fit one cache together: the planner puts the second task on
# the other worker (a transfer beats a fetch with the eviction penalty).
CHAIN = hand_workload(
    {"a": 600, "b": 600},
    {
        "chain": {
            "best_ms": 150,
            "tasks": {
                "first": {
                    "model": "a",
                    "exec_ms": 100,
                    "input_kb": 1000,
                    "output_kb": 2000,
                    "after": [],
                },
                "second": {"model": "b", "exec_ms": 50, "output_kb": 500, "after": ["first"]},
            },
        }
    },
)

# A diamond on one worker: the right branch's model is prefetched while the left one runs.
DIAMOND = hand_workload(
    {"a": 200, "b": 300, "c": 400},
    {
        "diamond": {
            "tasks": {
                "root": {"model": "a", "exec_ms": 20, "output_kb": 10, "after": []},
                "left": {"model": "b", "exec_ms": 30, "output_kb": 10, "after": ["root"]},
                "right": {"model": "c", "exec_ms": 10, "output_kb": 10, "after": ["root"]},
                "join": {"model": None, "exec_ms": 5, "output_kb": 10, "after": ["left", "right"]},
            }
        }
    },
)


def test_single_job_latency_is_the_hand_computed_critical_path() -> None:
    result = run(CHAIN, [Arrival(0.0, "chain", 0)], warm=False)
    (job,) = result.jobs
    assert job.plan == {"first": "w0", "second": "w1"}
    expected = (
        fetch(600)
        + 0.100  # first: cold model a on the ingress, then run
        + transfer(2000e3)  # its output to w1
        + fetch(600)
        + 0.050  # second: cold model b, then run
        + transfer(500e3)  # the result back to the ingress
    )
    assert job.latency_s == pytest.approx(expected, rel=1e-9)
    # the computed best time (compass.workflow.best): both tasks on one worker, 150 ms, less
    # its one-in-a-million rounding slack
    assert job.slowdown == pytest.approx(expected / 0.150, rel=1e-5)
    tasks = tasks_of(result, job.id)
    assert tasks["second"].transfer_s == pytest.approx(transfer(2000e3))
    assert tasks["first"].fetch_s == pytest.approx(fetch(600))
    assert not tasks["first"].cache_hit and not tasks["second"].cache_hit
    assert result.model_bytes_loaded == 1200 * MB
    assert result.evictions == 0


def test_prefetch_overlaps_the_next_model_load_with_running() -> None:
    with_prefetch = run(DIAMOND, [Arrival(0.0, "diamond", 0)], workers=1)
    without = run(DIAMOND, [Arrival(0.0, "diamond", 0)], workers=1, prefetch=False)
    head = fetch(200) + 0.020 + fetch(300)  # root cold, then left's model
    # the right branch's model loads while left runs; right waits for what is left of it
    assert with_prefetch.jobs[0].latency_s == pytest.approx(
        head + max(0.030, fetch(400)) + 0.010 + 0.005, rel=1e-9
    )
    assert without.jobs[0].latency_s == pytest.approx(
        head + 0.030 + fetch(400) + 0.010 + 0.005, rel=1e-9
    )
    right = tasks_of(with_prefetch, with_prefetch.jobs[0].id)["right"]
    assert right.cache_hit is False  # still loading when it started
    assert right.fetch_s == pytest.approx(fetch(400) - 0.030)
    assert with_prefetch.prefetches == 1
    assert without.prefetches == 0
    # the join has no model: no hit or miss counted
    assert tasks_of(without, without.jobs[0].id)["join"].cache_hit is None
    # its computed best time: root, then left beside right (on another worker, its small
    # transfers fit within left's 30 ms), then the join
    latency = with_prefetch.jobs[0].latency_s
    assert latency is not None
    best = 0.020 + 0.030 + 0.005
    assert with_prefetch.jobs[0].slowdown == pytest.approx(latency / best, rel=1e-5)


def test_an_idle_worker_warms_its_cache_before_the_first_job_needs_it() -> None:
    # compass fills the idle cache (900 of 1000 MB) before a job arriving at 1 s
    warm = run(DIAMOND, [Arrival(1.0, "diamond", 0)], workers=1)
    warm_latency = warm.jobs[0].latency_s
    assert warm_latency == pytest.approx(0.020 + 0.030 + 0.010 + 0.005)
    assert all(t.cache_hit is not False for t in warm.tasks)
    assert warm.prefetches == 3 and warm.loads == 3
    # without warming, or under a paper baseline (caches filled on demand), every model misses
    for result in (
        run(DIAMOND, [Arrival(1.0, "diamond", 0)], workers=1, warm=False),
        run(DIAMOND, [Arrival(1.0, "diamond", 0)], workers=1, policy="hash"),
    ):
        assert [t.cache_hit for t in result.tasks].count(False) == 3
        cold_latency = result.jobs[0].latency_s
        assert cold_latency is not None and warm_latency is not None
        assert cold_latency > warm_latency + fetch(200)


def test_oldest_job_first_runs_an_older_jobs_step_first_and_fifo_does_not() -> None:
    # job A (two 100 ms steps) at 0, job B (one 100 ms step) at 50 ms, one worker
    workload = hand_workload(
        {"m": 100},
        {
            "two": {
                "tasks": {
                    "x": {"model": None, "exec_ms": 100, "output_kb": 1, "after": []},
                    "y": {"model": None, "exec_ms": 100, "output_kb": 1, "after": ["x"]},
                }
            },
            "one": {"tasks": {"z": {"model": None, "exec_ms": 100, "output_kb": 1, "after": []}}},
        },
    )
    arrivals = [Arrival(0.0, "two", 0), Arrival(0.05, "one", 1)]
    oldest = run(
        workload,
        arrivals,
        workers=1,
        policy_options={"oldest_job_first": True, "deadline_slack": None},
    )
    fifo = run(workload, arrivals, workers=1, policy="jsq")
    by_workflow = {j.workflow: j.latency_s for j in oldest.jobs}
    # A's second step was queued after B's task but runs first: A's job is older
    assert by_workflow["two"] == pytest.approx(0.200)
    assert by_workflow["one"] == pytest.approx(0.300 - 0.05)
    by_workflow = {j.workflow: j.latency_s for j in fifo.jobs}
    assert by_workflow["two"] == pytest.approx(0.300)
    assert by_workflow["one"] == pytest.approx(0.200 - 0.05)
    # compass without deadlines is the paper's FIFO too (docs/RESULTS.md, "Defaults chosen...")
    plain = run(workload, arrivals, workers=1, policy_options={"deadline_slack": None})
    assert {j.workflow: j.latency_s for j in plain.jobs} == by_workflow


def test_deadline_order_runs_a_short_jobs_task_before_a_longer_jobs_queued_earlier() -> None:
    # one worker busy until 100 ms; a 400 ms job arrives at 10 ms, a 100 ms one at 20 ms.
    # Deadlines (arrival + 4 x best time): 1.61 s and 0.42 s: the short job runs first
    workload = hand_workload(
        {"m": 100},
        {
            name: {"tasks": {"t": {"model": None, "exec_ms": ms, "output_kb": 1, "after": []}}}
            for name, ms in (("head", 100), ("long", 400), ("short", 100))
        },
    )
    arrivals = [Arrival(0.0, "head", 0), Arrival(0.01, "long", 1), Arrival(0.02, "short", 2)]
    by_deadline = {j.workflow: j.latency_s for j in run(workload, arrivals, workers=1).jobs}
    assert by_deadline["short"] == pytest.approx(0.200 - 0.02)
    assert by_deadline["long"] == pytest.approx(0.600 - 0.01)
    fifo = run(workload, arrivals, workers=1, policy_options={"deadline_slack": None})
    by_arrival = {j.workflow: j.latency_s for j in fifo.jobs}
    assert by_arrival["long"] == pytest.approx(0.500 - 0.01)
    assert by_arrival["short"] == pytest.approx(0.600 - 0.02)


def test_a_repeated_job_hits_the_cache_and_is_faster() -> None:
    result = run(DIAMOND, [Arrival(0.0, "diamond", 0), Arrival(5.0, "diamond", 0)], workers=1)
    first, second = result.jobs
    assert second.latency_s == pytest.approx(0.020 + 0.030 + 0.010 + 0.005)
    assert second.latency_s is not None and first.latency_s is not None
    assert second.latency_s < first.latency_s
    hits = {t.task: t.cache_hit for t in tasks_of(result, second.id).values()}
    assert hits == {"root": True, "left": True, "right": True, "join": None}
    assert result.summary()["cache_hit_rate"] == pytest.approx(3 / 6)


def test_a_small_cache_evicts_and_still_completes() -> None:
    # 700 MB holds one of a (200) + c (400), or b (300) + c, never all three
    arrivals = [Arrival(0.5 * i, "diamond", 0) for i in range(4)]
    result = run(DIAMOND, arrivals, workers=1, cache_bytes=700 * MB)
    assert result.summary()["completed"] == 4
    assert result.evictions > 0
    assert result.model_bytes_loaded > 900 * MB


def test_a_model_larger_than_every_cache_fails_the_job_with_a_reason() -> None:
    for policy in ("compass", "hash"):
        result = run(CHAIN, [Arrival(0.0, "chain", 0)], policy=policy, cache_bytes=500 * MB)
        (job,) = result.jobs
        assert job.latency_s is None
        assert "model" in job.error and "a" in job.error
        summary = result.summary()
        assert summary["completed"] == 0 and summary["failed"] == 1
        assert summary["p50_ms"] is None


@pytest.fixture(scope="module")
def paper() -> Workload:
    return load_workload(PAPER)


def paper_arrivals(paper: Workload, jobs: int, load: float = 1.0, seed: int = 0) -> list[Arrival]:
    return job_arrivals(
        list(paper.workflows),
        jobs,
        process="poisson",
        mean_interval_s=paper.arrivals.mean_interval_ms_per_client / 1000.0,
        load=load,
        seed=seed,
    )


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_completes_every_job(paper: Workload, policy: str) -> None:
    result = simulate(paper, SimSettings(workers=5, policy=policy), paper_arrivals(paper, 200))
    summary = result.summary()
    assert summary["completed"] == 200
    assert summary["failed"] == 0
    assert len(result.tasks) == sum(len(paper.workflows[j.workflow]) for j in result.jobs)
    # every task ran on a worker of the cluster, and every job ran all its tasks
    assert {t.worker for t in result.tasks} <= {f"w{i}" for i in range(5)}
    assert all(set(j.plan) == set(paper.workflows[j.workflow].order) for j in result.jobs)
    assert all(j.slowdown is not None and j.slowdown >= 0.99 for j in result.jobs)
    assert set(summary["utilization"]) == {f"w{i}" for i in range(5)}
    assert all(0.0 <= u <= 1.0 for u in summary["utilization"].values())
    assert max(summary["utilization"].values()) > 0.0


def test_summary_has_the_benchmark_keys(paper: Workload) -> None:
    summary = simulate(
        paper, SimSettings(workers=5, policy="compass"), paper_arrivals(paper, 50)
    ).summary()
    assert set(summary) == {
        "completed",
        "failed",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "ttfo_p50_ms",
        "ttfo_p99_ms",
        "median_slowdown",
        "mean_slowdown",
        "cache_hit_rate",
        "model_gb_loaded",
        "utilization",
        "breakdown_ms",
        "slowdown_by_workflow",
    }
    assert set(summary["breakdown_ms"]) == {"queue", "fetch", "transfer", "exec"}
    assert set(summary["slowdown_by_workflow"]) == set(paper.workflows)
    assert summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"]


@pytest.mark.parametrize("policy", ["compass", "random", "jsq"])
def test_same_seed_same_result(paper: Workload, policy: str) -> None:
    def once() -> SimResult:
        return simulate(
            paper, SimSettings(workers=5, policy=policy, seed=3), paper_arrivals(paper, 300, seed=3)
        )

    a, b = once(), once()
    assert a.jobs == b.jobs
    assert a.tasks == b.tasks
    assert a.summary() == b.summary()


def test_compass_beats_hash_at_the_papers_rate(paper: Workload) -> None:
    arrivals = paper_arrivals(paper, paper.arrivals.jobs)
    compass = simulate(paper, SimSettings(workers=5, policy="compass"), arrivals).summary()
    hashed = simulate(paper, SimSettings(workers=5, policy="hash"), arrivals).summary()
    assert compass["median_slowdown"] < hashed["median_slowdown"]
    assert compass["cache_hit_rate"] > hashed["cache_hit_rate"]


def test_staler_views_do_not_break_anything(paper: Workload) -> None:
    arrivals = paper_arrivals(paper, 200, load=1.5)
    for staleness in (0.0, 0.5):
        summary = simulate(
            paper, SimSettings(workers=5, policy="compass", staleness_s=staleness), arrivals
        ).summary()
        assert summary["completed"] == 200


def test_two_lanes_run_tasks_concurrently() -> None:
    arrivals = [Arrival(0.0, "diamond", 0), Arrival(0.0, "diamond", 0)]
    one = run(DIAMOND, arrivals, workers=1, lanes=1)
    two = run(DIAMOND, arrivals, workers=1, lanes=2)
    assert one.summary()["completed"] == two.summary()["completed"] == 2
    assert max(j.finish or 0 for j in two.jobs) < max(j.finish or 0 for j in one.jobs)


def test_a_load_waits_while_a_pinned_model_holds_the_slabs() -> None:
    # two lanes, 700 MB: y (400) cannot load while z (500) is loading or pinned by a running task
    workload = hand_workload(
        {"z": 500, "y": 400},
        {
            "zz": {"tasks": {"t": {"model": "z", "exec_ms": 100, "output_kb": 1, "after": []}}},
            "yy": {"tasks": {"t": {"model": "y", "exec_ms": 10, "output_kb": 1, "after": []}}},
        },
    )
    arrivals = [Arrival(0.0, "zz", 0), Arrival(0.0, "yy", 0)]
    result = run(workload, arrivals, workers=1, lanes=2, cache_bytes=700 * MB)
    first, second = result.jobs
    assert first.latency_s == pytest.approx(fetch(500) + 0.100)
    # y waits for z's task to finish and unpin it, then evicts it
    assert second.latency_s == pytest.approx(fetch(500) + 0.100 + fetch(400) + 0.010)
    assert tasks_of(result, second.id)["t"].fetch_s == pytest.approx(
        fetch(500) + 0.100 + fetch(400)
    )
    assert result.evictions == 1


HOSTED = hand_workload(
    {"m": 100},
    {
        "gpu": {"tasks": {"x": {"model": "m", "exec_ms": 200, "output_kb": 1, "after": []}}},
        "cpu": {"tasks": {"z": {"model": None, "exec_ms": 10, "output_kb": 1, "after": []}}},
    },
)


def test_host_lanes_run_model_less_tasks_beside_the_gpu_lane() -> None:
    # one worker: a 200 ms GPU task from 0, a 10 ms model-less one arriving at 50 ms
    arrivals = [Arrival(0.0, "gpu", 0), Arrival(0.05, "cpu", 1)]
    shared = run(HOSTED, arrivals, workers=1, warm=False)
    hosted = run(HOSTED, arrivals, workers=1, warm=False, host_lanes=1)
    gpu_done = fetch(100) + 0.200
    latency = {j.workflow: j.latency_s for j in shared.jobs}
    assert latency["cpu"] == pytest.approx(gpu_done + 0.010 - 0.05)  # waited for the lane
    assert latency["gpu"] == pytest.approx(gpu_done)
    latency = {j.workflow: j.latency_s for j in hosted.jobs}
    assert latency["cpu"] == pytest.approx(0.010)
    assert latency["gpu"] == pytest.approx(gpu_done)
    assert tasks_of(hosted, hosted.jobs[1].id)["z"].queue_s == 0.0


def test_model_less_tasks_queue_for_a_busy_host_lane() -> None:
    arrivals = [Arrival(0.0, "cpu", 0), Arrival(0.002, "cpu", 1), Arrival(0.004, "cpu", 2)]
    one = run(HOSTED, arrivals, workers=1, warm=False, host_lanes=1)
    two = run(HOSTED, arrivals, workers=1, warm=False, host_lanes=2)
    assert sorted(j.latency_s or 0.0 for j in one.jobs) == pytest.approx([0.010, 0.018, 0.026])
    assert sorted(j.latency_s or 0.0 for j in two.jobs) == pytest.approx([0.010, 0.010, 0.016])
    with pytest.raises(ConfigError, match="host_lanes"):
        run(HOSTED, arrivals, workers=1, host_lanes=-1)


def test_the_paper_s_prefetch_rule_only_fills_free_slabs() -> None:
    workload = load_workload(PAPER)
    arrivals = job_arrivals(
        list(workload.workflows), 300, process="poisson", mean_interval_s=0.5, seed=0
    )
    evicting = simulate(workload, SimSettings(workers=5, policy="jsq"), arrivals)
    free_only = simulate(
        workload, SimSettings(workers=5, policy="jsq", prefetch_evicts=False), arrivals
    )
    # jsq's caches are full: a prefetch that may not evict rarely finds room
    assert free_only.prefetches < evicting.prefetches / 2
    assert all(j.finish is not None for j in free_only.jobs)


def test_a_warm_start_meets_the_first_job_with_the_caches_warmed() -> None:
    # three models that all fit one cache: warming loads them before the first job arrives
    one_at_0 = [Arrival(0.0, "diamond", 0)]
    cold = run(DIAMOND, one_at_0, workers=1)
    warm = run(DIAMOND, one_at_0, workers=1, warm_start=True)
    (cold_job,), (warm_job,) = cold.jobs, warm.jobs
    assert cold_job.arrival == 0.0
    assert warm_job.arrival == pytest.approx(fetch(200) + fetch(300) + fetch(400))
    assert all(t.cache_hit in (True, None) for t in warm.tasks)  # every model was resident
    assert warm_job.latency_s == pytest.approx(0.020 + 0.030 + 0.010 + 0.005)
    assert cold_job.latency_s is not None and warm_job.latency_s is not None
    assert cold_job.latency_s > warm_job.latency_s


@pytest.mark.parametrize("host_lanes", [0, 1])
def test_a_job_adjusted_at_its_ingress_counts_the_model_loads_its_own_plan_started(
    paper: Workload, host_lanes: int
) -> None:
    # cold caches: detr (1.8 GB, 178 ms) ends well before depth (3.9 GB, 147 ms) on another
    # worker, so the join belongs with depth. The ingress counted its plan's tasks on the peers
    # until their heartbeats show them; had its own adjustment counted them too, depth would
    # have waited behind itself with its model already there, and ended first.
    result = run(
        paper,
        [Arrival(0.0, "object_detection", 0)],
        workers=3,
        warm=False,
        host_lanes=host_lanes,
        slab_bytes=64 * MB,
    )
    (job,) = result.jobs
    tasks = tasks_of(result, job.id)
    assert tasks["detr"].worker != tasks["depth"].worker
    assert not tasks["detr"].cache_hit and not tasks["depth"].cache_hit
    assert job.plan["aggregate"] == tasks["depth"].worker


def test_jobs_enter_at_their_clients_worker_or_are_dealt_over_every_worker(
    paper: Workload,
) -> None:
    arrivals = [Arrival(0.01 * k, "question_answer", 0) for k in range(6)]  # one client
    by_client = simulate(
        paper, SimSettings(workers=3, policy="compass", ingress="client"), arrivals
    )
    spread = simulate(paper, SimSettings(workers=3, policy="compass", ingress="spread"), arrivals)
    auto = simulate(paper, SimSettings(workers=3, policy="compass"), arrivals)

    def ingresses(result: SimResult) -> list[str]:
        return [j.id.split("-")[0] for j in sorted(result.jobs, key=lambda j: j.arrival)]

    assert ingresses(by_client) == ["w0"] * 6
    assert ingresses(spread) == ["w0", "w1", "w2"] * 2  # as a load balancer deals them
    assert ingresses(auto) == ingresses(by_client)  # a small cluster: each client its worker
    large = simulate(paper, SimSettings(workers=SPREAD_FROM, policy="compass"), arrivals)
    assert ingresses(large) == [f"w{k}" for k in range(6)]  # a large one: dealt
    with pytest.raises(ConfigError, match="unknown ingress mode 'nearest'"):
        simulate(paper, SimSettings(workers=3, policy="compass", ingress="nearest"), arrivals)
