"""The Ray Serve side of ``compass bench peers``: the workload deployed the way Ray Serve's
documentation recommends for multi-model pipelines, emulated as ``compass bench e2e`` emulates.

- **GPU**: one deployment of ``workers`` replicas, each standing for one GPU with one lane
  (``max_ongoing_requests=1``). Models are multiplexed (``@serve.multiplexed``): a replica keeps
  ``models_per_replica`` of them, evicting the least recently used, and Ray Serve's router sends
  a request to a replica that holds its model where one is free. A load waits the model's bytes
  over the workload's host-to-device bandwidth, a task its profiled time, both times the time
  scale: the same emulation as a compass worker's.
- **CPU**: model-less tasks go to a second deployment of ``workers`` replicas of one lane each.
- **Ingress**: one replica that, per job, calls every task through a handle in topological
  order, passing the upstream tasks' responses as arguments; Ray Serve resolves them (object
  references, not copies through the ingress) and routes the call once they are ready, so
  parallel branches start at once. Outputs are arrays of the declared sizes.

Ray Serve's router timings are real seconds (its multiplexed-model matching timeout, its retry
backoff); they are scaled by the time scale, as compass's heartbeat is, so that both systems
live in the workload's time. Per task, replicas report queue (inputs ready to start), load and
run times to a tally actor; :func:`summarize` turns them into the keys of
:func:`compass._bench.e2e.summarize`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compass.errors import ConfigError
from compass.sim.arrivals import Arrival
from compass.workflow.spec import Workload

from . import e2e

__all__ = [
    "RayServeConfig",
    "models_per_replica",
    "ray_missing",
    "ray_session",
    "run_chain",
    "run_noop",
    "run_ray",
]

#: the hint printed where ray is not installed
INSTALL_HINT = "the Ray Serve side needs ray: pip install 'compass[bench]' (or 'ray[serve]')"

#: Ray Serve's router timings in real seconds (ray/serve/_private/constants.py), scaled by the
#: time scale before Ray starts
ROUTER_TIMINGS_S = {
    "RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S": 1.0,
    "RAY_SERVE_ROUTER_RETRY_INITIAL_BACKOFF_S": 0.025,
    "RAY_SERVE_ROUTER_RETRY_MAX_BACKOFF_S": 0.5,
}

#: the application's name on the Serve instance
APP = "compass-peers"


def ray_missing() -> str | None:
    """Why the Ray Serve side cannot run here (the install hint), or None when it can."""
    # found, not imported: importing ray.serve warns (pydantic), and tests treat warnings as errors
    try:
        found = importlib.util.find_spec("ray.serve") is not None
    except ImportError:  # no ray at all
        found = False
    return None if found else INSTALL_HINT


@dataclass(frozen=True, slots=True)
class RayServeConfig:
    """How the workload is deployed on Ray Serve (see the module docstring)."""

    #: models a GPU replica keeps (``max_num_models_per_replica``); None: as many as always fit
    #: the cache (:func:`models_per_replica`)
    models_per_replica: int | None = None
    #: lanes per GPU replica (``max_ongoing_requests``)
    gpu_lanes: int = 1
    #: replicas of the CPU deployment per worker, one lane each
    cpu_replicas_per_worker: int = 1
    #: real seconds to wait for the deployment to come up
    deploy_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if self.models_per_replica is not None and self.models_per_replica < 1:
            raise ConfigError(f"models per replica must be >= 1, got {self.models_per_replica}")
        if self.gpu_lanes < 1 or self.cpu_replicas_per_worker < 1:
            raise ConfigError("Ray Serve needs at least one GPU lane and one CPU replica")


def models_per_replica(workload: Workload) -> int:
    """The most models a replica may keep so that any of them fit its cache together: the
    count of the largest models whose bytes fit ``gpu_memory_bytes`` (Ray Serve counts models,
    not bytes; a count that can overflow a real GPU would fail there). At least one."""
    budget = workload.cluster.gpu_memory_bytes
    count = 0
    for size in sorted(workload.models.values(), reverse=True):
        if size > budget:
            break
        budget -= size
        count += 1
    return max(1, count)


# ---- what the replicas run: plain data, so that replicas import nothing of compass -------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """The workload as the replicas need it, in real seconds."""

    #: workflow -> [(task, model or None, predecessors)] in topological order
    dags: Mapping[str, Sequence[tuple[str, str | None, tuple[str, ...]]]]
    #: workflow -> its sinks, whose outputs are the job's result
    sinks: Mapping[str, tuple[str, ...]]
    #: (workflow, task) -> (run seconds, output bytes)
    tasks: Mapping[tuple[str, str], tuple[float, int]]
    #: model -> (load seconds, bytes)
    models: Mapping[str, tuple[float, int]]


def _plan(workload: Workload, time_scale: float) -> _Plan:
    h2d = workload.cluster.h2d_bytes_per_s
    return _Plan(
        dags={
            name: [(t, wf.tasks[t].model, tuple(wf.tasks[t].after)) for t in wf.order]
            for name, wf in workload.workflows.items()
        },
        sinks={name: tuple(wf.sinks) for name, wf in workload.workflows.items()},
        tasks={
            (name, t): (task.profile.exec_ms / 1000.0 * time_scale, task.profile.output_bytes)
            for name, wf in workload.workflows.items()
            for t, task in wf.tasks.items()
        },
        models={m: (size / h2d * time_scale, size) for m, size in workload.models.items()},
    )


def _new_stats() -> dict[str, float]:
    return {
        "tasks_run": 0,
        "cache_hits": 0,
        "cache_misses": 0,
        "queue_s": 0.0,
        "fetch_s": 0.0,
        "transfer_s": 0.0,
        "exec_s": 0.0,
        "moves": 0,
        "bytes_loaded": 0,
    }


def _build_app(plan: _Plan, workers: int, config: RayServeConfig, keep: int, tally: Any) -> Any:
    """The Serve application: ingress -> GPU and CPU deployments. Classes are made here since
    ``@serve.multiplexed`` takes its model count when the class is defined."""
    from ray import serve

    class Gpu:
        def __init__(self) -> None:
            self.name = f"gpu-{serve.get_replica_context().replica_id.unique_id}"
            self.stats = _new_stats()
            self.loaded = 0.0

        @serve.multiplexed(max_num_models_per_replica=keep)
        async def model(self, model: str) -> str:
            seconds, size = plan.models[model]
            await asyncio.sleep(seconds)
            self.stats["cache_misses"] += 1
            self.stats["bytes_loaded"] += size
            self.loaded += seconds
            return model

        async def __call__(self, workflow: str, task: str, *inputs: tuple[float, Any]) -> Any:
            start = time.time()
            ready = max(t for t, _ in inputs)
            before = self.loaded
            await self.model(serve.get_multiplexed_model_id())
            if self.loaded == before:
                self.stats["cache_hits"] += 1
            return await _run(self, plan, workflow, task, start, ready, tally)

    class Cpu:
        def __init__(self) -> None:
            self.name = f"cpu-{serve.get_replica_context().replica_id.unique_id}"
            self.stats = _new_stats()
            self.loaded = 0.0

        async def __call__(self, workflow: str, task: str, *inputs: tuple[float, Any]) -> Any:
            start = time.time()
            return await _run(self, plan, workflow, task, start, max(t for t, _ in inputs), tally)

    class Ingress:
        def __init__(self, gpu: Any, cpu: Any) -> None:
            self.cpu = cpu
            # one handle per model, made once: the router keeps per-handle state
            self.by_model = {m: gpu.options(multiplexed_model_id=m) for m in plan.models}

        async def __call__(self, workflow: str, payload: Any) -> list[Any]:
            responses: dict[str, Any] = {}
            job_input = (time.time(), payload)
            for task, model, after in plan.dags[workflow]:
                handle = self.cpu if model is None else self.by_model[model]
                inputs = [responses[t] for t in after] or [job_input]
                responses[task] = handle.remote(workflow, task, *inputs)
            return [(await responses[t])[1] for t in plan.sinks[workflow]]

    # applied as calls, not as class decorators, so that mypy sees what they return
    free = {"num_cpus": 0}  # placement is by replica count: Ray's CPU count is no limit here
    gpu = serve.deployment(
        num_replicas=workers, max_ongoing_requests=config.gpu_lanes, ray_actor_options=free
    )(Gpu)
    cpu = serve.deployment(
        num_replicas=workers * config.cpu_replicas_per_worker,
        max_ongoing_requests=1,
        ray_actor_options=free,
    )(Cpu)
    ingress = serve.deployment(max_ongoing_requests=100_000, ray_actor_options=free)(Ingress)
    return ingress.bind(gpu.bind(), cpu.bind())


async def _run(
    replica: Any, plan: _Plan, workflow: str, task: str, start: float, ready: float, tally: Any
) -> tuple[float, Any]:
    """Run ``task`` emulated on ``replica`` and report its stats; (finish time, output)."""
    seconds, out_bytes = plan.tasks[(workflow, task)]
    loaded = time.time()
    await asyncio.sleep(seconds)
    stats = replica.stats
    stats["tasks_run"] += 1
    stats["queue_s"] += max(0.0, start - ready)
    stats["fetch_s"] += loaded - start
    stats["exec_s"] += time.time() - loaded
    tally.put.remote(replica.name, dict(stats))
    return time.time(), np.zeros(out_bytes, dtype=np.uint8)


class _Tally:
    """Each replica's latest cumulative stats (a Ray actor)."""

    def __init__(self) -> None:
        self.stats: dict[str, dict[str, float]] = {}

    def put(self, name: str, stats: dict[str, float]) -> None:
        self.stats[name] = stats

    def get(self) -> dict[str, dict[str, float]]:
        return self.stats


