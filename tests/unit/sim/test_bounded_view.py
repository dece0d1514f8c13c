"""A bounded view in the simulator: each planner sees, for a job, only its candidates
(compass.sched.candidates), built over them alone, as it has heard of them
(compass.sim.heard); the mesh (every worker) is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from compass.errors import ConfigError
from compass.sched.view import Placement, ViewSnapshot
from compass.sim import Arrival, SimResult, job_arrivals, simulate
from compass.sim.compare import SimConfig
from compass.sim.modes import DEFAULT_CANDIDATES, DEFAULT_HOLDERS
from compass.sim.settings import SimSettings
from compass.sim.state import ClusterState
from compass.workflow import Workload, load_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
HB = 0.010
GB = 1_000_000_000


@pytest.fixture(scope="module")
def paper() -> Workload:
    return load_workload(PAPER)


def arrivals(paper: Workload, jobs: int, load: float, seed: int = 1) -> list[Arrival]:
    return job_arrivals(
        list(paper.workflows), jobs, process="poisson", mean_interval_s=2.0, load=load, seed=seed
    )


def busy_state() -> ClusterState:
    """Six workers with queues, running tasks, models loaded and batches, at 0.05 s."""
    state = ClusterState(
        tuple(f"w{i}" for i in range(6)),
        ["m", "n"],
        [10 * GB] * 6,
        lanes=1,
        heartbeat_s=HB,
        staleness_s=HB,
        settle_s=2 * HB,
    )
    state.advance(0.001)
    for i in range(6):
        state.queue_changed(
            i, 0.1 * i, (0.2,) if i % 2 else (), {"m": (i, 0.05)} if i > 3 else None
        )
    state.cache_changed(1, "m", (), 8 * GB)
    state.cache_changed(4, "n", (), 7 * GB)
    state.advance(0.05)
    state.cache_changed(2, "n", (), 6 * GB)  # the viewer's own load: not yet published
    state.note_placement(2, 5, Placement(0.3, "m", GB, "job-a"), 0.05)
    state.note_placement(2, 3, Placement(0.2, "n", GB, "job-b"), 0.05)
    return state


def same(a: ViewSnapshot, b: ViewSnapshot) -> None:
    assert a.names == b.names
    np.testing.assert_array_equal(a.wait_s, b.wait_s)
    np.testing.assert_array_equal(a.free_bytes, b.free_bytes)
    np.testing.assert_array_equal(a.capacity_bytes, b.capacity_bytes)
    for model in ("m", "n"):
        np.testing.assert_array_equal(a.holds(model), b.holds(model))
    assert set(a.batches) == set(b.batches)
    for model, (counts, starts) in a.batches.items():
        np.testing.assert_array_equal(counts, b.batches[model][0])
        np.testing.assert_array_equal(starts, b.batches[model][1])


@pytest.mark.parametrize("without", ["", "job-a"])
@pytest.mark.parametrize("priority", [0, 1])
def test_a_snapshot_over_some_workers_is_the_full_one_cut_down(without: str, priority: int) -> None:
    for among in ([2], [0, 2, 5], [1, 2, 3, 4], list(range(6))):
        index = np.array(among, dtype=np.intp)
        full = busy_state().snapshot(2, 0.05, 0.4, {"m": (1, 0.01)}, without, priority)
        part = busy_state().snapshot(2, 0.05, 0.4, {"m": (1, 0.01)}, without, priority, index)
        same(part, full.take(index))
        assert part.members is not None and list(part.members.index) == among


def test_a_bounded_view_must_show_its_own_worker() -> None:
    with pytest.raises(ConfigError, match="include it"):
        busy_state().snapshot(2, 0.05, 0.0, among=np.array([0, 1], dtype=np.intp))


def test_holders_are_the_published_residency_the_own_cache_and_placements_on_their_way() -> None:
    state = busy_state()
    m, n = state.holders(2, 0.05, ["m", "n"])
    assert list(np.flatnonzero(m)) == [1, 5]  # w5: a task of m just placed there
    assert list(np.flatnonzero(n)) == [2, 3, 4]  # w2 itself, exactly; w3: placed
    # once the placements settle, only the published residency and its own
    m, n = state.holders(2, 0.2, ["m", "n"])
    assert list(np.flatnonzero(m)) == [1]
    assert list(np.flatnonzero(n)) == [2, 4]


def same_run(a: SimResult, b: SimResult) -> bool:
    return a.jobs == b.jobs and a.tasks == b.tasks


def test_the_mesh_is_the_default_and_takes_no_candidates(paper: Workload) -> None:
    jobs = arrivals(paper, 150, load=2.0)
    default = simulate(paper, SimSettings(workers=5, policy="compass"), jobs)
    mesh = simulate(paper, SimSettings(workers=5, policy="compass", view="mesh"), jobs)
    assert same_run(default, mesh)
    assert mesh.scoped_views == mesh.scoped_workers == 0


def test_a_bounded_view_that_samples_everyone_sees_everyone_as_heard(paper: Workload) -> None:
    jobs = arrivals(paper, 200, load=2.0)
    mesh = simulate(paper, SimSettings(workers=5, policy="compass"), jobs)
    every = simulate(
        paper,
        SimSettings(workers=5, policy="compass", view="bounded", candidates=4, holders=None),
        jobs,
    )
    # every worker in view, but as heard (compass.sim.heard), not as the mesh's ticks show
    assert not same_run(mesh, every)
    assert all(j.latency_s is not None for j in every.jobs)
    # one snapshot per job planned and per finished task with successors, each of all 5
    assert every.scoped_views > 200
    assert every.scoped_workers == 5 * every.scoped_views


def test_a_bounded_view_shows_few_workers_and_is_deterministic(paper: Workload) -> None:
    jobs = arrivals(paper, 200, load=4.0)

    def once(seed: int) -> SimResult:
        return simulate(
            paper,
            SimSettings(
                workers=16, policy="compass", seed=seed, view="bounded", candidates=2, holders=1
            ),
            jobs,
        )

    a, b = once(0), once(0)
    assert same_run(a, b)
    assert a.summary()["completed"] == 200
    # the planner, the plan's workers, a holder per model (paper jobs need 1-4 models), 2 more
    assert 3 <= a.scoped_workers / a.scoped_views < 10
    assert not same_run(a, once(1))


def test_bounded_views_are_checked(paper: Workload) -> None:
    jobs = arrivals(paper, 5, load=1.0)
    with pytest.raises(ConfigError, match="unknown view"):
        simulate(paper, SimSettings(workers=3, policy="compass", view="partial"), jobs)
    with pytest.raises(ConfigError, match="k must be"):
        simulate(
            paper, SimSettings(workers=3, policy="compass", view="bounded", candidates=-1), jobs
        )
    with pytest.raises(ConfigError, match="one worker"):
        simulate(paper, SimSettings(workers=3, policy="central", view="bounded"), jobs)


def test_a_mesh_config_records_nothing_new() -> None:
    mesh = SimConfig(workload=str(PAPER), workers=5, policies=("compass",))
    assert mesh.view_options() == {}
    assert "view" not in mesh.runs().options
    bounded = SimConfig(
        workload=str(PAPER), workers=5, policies=("compass",), view="bounded", candidates=3
    )
    assert bounded.runs().options["candidates"] == 3
    with pytest.raises(ConfigError, match="unknown view"):
        SimConfig(workload=str(PAPER), workers=5, policies=("compass",), view="star")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``compass ARGS`` in this process: (exit code, stdout and stderr)."""
    from compass._cli.main import main

    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 0), out + err


