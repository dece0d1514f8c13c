"""Running one worker as a process: build its app and profiles, serve until a signal."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from compass.app import App, load_app
from compass.cache.backend import resolve_cache
from compass.config import WorkerConfig
from compass.errors import CompassError, ConfigError
from compass.wire.transport import new_event_loop
from compass.worker.server import Worker
from compass.workflow.profile import Profiles
from compass.workflow.spec import load_workload

if TYPE_CHECKING:
    from compass.front.server import FrontDoor

__all__ = ["build_worker", "open_front_door", "run_worker"]

log = logging.getLogger("compass.worker")

# First guesses for a real (non-emulated) worker, refined by measurement as it runs.
REAL_H2D_GUESS = 10e9
REAL_NET_GUESS = 1e9


def build_worker(config: WorkerConfig) -> Worker:
    """The worker ``config`` describes: an app module (real models) or a workload (emulated)."""
    if (config.app is None) == (config.workload is None):
        raise ConfigError("a worker needs exactly one of --app MODULE or --workload SPEC.json")
    if config.workload is not None:
        workload = load_workload(config.workload)
        app = App.from_workload(workload)
        profiles = Profiles.from_workload(workload)
        if not config.emulate:
            config = replace(config, emulate=True)
        cache = config.cache.resolved(workload.cluster.gpu_memory_bytes)
        if cache.backend == "auto":
            cache = replace(cache, backend="capacity")
        config = replace(config, cache=cache)
    else:
        assert config.app is not None
        app = load_app(config.app)
        profiles = Profiles(
            h2d_bytes_per_s=REAL_H2D_GUESS,
            net_bytes_per_s=REAL_NET_GUESS,
            model_sizes={name: model.size_bytes for name, model in app.models.items()},
            workflows=app.workflows.values(),
        )
    config = replace(config, cache=resolve_cache(config.cache))
    app.validate(config.cache.capacity)
    return Worker(config, app, profiles)


async def serve_worker(config: WorkerConfig) -> int:
    worker = build_worker(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, worker.stop)
    await worker.start()
    front = await open_front_door(worker)
    # the first line on stdout is the contract with `compass up` and scripts
    print(f"compass worker listening on {worker.address}", flush=True)
    if front is not None:
        print(f"compass front door listening on {front.address}", flush=True)
    log.info("worker %s serving on %s (policy %s)", worker.name, worker.address, worker.policy.name)
    try:
        await worker.wait()
        # SIGTERM or Ctrl-C: drain first (a second signal cuts it short); a worker that failed
        # stops at once
        if worker.failure is None and config.drain_timeout_s > 0:
            await worker.drain(config.drain_timeout_s)
    finally:
        if front is not None:  # after the drain: it answered 503 while the worker drained
            await front.aclose()
        await worker.aclose()
        log.info("worker %s stopped", worker.name)
    return 0 if worker.failure is None else 1


async def open_front_door(worker: Worker) -> FrontDoor | None:
    """The worker's HTTP front door, serving, where ``--http-port`` asks for one."""
    if worker.config.http_port is None:
        return None
    from compass.front.server import FrontDoor, front_options  # aiohttp: only when asked

    door = FrontDoor(worker, front_options(worker.config))
    try:
        await door.start()
    except BaseException:
        await worker.aclose()
        raise
    worker.metrics.http_address = door.address  # what compass status and the dashboard show
    worker.metrics.collectors.append(door.metrics)  # its requests in the worker's scrape
    return door


def run_worker(config: WorkerConfig) -> int:
    """Serve until SIGINT or SIGTERM, then drain (``config.drain_timeout_s``) and stop;
    returns the process exit code."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(serve_worker(config))
    except CompassError as exc:  # bad flags, a bad app or workload, a model too large
        print(f"compass worker: {exc}", file=sys.stderr)
        return 2
    finally:
        loop.close()
        # the worker has stopped: a SIGTERM arriving while the interpreter exits asks for what
        # is already happening, and must not turn a clean exit into death by signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
