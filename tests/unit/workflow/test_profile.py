"""Online profiles: seeding, moving averages, bandwidths and transfer times."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from compass.errors import ConfigError, UnknownWorkflow, WorkflowError
from compass.workflow import Profiles, Task, TaskProfile, Workflow, load_workload
from compass.workflow.profile import REPLAN_FLOOR, REPLAN_TOLERANCE

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"


def two_step() -> Workflow:
    return Workflow(
        "w",
        [
            Task("a", "m", (), TaskProfile(exec_ms=1000, output_bytes=100)),
            Task("b", None, ("a",), TaskProfile(exec_ms=10, output_bytes=0)),
        ],
    )


def profiles(**kwargs: float | bool) -> Profiles:
    args: dict[str, float | bool] = {
        "h2d_bytes_per_s": 1e9,
        "d2h_bytes_per_s": 2e9,
        "net_bytes_per_s": 1e8,
        "net_fixed_s": 1e-3,
        "alpha": 0.5,
    }
    args.update(kwargs)
    return Profiles(model_sizes={"m": 4_000_000}, workflows=[two_step()], **args)  # type: ignore[arg-type]


def test_from_workload_seeds_declared_values() -> None:
    p = Profiles.from_workload(load_workload(PAPER))
    assert p.exec_s("translation", "generate") == pytest.approx(0.561)
    assert p.exec_s("translation", "generate", "anyone") == pytest.approx(0.561)
    assert p.output_bytes("img_to_sound", "speech") == 3_000_000
    assert p.model_bytes("depth") == 3_900_000_000
    assert p.fetch_s("w0", 9_700_000_000) == pytest.approx(1.0)
    assert p.transfer_s("w0", "w1", 12_000) == pytest.approx(2e-6 + 1e-6 + 2 * 12_000 / 9.7e9)


def test_exec_moving_average_overall_and_per_worker() -> None:
    p = profiles()
    version = p.workflow_version("w")
    p.observe_exec("w", "a", "x", 2.0)
    assert p.workflow_version("w") != version
    assert p.exec_s("w", "a") == pytest.approx(1.5)
    assert p.exec_s("w", "a", "x") == pytest.approx(1.5)  # blended from the overall 1.0
    assert p.exec_s("w", "a", "y") == pytest.approx(1.5)  # never measured: the overall
    p.observe_exec("w", "a", "y", 3.0)
    assert p.exec_s("w", "a", "y") == pytest.approx(2.25)  # blended from the overall 1.5
    assert p.exec_s("w", "a", "x") == pytest.approx(1.5)
    # the overall: the workers' learned times, one sample each, weighted alike
    assert p.exec_s("w", "a") == pytest.approx((1.5 + 2.25) / 2)
    matrix = p.exec_matrix("w", ("x", "y", "z"))
    assert matrix.shape == (2, 3)
    assert matrix[0].tolist() == pytest.approx([1.5, 2.25, 1.875])
    assert matrix[1].tolist() == pytest.approx([0.01, 0.01, 0.01])
    with pytest.raises(ConfigError):
        p.observe_exec("w", "a", "x", -1.0)


def test_output_moving_average() -> None:
    p = profiles()
    p.observe_output("w", "a", 300)
    assert p.output_bytes("w", "a") == 200
    assert p.output_vector("w").tolist() == [200.0, 0.0]


def test_unknown_names() -> None:
    p = profiles()
    with pytest.raises(UnknownWorkflow, match="'nope'"):
        p.exec_s("nope", "a")
    with pytest.raises(WorkflowError, match="no task 'zz'"):
        p.exec_s("w", "zz")
    with pytest.raises(WorkflowError, match="unknown model 'gpt'"):
        p.model_bytes("gpt")


def test_transfer_and_fetch() -> None:
    p = profiles()
    n = 1_000_000
    assert p.transfer_s("x", "x", n) == 0.0
    expected = 1e-3 + n / 1e8 + n / 2e9 + n / 1e9
    assert p.transfer_s("x", "y", n) == pytest.approx(expected)
    assert profiles(staged=False).transfer_s("x", "y", n) == pytest.approx(1e-3 + n / 1e8)
    assert p.fetch_s("x", n) == pytest.approx(1e-3)
    p.set_h2d("y", 5e8)
    assert p.fetch_s("y", n) == pytest.approx(2e-3)
    assert p.fetch_s("x", n) == pytest.approx(1e-3)
    assert p.transfer_s("x", "y", n) == pytest.approx(expected + n / 5e8 - n / 1e9)


def test_links_per_pair_and_default() -> None:
    p = profiles(staged=False)
    before = p.links_version
    p.set_link("x", "y", 1e6, 0.0)
    assert p.links_version > before
    assert p.transfer_s("x", "y", 1_000_000) == pytest.approx(1.0)
    assert p.transfer_s("y", "x", 1_000_000) == pytest.approx(1e-3 + 1e-2)
    p.set_network(1e9, 0.0)
    assert p.transfer_s("y", "x", 1_000_000) == pytest.approx(1e-3)
    assert p.transfer_s("x", "y", 1_000_000) == pytest.approx(1.0)  # the pair keeps its own


def test_bandwidth_measurements_move_estimates() -> None:
    p = profiles(staged=False)
    p.observe_h2d("x", 1_000_000, 1e-3 / 3)  # measured 3 GB/s; EMA with alpha 0.5
    assert p.h2d_bytes_per_s("x") == pytest.approx(2e9)
    p.observe_transfer("x", "y", 1_000_000, 1e-3 + 1e-3)  # 1 ms fixed + 1 ms payload: 1 GB/s
    assert p.link("x", "y")[0] == pytest.approx(0.5 * 1e8 + 0.5 * 1e9)


def test_many_workers_keep_their_values() -> None:
    p = profiles()
    names = tuple(f"w{i:02d}" for i in range(40))
    for i, name in enumerate(names):
        p.observe_exec("w", "a", name, float(i))
        p.set_h2d(name, 1e9 + i)
    inverse = p.h2d_inverse(names)
    assert isinstance(inverse, np.ndarray)
    assert (1.0 / inverse).tolist() == pytest.approx([1e9 + i for i in range(40)])
    matrix = p.exec_matrix("w", names)
    for i, name in enumerate(names):
        assert matrix[0, i] == pytest.approx(p.exec_s("w", "a", name))


def test_bad_configuration() -> None:
    with pytest.raises(ConfigError, match="h2d_bytes_per_s"):
        Profiles(h2d_bytes_per_s=0, net_bytes_per_s=1.0)
    with pytest.raises(ConfigError, match="alpha"):
        Profiles(h2d_bytes_per_s=1.0, net_bytes_per_s=1.0, alpha=0.0)


def test_steady_measurements_stop_changing_the_version() -> None:
    wf = Workflow("w", [Task("a", None, (), TaskProfile(exec_ms=10.0, output_bytes=100))])
    profiles = Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, workflows=[wf])
    versions = []
    for _ in range(60):  # the estimate converges on 10 ms, the declared value
        profiles.observe_exec("w", "a", "w0", 0.010)
        profiles.observe_output("w", "a", 100)
        versions.append(profiles.workflow_version("w"))
    assert len(set(versions[5:])) == 1  # nothing moved: cost tables stay cached
    before = profiles.workflow_version("w")
    profiles.observe_exec("w", "a", "w0", 0.050)  # a real change is published at once
    assert profiles.workflow_version("w") != before
    assert profiles.exec_s("w", "a", "w0") > 0.010


def test_the_version_moves_exactly_when_an_estimate_drifts_from_the_published_one() -> None:
    # the rule as written before the per-job cut (a tuple index, its last entry checked
    # against the table's width, math.isnan), applied to the tables published before each
    # measurement: new workers past the first slots, steady and jumping times and sizes
    def drifted(table: np.ndarray, index: tuple[int, ...], value: float, which: int) -> bool:
        if index[-1] >= table.shape[-1]:
            return True
        old = float(table[index])
        if math.isnan(old):
            return True
        return abs(value - old) > max(REPLAN_TOLERANCE * abs(old), REPLAN_FLOOR[which])

    rng = random.Random(3)
    p = profiles(alpha=0.2)
    prof = p._workflows["w"]
    bumps = 0
    for _ in range(3_000):
        task, worker = rng.choice("ab"), f"x{rng.randrange(12)}"
        i = prof.wf.index[task]
        published = [table.copy() for table in prof.published]
        before = p.workflow_version("w")
        if rng.random() < 0.7:
            p.observe_exec(
                "w", task, worker, 0.5 if rng.random() < 0.02 else rng.choice((0.01, 0.0101))
            )
            slot = p._slots[worker]
            expected = drifted(published[0], (i,), float(prof.exec_s[i]), 0) or drifted(
                published[2], (i, slot), float(prof.exec_by_slot[i, slot]), 2
            )
        else:
            p.observe_output("w", task, 10**6 if rng.random() < 0.02 else rng.choice((100, 110)))
            expected = drifted(published[1], (i,), float(prof.output_bytes[i]), 1)
        moved = p.workflow_version("w") != before
        assert moved == expected
        bumps += moved
    assert 100 < bumps < 2_900, bumps  # both ways, many times


def test_the_overall_time_is_the_weighted_mean_to_the_bit_learned_on_one_worker_or_more() -> None:
    """The overall estimate of a task learned on one worker alone is that worker's time,
    computed without arrays: the same float as the weighted mean over every worker's (the
    numpy product of weights and times); once others learn it, their times count too."""
    rng = random.Random(7)
    p = profiles(alpha=0.3)

    def weighted_mean() -> float:
        slots = [p._slots[w] for w in ("x", "y", "z") if w in p._slots]
        times = np.array([p.exec_s("w", "a", w) for w in ("x", "y", "z") if w in p._slots])
        prof = p._workflows["w"]
        weights = np.minimum(prof.samples[0, slots], 10)
        return float(np.dot(times, weights) / weights.sum())

    for n in range(40):  # one worker, past the samples counted: every estimate to the bit
        p.observe_exec("w", "a", "x", rng.uniform(1e-6, 3.0) * 10 ** rng.randint(-6, 1))
        assert p.exec_s("w", "a") == weighted_mean(), n
    p.adopt_exec("w", "a", "y", 0.125, samples=3)  # another's, from its heartbeat
    assert p.exec_s("w", "a") == weighted_mean() != p.exec_s("w", "a", "x")
    for _ in range(5):
        p.observe_exec("w", "a", "z", rng.uniform(0.0, 2.0))
        p.observe_exec("w", "a", "x", rng.uniform(0.0, 2.0))
        assert p.exec_s("w", "a") == weighted_mean()