def test_compass_sim_plans_over_candidates_and_records_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    code, text = run_cli(
        capsys, "sim", "--workload", str(PAPER), "--workers", "8", "--policies", "compass",
        "--jobs", "30", "--view", "bounded", "--candidates", "1", "--holders", "1",
        "--json", str(out),
    )  # fmt: skip
    assert code == 0, text
    data = json.loads(out.read_text())
    assert (data["config"]["view"], data["config"]["candidates"]) == ("bounded", 1)
    assert data["config"]["holders"] == 1
    assert 1 < data["runs"]["compass"]["view_workers_mean"] < 8
    # --holders 0: every holder (on 8 warm workers, nearly all of them)
    code, text = run_cli(
        capsys, "sim", "--workload", str(PAPER), "--workers", "8", "--policies", "compass",
        "--jobs", "30", "--view", "bounded", "--holders", "0", "--json", str(out),
    )  # fmt: skip
    assert code == 0, text
    data = json.loads(out.read_text())
    assert data["config"]["holders"] is None
    assert data["config"]["candidates"] == DEFAULT_CANDIDATES
    assert data["runs"]["compass"]["view_workers_mean"] > 6
    code, text = run_cli(capsys, "sim", "--workers", "8", "--candidates", "2")
    assert code == 2 and "--view bounded" in text


def test_compass_sim_models_the_bounded_view_from_64_workers_unless_told(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Without --view, a large cluster is simulated with the view the worker runs (bounded),
    a small one with the mesh every earlier figure used; --view mesh still asks for it."""
    out = tmp_path / "out.json"

    def view_of(*args: str) -> str | None:
        code, text = run_cli(
            capsys, "sim", "--workload", str(PAPER), "--policies", "hash", "--jobs", "20",
            "--json", str(out), *args,
        )  # fmt: skip
        assert code == 0, text
        view: str | None = json.loads(out.read_text())["config"].get("view")
        return view

    assert view_of("--workers", "64") == "bounded"
    assert view_of("--workers", "63") is None  # the mesh records no view keywords
    assert view_of("--workers", "64", "--view", "mesh") is None
    code, text = run_cli(capsys, "sim", "--workers", "8", "--holders", "1")
    assert code == 2 and "--view bounded" in text


def test_the_cli_names_the_library_default() -> None:
    import typing

    from compass._cli.sim import sim

    hints = typing.get_type_hints(sim, include_extras=True)
    assert f"(default: {DEFAULT_CANDIDATES})" in hints["candidates"].__metadata__[0].help
    assert f"(default: {DEFAULT_HOLDERS};" in hints["holders"].__metadata__[0].help
