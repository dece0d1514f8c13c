"""One source of configuration: the command line, the worker, its core and the simulator take
their defaults from the config dataclasses (compass/config.py), and differ only where
``SIM_DIFFERS`` says why."""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

import pytest
import typer

import compass.worker.process
from compass._cli import sim as sim_cli
from compass._cli import worker as worker_cli
from compass._cli.main import main
from compass.config import DEFAULT_PORT, SIM_DIFFERS, SIM_WORKER, WorkerConfig
from compass.core.lanes import Lanes
from compass.core.options import CoreOptions, core_options
from compass.observe.tracing import Tracer
from compass.sim.capacity import SimRuns
from compass.sim.compare import SimConfig
from compass.sim.settings import SimSettings
from compass.workflow.spec import Workload, load_workload

PAPER = Path(__file__).resolve().parents[2] / "bench" / "workloads" / "paper.json"


def flat(config: Any, prefix: str = "") -> dict[str, Any]:
    """A config's fields, nested ones as ``cache.slab_bytes``."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(flat(value, f"{prefix}{field.name}."))
        else:
            out[f"{prefix}{field.name}"] = value
    return out


def differs(a: Any, b: Any) -> set[str]:
    left, right = flat(a), flat(b)
    return {name for name in left if left[name] != right[name]}


@pytest.fixture
def paper() -> Workload:
    return load_workload(PAPER)


@pytest.fixture
def no_compass_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags only: no COMPASS_* variable of the environment running the tests."""
    for name in list(os.environ):
        if name.startswith("COMPASS_"):
            monkeypatch.delenv(name)


def started_config(monkeypatch: pytest.MonkeyPatch, *flags: str) -> WorkerConfig:
    """The config ``compass worker start FLAGS`` would run a worker with (the worker is not
    started: its runner is swapped for one that keeps the config)."""
    seen: list[WorkerConfig] = []

    def keep(config: WorkerConfig) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(compass.worker.process, "run_worker", keep)
    monkeypatch.setattr(worker_cli, "configure_logging", lambda *a, **k: None)
    with pytest.raises(SystemExit) as done:
        main(["worker", "start", *flags])
    assert done.value.code == 0
    (config,) = seen
    return config


@pytest.mark.usefixtures("no_compass_env")
def test_worker_start_without_flags_runs_the_config_dataclass_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = started_config(monkeypatch)
    # the one difference on purpose: a worker started from the command line listens on the
    # well-known port, one made in Python (WorkerConfig()) on a free one
    assert differs(config, WorkerConfig()) == {"port"}
    assert config.port == DEFAULT_PORT


@pytest.mark.usefixtures("no_compass_env")
def test_worker_start_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config = started_config(
        monkeypatch, "--host-lanes", "0", "--max-stuck-tasks", "7", "--trace-keep", "3",
        "--slab-mb", "32", "--holders", "0", "--probe-period-ms", "300",
    )  # fmt: skip
    assert differs(config, WorkerConfig()) == {
        "port", "host_lanes", "max_stuck_tasks", "trace_keep", "cache.slab_bytes",
        "sched.holders", "swim.probe_period_ms",
    }  # fmt: skip
    assert (config.host_lanes, config.max_stuck_tasks, config.trace_keep) == (0, 7, 3)


def test_the_core_s_defaults_are_the_worker_s() -> None:
    assert CoreOptions() == core_options(WorkerConfig())
    # lanes made alone share the GPU lanes (host_lanes=0), but for that take the core's
    lanes = inspect.signature(Lanes).parameters
    defaults = CoreOptions()
    for name in ("prefetch_depth", "prefetch_evicts", "max_stuck"):
        assert lanes[name].default == getattr(defaults, name), name
    assert inspect.signature(Tracer).parameters["keep"].default == WorkerConfig().trace_keep


def test_a_simulated_worker_differs_from_a_worker_only_where_sim_differs_says() -> None:
    assert differs(SIM_WORKER, WorkerConfig()) == set(SIM_DIFFERS)
    assert all(len(why) > 20 for why in SIM_DIFFERS.values())  # each difference says why


def test_the_simulator_s_settings_default_to_its_worker_s(paper: Workload) -> None:
    settings = SimSettings(workers=3, policy="compass")
    config = settings.worker_config(paper)
    # a worker resolves an unset cache to an emulated workload's GPU memory; so does the sim
    assert differs(config, SIM_WORKER) == {"cache.capacity_bytes"}
    assert config.cache.capacity_bytes == paper.cluster.gpu_memory_bytes
    assert settings.heartbeat_s * 1000.0 == SIM_WORKER.sched.heartbeat_ms
    assert (settings.view, settings.candidates, settings.holders) == (
        SIM_WORKER.sched.view, SIM_WORKER.sched.candidates, SIM_WORKER.sched.holders,
    )  # fmt: skip
    # what `compass sim` and its capacity runs default to is the simulator's
    for config_default in (SimConfig(workload="x", workers=3, policies=("compass",)), SimRuns(3)):
        assert config_default.heartbeat_ms == SIM_WORKER.sched.heartbeat_ms
        assert config_default.host_lanes == settings.host_lanes
    shown = typer.main.get_command(sim_cli.commands).make_context("sim", [])
    assert shown.params["heartbeat_ms"] == SIM_WORKER.sched.heartbeat_ms
    assert shown.params["host_lanes"] == settings.host_lanes


def test_no_settings_switch_off_prefetching_and_its_warming(paper: Workload) -> None:
    config = SimSettings(workers=3, policy="compass", prefetch=False).worker_config(paper)
    options = core_options(config)
    assert (options.prefetch_depth, options.warm, options.learn) == (0, False, False)
    assert options.host_lanes == 0 and options.max_jobs == SIM_WORKER.max_jobs
