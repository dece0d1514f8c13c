"""Arrival processes: statistics of each process, load scaling, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from compass.errors import ConfigError
from compass.sim.arrivals import Arrival, interarrival_s, job_arrivals

FLOWS = ["a", "b", "c", "d"]


def cv_of(values: np.ndarray) -> float:
    return float(values.std() / values.mean())


def test_uniform_spacing_is_constant() -> None:
    gaps = interarrival_s("uniform", 1000, 2.0, 5.0, np.random.default_rng(0))
    assert np.all(gaps == 2.0)
    assert cv_of(gaps) == 0.0


def test_poisson_mean_and_cv() -> None:
    gaps = interarrival_s("poisson", 200_000, 2.0, 10.0, np.random.default_rng(1))
    assert gaps.mean() == pytest.approx(2.0, rel=0.02)
    assert cv_of(gaps) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(("cv", "tolerance"), [(3.0, 0.03), (10.0, 0.08)])
def test_gamma_mean_and_cv_as_asked(cv: float, tolerance: float) -> None:
    gaps = interarrival_s("gamma", 1_000_000, 2.0, cv, np.random.default_rng(2))
    assert gaps.mean() == pytest.approx(2.0, rel=tolerance)
    assert cv_of(gaps) == pytest.approx(cv, rel=tolerance)


def test_bad_arguments_are_config_errors() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="unknown arrival process 'bursty'"):
        interarrival_s("bursty", 10, 1.0, 1.0, rng)
    with pytest.raises(ConfigError, match="mean inter-arrival"):
        interarrival_s("poisson", 10, 0.0, 1.0, rng)
    with pytest.raises(ConfigError, match="coefficient of variation"):
        interarrival_s("gamma", 10, 1.0, 0.0, rng)
    with pytest.raises(ConfigError, match="load"):
        job_arrivals(FLOWS, 10, process="poisson", mean_interval_s=1.0, load=0.0)


def per_client_gaps(arrivals: list[Arrival], client: int) -> np.ndarray:
    times = np.array([a.t_s for a in arrivals if a.client == client])
    return np.diff(times)


@pytest.mark.parametrize(
    ("process", "cv", "expected_cv"),
    [
        ("uniform", 1.0, 0.0),
        ("poisson", 1.0, 1.0),
        ("gamma", 3.0, 3.0),
    ],
)
def test_job_arrivals_one_stream_per_client(process: str, cv: float, expected_cv: float) -> None:
    jobs = 80_000
    arrivals = job_arrivals(
        FLOWS, jobs, process=process, mean_interval_s=2.0, load=2.0, cv=cv, seed=3
    )
    assert len(arrivals) == jobs
    times = np.array([a.t_s for a in arrivals])
    assert times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    for client, workflow in enumerate(FLOWS):
        mine = [a for a in arrivals if a.client == client]
        assert {a.workflow for a in mine} == {workflow}
        gaps = per_client_gaps(arrivals, client)
        # load 2 halves the 2 s mean interval of every client
        assert gaps.mean() == pytest.approx(1.0, rel=0.1)
        assert cv_of(gaps) == pytest.approx(expected_cv, abs=0.1 * max(expected_cv, 0.1))


def test_uniform_clients_do_not_submit_in_lockstep() -> None:
    arrivals = job_arrivals(FLOWS, 400, process="uniform", mean_interval_s=2.0, seed=0)
    first = {a.client: a.t_s for a in reversed(arrivals)}
    assert len(set(first.values())) == len(FLOWS)


@pytest.mark.parametrize("process", ["uniform", "poisson", "gamma"])
def test_load_scales_time(process: str) -> None:
    one = job_arrivals(FLOWS, 2000, process=process, mean_interval_s=2.0, load=1.0, cv=3.0, seed=5)
    three = job_arrivals(
        FLOWS, 2000, process=process, mean_interval_s=2.0, load=3.0, cv=3.0, seed=5
    )
    assert [a.client for a in one] == [a.client for a in three]
    np.testing.assert_allclose([a.t_s / 3.0 for a in one], [a.t_s for a in three], atol=1e-9)


def test_same_seed_same_arrivals_other_seed_others() -> None:
    def make(seed: int) -> list[Arrival]:
        return job_arrivals(FLOWS, 500, process="gamma", mean_interval_s=2.0, cv=10.0, seed=seed)

    assert make(7) == make(7)
    assert make(7) != make(8)


def test_adding_a_client_keeps_the_others_streams() -> None:
    few = job_arrivals(FLOWS[:2], 300, process="poisson", mean_interval_s=2.0, seed=4)
    more = job_arrivals(FLOWS, 600, process="poisson", mean_interval_s=2.0, seed=4)
    gaps_few = per_client_gaps(few, 0)
    gaps_more = per_client_gaps(more, 0)
    n = min(len(gaps_few), len(gaps_more))
    np.testing.assert_allclose(gaps_few[:n], gaps_more[:n])


def test_zero_jobs() -> None:
    assert job_arrivals(FLOWS, 0, process="poisson", mean_interval_s=1.0) == []
