"""Cache micro-benchmark: slab allocation and eviction-decision cost with 100 models resident.

Everything measured here is the sans-IO core (:class:`SlabPool`, :class:`CacheCore`) that both
the worker and the simulator run, on a pool shaped like a large GPU: 64 MiB slabs, 100 models of
1 to 12 slabs resident, the free space scattered. Each operation is timed on its own with
``perf_counter_ns``; the table gives microseconds per operation, p50 and p99.

Run: ``compass bench cache [--quick] [--json results/cache.json]`` or
``python -m compass._bench.cache``.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.cache.slab import SlabLayout

from .report import machine, print_table, write_json

__all__ = ["run"]

MiB = 1 << 20
SLAB = 64 * MiB
RESIDENT = 100
SEED = 7


def _percentiles(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    count = len(ordered)
    return {
        "n": count,
        "p50_us": ordered[count // 2] / 1e3,
        "p99_us": ordered[min(count - 1, int(count * 0.99))] / 1e3,
        "mean_us": sum(ordered) / count / 1e3,
    }


def _time(
    step: Callable[[], None], repeat: int, reset: Callable[[], None] | None = None
) -> list[int]:
    samples: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(repeat):
        started = clock()
        step()
        samples.append(clock() - started)
        if reset is not None:
            reset()
    return samples


def _resident_core(rng: random.Random) -> tuple[CacheCore, list[str]]:
    """100 resident models of 1-12 slabs in a pool with 10 models' worth of scattered holes."""
    sizes = {f"m{i:03d}": rng.randint(1, 12) * SLAB for i in range(RESIDENT + 10)}
    total = sum(sizes.values())
    core = CacheCore(SlabPool(total, SLAB), sizes)
    names = list(sizes)
    for name in names:
        plan = core.plan_load(name, [])
        assert plan is not None
        assert not plan.evict
        core.begin_load(name, plan)
        core.finish_load(name)
    for name in rng.sample(names, 10):
        core.evict(name)
    resident = sorted(core.resident())
    assert len(resident) == RESIDENT
    return core, resident


def _bench_pool(rng: random.Random, repeat: int) -> dict[str, dict[str, float]]:
    core, _ = _resident_core(rng)
    pool = core.pool
    results: dict[str, dict[str, float]] = {}
    for label, request in (
        ("alloc 1 slab", 1),
        ("alloc 8 slabs", 8),
        ("alloc run of 3 + 2 slabs", SlabLayout.pack([("w", 3 * SLAB), ("b", SLAB)], SLAB)),
    ):
        handles: list[Any] = []

        def alloc(request: Any = request, handles: list[Any] = handles) -> None:
            handles.append(pool.alloc(request))

        def give_back(handles: list[Any] = handles) -> None:
            handle = handles.pop()
            if handle is not None:
                pool.free(handle)

        alloc_ns = _time(alloc, repeat, reset=give_back)
        frees: list[int] = []
        for _ in range(repeat):
            handle = pool.alloc(request)
            if handle is None:
                raise RuntimeError(f"benchmark pool has no room for {label}")
            started = time.perf_counter_ns()
            pool.free(handle)
            frees.append(time.perf_counter_ns() - started)
        results[label] = _percentiles(alloc_ns)
        results[label.replace("alloc", "free", 1)] = _percentiles(frees)
    pool.validate()
    return results


def _bench_decisions(rng: random.Random, repeat: int) -> dict[str, dict[str, float]]:
    core, resident = _resident_core(rng)
    # both incoming models need 24 slabs more than are free, so every plan must evict; the
    # second also needs two runs (12 and 10 slabs) that the scattered holes cannot hold
    need = core.pool.free_slabs + 24
    core.add_model("incoming", need * SLAB)
    runs = [("w", 12 * SLAB), ("x", 10 * SLAB)]
    singles = [(f"s{i}", SLAB) for i in range(need - 22)]
    core.add_model("incoming_run", SlabLayout.pack(runs + singles, SLAB))
    queues = [rng.sample(resident, 30) for _ in range(64)]
    results: dict[str, dict[str, float]] = {}
    for label, name in (
        (f"plan eviction ({need} slabs)", "incoming"),
        (f"plan eviction ({need} slabs, runs)", "incoming_run"),
    ):
        samples: list[int] = []
        victims = over = 0
        for i in range(repeat):
            queue = queues[i % len(queues)]
            started = time.perf_counter_ns()
            plan = core.plan_load(name, queue)
            samples.append(time.perf_counter_ns() - started)
            if plan is None or not plan.evict:
                raise RuntimeError(f"{name} should need victims")
            victims += len(plan.evict)
            over += plan.over_eviction
        results[label] = _percentiles(samples) | {
            "victims_per_plan": victims / repeat,
            "over_eviction_share": over / repeat,
        }

    samples = []
    for i in range(repeat):
        queue = ["incoming", *queues[i % len(queues)][:2]]
        started = time.perf_counter_ns()
        core.prefetch_candidate(queue, 3)
        samples.append(time.perf_counter_ns() - started)
    results["prefetch candidate (depth 3)"] = _percentiles(samples)

    # a whole miss: plan, evict, allocate, finish; then put the victims back untimed
    samples = []
    for i in range(repeat // 4 or 1):
        queue = queues[i % len(queues)]
        started = time.perf_counter_ns()
        plan = core.plan_load("incoming", queue)
        assert plan is not None
        core.begin_load("incoming", plan)
        core.finish_load("incoming")
        samples.append(time.perf_counter_ns() - started)
        core.evict("incoming")
        for victim in plan.evict:
            refill = core.plan_load(victim, [])
            assert refill is not None
            assert not refill.evict
            core.begin_load(victim, refill)
            core.finish_load(victim)
    results["miss: plan + evict + alloc"] = _percentiles(samples)
    core.validate()
    return results


def run(json_path: str | None = None, quick: bool = False) -> dict[str, Any]:
    """Time the pool and the eviction decisions; print a table, write JSON to ``json_path``."""
    repeat = 400 if quick else 4000
    rng = random.Random(SEED)
    operations = _bench_pool(rng, repeat) | _bench_decisions(rng, repeat)
    result: dict[str, Any] = {
        "benchmark": "cache",
        "machine": machine(),
        "slab_bytes": SLAB,
        "resident_models": RESIDENT,
        "repeat": repeat,
        "operations": operations,
    }
    print_table(
        f"cache core: {RESIDENT} models resident, {SLAB // MiB} MiB slabs (microseconds per op)",
        ["operation", "n", "p50 us", "p99 us", "mean us"],
        [
            [label, int(row["n"]), row["p50_us"], row["p99_us"], row["mean_us"]]
            for label, row in operations.items()
        ],
    )
    write_json(json_path, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", dest="json_path", default=None, help="write results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    run(json_path=args.json_path, quick=args.quick)


if __name__ == "__main__":
    main()
