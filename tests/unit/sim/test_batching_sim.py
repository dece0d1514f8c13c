"""Batches in the simulator, through the shared worker core: hand-computed latencies with
batching on and off, and every policy gets it."""

from __future__ import annotations

import pytest

from compass.sim import Arrival, simulate
from compass.sim.settings import SimSettings
from compass.workflow import Workload, parse_workload
from compass.workflow.batching import apply_batching

MB = 1_000_000


def one_task(batch: dict[str, float]) -> Workload:
    return parse_workload(
        {
            "name": "batch",
            "cluster": {
                "workers": 1,
                "gpu_memory_mb": 1000,
                "h2d_gbps": 10,
                "d2h_gbps": 10,
                "net_gbps": 1,
                "net_fixed_us": 0,
            },
            "models": {"m": {"size_mb": 100}},
            "workflows": {
                "w": {"tasks": {"t": {"model": "m", "exec_ms": 100, "output_kb": 0, **batch}}}
            },
        }
    )


# one job at 0 (its model loads in 10 ms, it runs 10..110 ms), three more at 20, 30, 40 ms
ARRIVALS = [
    Arrival(0.0, "w", 0),
    Arrival(0.02, "w", 0),
    Arrival(0.03, "w", 0),
    Arrival(0.04, "w", 0),
]


def latencies(workload: Workload, policy: str = "compass") -> list[float]:
    result = simulate(workload, SimSettings(workers=1, policy=policy, slab_bytes=MB), ARRIVALS)
    return [j.latency_s or -1.0 for j in sorted(result.jobs, key=lambda j: j.arrival)]


@pytest.mark.parametrize("policy", ["compass", "jsq", "hash", "jit", "heft"])
def test_queued_tasks_of_one_model_run_as_one_batch_under_every_policy(policy: str) -> None:
    workload = one_task({"batch": 4, "batch_item": 0.5})
    # the three queued jobs run together from 110 ms for 100 * (1 + 0.5 * 2) ms
    assert latencies(workload, policy) == pytest.approx([0.110, 0.290, 0.280, 0.270])
    result = simulate(workload, SimSettings(workers=1, policy=policy, slab_bytes=MB), ARRIVALS)
    assert sorted(t.batch for t in result.tasks) == [1, 3, 3, 3]


def test_with_batching_off_or_no_gain_they_run_one_after_another() -> None:
    sequential = [0.110, 0.190, 0.280, 0.370]
    off = apply_batching(one_task({"batch": 4, "batch_item": 0.5}), batching=False)
    assert latencies(off) == pytest.approx(sequential)
    assert latencies(one_task({"batch": 4})) == pytest.approx(sequential)  # no gain


def test_a_batch_never_exceeds_its_largest_size() -> None:
    workload = one_task({"batch": 2, "batch_item": 0.5})
    # 110..260 ms: the jobs of 20 and 30 ms; 260..360: the job of 40 ms
    assert latencies(workload) == pytest.approx([0.110, 0.240, 0.230, 0.320])
