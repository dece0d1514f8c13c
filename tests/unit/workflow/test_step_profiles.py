"""Step profiles learned online: a step-wise task's step count and step time, apart.

Its expected time is their product, on every worker: the count follows the jobs, the step
time the worker that ran it (compass/workflow/profile.py ``observe_steps``); a learning core
folds a step-wise run's steps into them (compass/core/estimates.py ``observe_run``).
"""

from __future__ import annotations

import pytest

from compass.core.events import RunTask, Submit, TaskDone
from compass.core.outcome import TaskOutcome
from compass.errors import ConfigError
from compass.workflow import Profiles, Task, TaskProfile, Workflow

from ..worker.test_state import core, new_job_id, of


def generating() -> Workflow:
    """``gen``: 10 steps of 100 ms declared; ``plain``: one call of 50 ms."""
    return Workflow(
        "w",
        [
            Task("gen", None, (), TaskProfile(exec_ms=1000, output_bytes=10, steps=10)),
            Task("plain", None, ("gen",), TaskProfile(exec_ms=50, output_bytes=0)),
        ],
    )


def profiles() -> Profiles:
    return Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, workflows=[generating()], alpha=0.5)


def test_the_declared_profile_seeds_the_step_count_and_step_time() -> None:
    p = profiles()
    assert p.steps("w", "gen") == 10 and p.step_s("w", "gen") == pytest.approx(0.1)
    assert p.steps("w", "plain") == 1 and p.step_s("w", "plain") == pytest.approx(0.05)


def test_a_longer_run_teaches_the_count_not_a_slower_step() -> None:
    p = profiles()
    version = p.workflow_version("w")
    p.observe_steps("w", "gen", "w0", 30, 3.0)  # three times the steps, each as fast
    assert p.steps("w", "gen") == pytest.approx(20.0)  # 10 + 0.5 * (30 - 10)
    assert p.step_s("w", "gen") == pytest.approx(0.1)
    assert p.step_s("w", "gen", "w0") == pytest.approx(0.1)
    assert p.exec_s("w", "gen") == pytest.approx(2.0)  # the estimate: 20 steps of 100 ms
    assert p.workflow_version("w") != version  # the planner's cost tables take it


def test_a_slow_worker_keeps_its_step_time_and_takes_the_learned_count() -> None:
    p = profiles()
    p.observe_steps("w", "gen", "slow", 10, 3.0)  # 300 ms a step there
    slow_step = p.step_s("w", "gen", "slow")
    assert slow_step == pytest.approx(0.2)  # its first measurement blends with the overall
    p.observe_steps("w", "gen", "fast", 50, 5.0)  # 100 ms a step, five times the steps
    count = p.steps("w", "gen")
    assert count == pytest.approx(30.0)
    # the slow worker's step time is its own still; its expected run is the learned count of
    # them (a whole-run average would have kept its 10-step run's time)
    assert p.step_s("w", "gen", "slow") == pytest.approx(slow_step)
    assert p.exec_s("w", "gen", "slow") == pytest.approx(count * slow_step)
    assert p.exec_s("w", "gen", "slow") > p.exec_s("w", "gen", "fast")
    matrix = p.exec_matrix("w", ("fast", "slow", "never"))
    assert matrix[0, 1] == pytest.approx(count * slow_step)
    assert matrix[0, 2] == pytest.approx(p.exec_s("w", "gen"))  # unmeasured: the overall


def test_a_measured_run_that_is_not_steps_is_refused() -> None:
    p = profiles()
    for steps in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="measured steps must be an integer >= 1"):
            p.observe_steps("w", "gen", "w0", steps, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="measured execution seconds"):
        p.observe_steps("w", "gen", "w0", 3, -1.0)
    assert p.steps("w", "gen") == 10  # nothing learned from them


def test_a_learning_core_learns_a_step_wise_run_and_its_estimate_moves() -> None:
    c, _ = core("a", names=("a",), learn=True)
    profiles = c.estimates.profiles
    declared = profiles.exec_s("chain", "a", "a")
    job = new_job_id(c)
    (run,) = of(RunTask, c.handle(Submit(0.0, job, "chain", {"x": 1}, 8, t0=0.0)))
    # a run of 40 steps, a step as long as declared: the estimate is 40 steps long
    outcome = TaskOutcome(run.entry, output=b"", exec_s=declared * 40, steps=40)
    c.handle(outcome.event(1.0))
    assert profiles.steps("chain", "a") > 1
    assert profiles.exec_s("chain", "a", "a") > declared
    assert profiles.step_s("chain", "a", "a") == pytest.approx(declared)


def test_time_waited_for_a_slow_caller_is_not_learned() -> None:
    c, _ = core("a", names=("a",), learn=True)
    profiles = c.estimates.profiles
    declared = profiles.exec_s("chain", "a", "a")
    (run,) = of(RunTask, c.handle(Submit(0.0, new_job_id(c), "chain", {"x": 1}, 8, t0=0.0)))
    waited = TaskOutcome(run.entry, output=b"", exec_s=declared + 50.0, steps=1, waited_s=50.0)
    event = waited.event(60.0)
    assert isinstance(event, TaskDone) and event.exec_s == pytest.approx(declared)
    c.handle(event)
    assert profiles.exec_s("chain", "a", "a") == pytest.approx(declared)
