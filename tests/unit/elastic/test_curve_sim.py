"""Time-varying traffic and the simulator whose cluster changes size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compass.elastic.curve import (
    burst_curve,
    curve_arrivals,
    daily_curve,
    read_counts,
    workload_rate,
)
from compass.elastic.replicate import ReplicaConfig
from compass.elastic.rule import ScaleConfig
from compass.elastic.sim import ElasticOptions, simulate_elastic
from compass.elastic.waves import Waves, wave_arrivals
from compass.errors import ConfigError
from compass.sim.arrivals import Arrival
from compass.workflow.spec import Workload, load_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"


@pytest.fixture(scope="module")
def paper() -> Workload:
    return load_workload(PAPER)


def test_daily_curve_is_seeded_with_a_day_shape_and_bursts() -> None:
    a, b = daily_curve(3), daily_curve(3)
    assert np.array_equal(a, b) and not np.array_equal(a, daily_curve(4))
    assert len(a) == 1440 and a.mean() == pytest.approx(1.0)
    night, afternoon = a[120:300].mean(), a[780:960].mean()
    assert afternoon > 2 * night
    calm = daily_curve(3, bursts=0, noise=0.0)
    assert a.max() > 1.5 * calm.max()  # the bursts triple the rate somewhere


def test_counts_csv_replays_a_trace(tmp_path: Path, paper: Workload) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("minute,jobs\n0,10\n2,30\n1,20\n")
    curve = read_counts(trace)
    assert curve.tolist() == pytest.approx([0.5, 1.0, 1.5])
    arrivals = curve_arrivals(paper, curve, minute_s=60.0, rate_scale=2.0, seed=1)
    rate = workload_rate(paper) * 2.0
    counts = np.bincount([int(a.t_s // 60) for a in arrivals], minlength=3)
    assert counts.tolist() == pytest.approx([0.5 * rate * 60, rate * 60, 1.5 * rate * 60],
                                            rel=0.25)  # fmt: skip
    assert all(a.workflow in paper.workflows for a in arrivals)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("min,jobs\n0,1\n", "header 'minute,jobs'"),
        ("minute,jobs\n0,x\n", "line 2: expected a whole minute"),
        ("minute,jobs\n0,1\n0,2\n", "minute 0 is listed twice"),
        ("minute,jobs\n-1,2\n", "minute must be >= 0"),
        ("minute,jobs\n0,0\n", "no jobs"),
    ],
)
def test_bad_traces_are_refused_in_one_line(tmp_path: Path, text: str, error: str) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    with pytest.raises(ConfigError, match=error) as info:
        read_counts(trace)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_counts(tmp_path / "missing.csv")


def test_a_burst_scales_out_and_the_surplus_drains_without_losing_a_job(
    paper: Workload,
) -> None:
    """Two quiet minutes, one at 4x, three quiet ones, 20 s per minute: the rule scales out
    during the burst, drains after it, and every job is answered."""
    curve = np.array([0.5, 0.5, 2.0, 0.5, 0.5, 0.5])
    arrivals = curve_arrivals(paper, curve, minute_s=20.0, seed=0)
    rule = ScaleConfig(maximum=8, target_util=0.4, in_after_s=10.0)
    options = ElasticOptions(initial=2, maximum=8, start_s=5.0, rule=rule)
    auto = simulate_elastic(paper, arrivals, options)
    assert len(auto.jobs) == len(arrivals)
    assert all(j.finish is not None and not j.error for j in auto.jobs)
    peak_size = max(serving + other for _, serving, other in auto.sizes)
    assert peak_size > 2 and auto.starts > 0 and auto.drains > 0
    assert auto.sizes[-1][1] < peak_size  # back down after the burst
    fixed = simulate_elastic(paper, arrivals, ElasticOptions(controller="fixed", initial=8,
                                                             maximum=8))  # fmt: skip
    assert auto.gpu_hours < fixed.gpu_hours
    assert len(fixed.jobs) == len(arrivals)


def test_the_live_rule_in_the_simulator_scales_out_during_a_burst(paper: Workload) -> None:
    """The controller ``compass up --autoscale`` follows (the real worker's LiveDesired, from
    waits and busy lanes), as ``bench elastic --real`` simulates it: out during the burst,
    never past MAX, every job answered."""
    curve = np.array([0.5, 0.5, 3.0, 3.0, 0.5])
    arrivals = curve_arrivals(paper, curve, minute_s=20.0, seed=1)
    live = simulate_elastic(paper, arrivals, ElasticOptions(controller="live", maximum=6,
                                                            start_s=2.0))  # fmt: skip
    sizes = [serving + other for _, serving, other in live.sizes]
    assert live.starts > 0 and 1 < max(sizes) <= 6
    assert all(j.finish is not None and not j.error for j in live.jobs)


def test_a_wave_on_one_model_warms_copies_ahead_of_need(paper: Workload) -> None:
    """Waves of one workflow's popularity on a fixed cluster: the replication rule warms
    copies of the pressed models on workers with headroom (none without it), and no job is
    lost to the loads it adds."""
    arrivals = wave_arrivals(paper, Waves(count=2, factor=6.0), minute_s=10.0, seed=0)
    sides = {
        on: simulate_elastic(paper, arrivals, ElasticOptions(
            controller="fixed", initial=7, maximum=7,
            replicate=ReplicaConfig() if on else None))
        for on in (False, True)
    }  # fmt: skip
    assert sides[False].replicas == 0 and sides[True].replicas > 0
    assert sides[True].extra["loads"] > sides[False].extra["loads"]
    for result in sides.values():
        assert len(result.jobs) == len(arrivals)
        assert all(j.finish is not None and not j.error for j in result.jobs)


def test_wave_traffic_shifts_the_mix_at_a_steady_rate(paper: Workload) -> None:
    calm = wave_arrivals(paper, Waves(count=1, factor=1.0, ramp=1, hold=2, gap=2), seed=3)
    shape = Waves(count=1, factor=8.0, ramp=1, hold=2, gap=2)
    wave = wave_arrivals(paper, shape, seed=3)
    assert wave == wave_arrivals(paper, shape, seed=3)
    assert abs(len(wave) - len(calm)) < 0.3 * len(calm)  # the total rate does not change

    def top_share(arrivals: list[Arrival]) -> float:
        held = [a.workflow for a in arrivals if 20.0 <= a.t_s < 40.0]  # the wave's hold
        return max(held.count(w) for w in set(held)) / len(held)

    assert top_share(wave) > 0.55 > top_share(calm)  # one workflow takes over
    with pytest.raises(ConfigError, match="factor"):
        Waves(factor=0.5)


def test_options_refuse_bad_bounds() -> None:
    with pytest.raises(ConfigError, match="above MAX"):
        ElasticOptions(minimum=5, maximum=2)
    with pytest.raises(ConfigError, match="unknown controller"):
        ElasticOptions(controller="hpa")
    assert burst_curve(2, 1).tolist() == [1.0, 1.0, 3.0, 1.0]