# ---- the driver -----------------------------------------------------------------------------


@contextlib.contextmanager
def ray_session(time_scale: float) -> Iterator[None]:
    """A local Ray instance with Serve started (no HTTP proxy), its router timings scaled by
    ``time_scale``; shut down on exit, whatever happened."""
    import ray
    from ray import serve

    env = {key: str(value * time_scale) for key, value in ROUTER_TIMINGS_S.items()}
    env["RAY_SERVE_LOG_TO_STDERR"] = "0"
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the driver's router reads them when ray.serve is imported
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # one INFO line per deploy
    try:
        ray.init(
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            configure_logging=False,
            object_store_memory=1 << 30,
            runtime_env={"env_vars": env},
        )
        try:
            serve.start(proxy_location="Disabled")
            yield
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _deployed(
    workload: Workload, workers: int, time_scale: float, config: RayServeConfig
) -> Iterator[tuple[Any, Any]]:
    """The application on ``workers`` GPU replicas (inside :func:`ray_session`): (ingress
    handle, tally actor); deleted on exit so the next run starts cold."""
    import ray
    from ray import serve

    keep = config.models_per_replica or models_per_replica(workload)
    tally = ray.remote(num_cpus=0)(_Tally).remote()
    app = _build_app(_plan(workload, time_scale), workers, config, keep, tally)
    try:
        handle = serve.run(app, name=APP, route_prefix=None, blocking=False)
        yield handle, tally
    finally:
        with contextlib.suppress(Exception):
            serve.delete(APP)
        ray.kill(tally)


async def _tally(tally: Any) -> dict[str, dict[str, float]]:
    stats: dict[str, dict[str, float]] = await tally.get.remote()
    return stats


async def _warm(handle: Any, workload: Workload, workers: int) -> None:
    """Each workflow ``workers`` times at once, twice: a deployment meets traffic having served
    some (compass's clusters start from caches the workers warmed, :func:`e2e.settled`)."""
    for _ in range(2):
        async with asyncio.TaskGroup() as group:
            for workflow in workload.workflows:
                payload = e2e._input_payload(workload, workflow)["data"]
                for _ in range(workers):
                    group.create_task(_call(handle, workflow, payload))


async def _call(handle: Any, workflow: str, payload: Any) -> Any:
    return await handle.remote(workflow, payload)


async def run_ray(
    config: e2e.E2EConfig,
    workload: Workload,
    arrivals: Sequence[Arrival],
    *,
    ray_config: RayServeConfig = RayServeConfig(),
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Replay ``arrivals`` on a fresh Ray Serve application (inside :func:`ray_session`); the
    summary of the run, with the keys of :func:`compass._bench.e2e.run_policy`'s."""
    n = workers or config.workers
    scale = config.time_scale
    with _deployed(workload, n, scale, ray_config) as (handle, tally):
        await _warm(handle, workload, n)
        before = await _tally(tally)
        payloads = {wf: e2e._input_payload(workload, wf)["data"] for wf in workload.workflows}

        async def submit(arrival: Arrival) -> None:
            await handle.remote(arrival.workflow, payloads[arrival.workflow])

        # any error a job raises counts it failed, as on compass
        latencies, elapsed = await e2e.replay(arrivals, scale, submit, (Exception,), progress)
        await asyncio.sleep(0.05)  # the last tasks' fire-and-forget reports reach the tally
        after = await _tally(tally)
    keep = ray_config.models_per_replica or models_per_replica(workload)
    statuses = [_status(name, after[name], before.get(name), keep, scale) for name in sorted(after)]
    summary = e2e.summarize(workload, latencies, statuses, elapsed)
    e2e.with_latencies(summary, workload, latencies)
    summary["models_per_replica"] = keep
    return summary


def _status(
    name: str,
    after: Mapping[str, float],
    before: Mapping[str, float] | None,
    keep: int,
    scale: float,
) -> dict[str, Any]:
    """A replica's stats over the measured jobs, shaped as a compass worker's status (the
    fields :func:`compass._bench.e2e.summarize` reads), seconds in the workload's time.
    Evictions: a multiplexed replica evicts exactly once per load beyond its ``keep``-th."""
    base = before or _new_stats()
    delta = {key: after[key] - base[key] for key in after}
    for key in ("queue_s", "fetch_s", "transfer_s", "exec_s"):
        delta[key] /= scale
    loads_after, loads_before = after["cache_misses"], base["cache_misses"]
    evictions = max(0.0, loads_after - keep) - max(0.0, loads_before - keep)
    return {
        "name": name,
        "stats": delta,
        "cache": {"stats": {"bytes_loaded": delta["bytes_loaded"], "evictions": evictions}},
    }


# ---- overheads: a one-task no-op job and a 100-task chain, no emulated time ------------------


def _overhead_workload(tasks: int) -> Workload:
    """A workflow of ``tasks`` model-less no-op tasks in a chain (one task: the no-op job)."""
    from compass.workflow.spec import parse_workload

    chain = {
        f"t{i}": {"model": None, "exec_ms": 0.0, "output_kb": 0.008, "after": [f"t{i - 1}"]}
        for i in range(1, tasks)
    }
    chain["t0"] = {
        "model": None,
        "exec_ms": 0.0,
        "input_kb": 0.008,
        "output_kb": 0.008,
        "after": [],
    }
    spec = {
        "name": f"chain_{tasks}",
        "cluster": {"workers": 1, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {},
        "workflows": {"chain": {"tasks": chain}},
        "arrivals": {"mean_interval_ms_per_client": 1000, "jobs": 1},
    }  # fmt: skip
    return parse_workload(spec)


async def _sequential(tasks: int, workers: int, jobs: int) -> list[float]:
    """Seconds per job of ``jobs`` sequential ``tasks``-task chain jobs (after a warm-up)."""
    workload = _overhead_workload(tasks)
    payload = np.zeros(8, dtype=np.uint8)
    with _deployed(workload, workers, 1.0, RayServeConfig()) as (handle, _):
        for _ in range(min(jobs, 20)):
            await handle.remote("chain", payload)
        seconds = []
        for _ in range(jobs):
            t0 = time.perf_counter()
            await handle.remote("chain", payload)
            seconds.append(time.perf_counter() - t0)
    return seconds


async def run_noop(jobs: int) -> dict[str, float]:
    """A one-task no-op job on Ray Serve: ingress, one CPU replica call, back (microseconds)."""
    us = np.asarray(await _sequential(1, 1, jobs)) * 1e6
    return {
        "jobs": jobs,
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
    }


async def run_chain(tasks: int, workers: int, repeats: int) -> dict[str, float]:
    """A ``tasks``-task chain of no-ops on ``workers`` CPU replicas (Ray Serve routes each
    hop; it does not alternate on purpose): the best and median of ``repeats`` runs."""
    seconds = await _sequential(tasks, workers, repeats)
    return {
        "tasks": tasks,
        "best_ms": min(seconds) * 1000.0,
        "median_ms": float(np.median(seconds)) * 1000.0,
        "per_task_us": min(seconds) / tasks * 1e6,
    }
