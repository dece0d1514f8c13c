"""Learned task times spread (issue 39, item 2): what a worker learns of a task's time reaches
its peers' profiles, bounded, and every worker that heard the same computes the same estimates.
"""

from __future__ import annotations

import pytest

from compass.core.events import Heard, RunTask, Submit, TaskDone
from compass.errors import ConfigError, ProtocolError
from compass.sched.heartbeat import MAX_LEARNED, Heartbeat
from compass.workflow import Profiles, Task, TaskProfile, Workflow
from compass.workflow.profile import LEARNED_SPREAD, SAMPLES_COUNTED

from ..worker.test_state import GB, core, of


def wide(tasks: int = 1) -> Workflow:
    return Workflow(
        "w",
        [Task(f"t{i}", None, (), TaskProfile(exec_ms=50, output_bytes=8)) for i in range(tasks)],
    )


def profiles(tasks: int = 1) -> Profiles:
    return Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, workflows=[wide(tasks)])


def test_a_peer_that_takes_the_learned_times_estimates_as_the_worker_that_ran_them() -> None:
    a, b = profiles(), profiles()
    for _ in range(5):
        a.observe_exec("w", "t0", "a", 0.4)  # declared 50 ms, runs 400 ms on a
    learned = a.learned_of("a")
    assert [entry[:2] for entry in learned] == [("w", "t0")] and learned[0][3] == 5
    version = b.workflow_version("w")
    for workflow, task, seconds, samples in learned:
        assert b.adopt_exec(workflow, task, "a", seconds, samples)
    assert b.workflow_version("w") != version  # b's cost tables and admission take it in
    names = ("a", "b", "c")
    assert b.exec_matrix("w", names).tolist() == a.exec_matrix("w", names).tolist()
    # b and c never ran it: the overall estimate, which is what a learned
    assert b.exec_s("w", "t0", "b") == pytest.approx(a.exec_s("w", "t0", "a"))
    assert b.exec_s("w", "t0", "b") > 0.25
    # b spreads nothing of itself: it ran nothing
    assert b.learned_of("b") == ()


def test_the_overall_estimate_weighs_each_worker_by_its_samples_up_to_a_bound() -> None:
    p = profiles()
    p.adopt_exec("w", "t0", "old", 1.0, 500)  # counted as SAMPLES_COUNTED, not 500
    p.adopt_exec("w", "t0", "new", 2.0, 1)
    expected = (SAMPLES_COUNTED * 1.0 + 1 * 2.0) / (SAMPLES_COUNTED + 1)
    assert p.exec_s("w", "t0") == pytest.approx(expected)
    assert p.exec_s("w", "t0", "old") == 1.0 and p.exec_s("w", "t0", "new") == 2.0


def test_what_a_worker_spreads_is_bounded_newest_first_and_stable_until_it_moves() -> None:
    p = profiles(LEARNED_SPREAD + 4)
    for i in range(LEARNED_SPREAD + 4):
        p.observe_exec("w", f"t{i}", "a", 0.2)
    learned = p.learned_of("a")
    assert len(learned) == LEARNED_SPREAD
    assert [e[1] for e in learned[:2]] == [f"t{LEARNED_SPREAD + 3}", f"t{LEARNED_SPREAD + 2}"]
    # the same tuple while no estimate moves past the tolerance: a heartbeat that carries it
    # does not change, so no rumor starts
    p.observe_exec("w", "t0", "a", p.exec_s("w", "t0", "a"))
    assert p.learned_of("a") is learned
    p.observe_exec("w", "t0", "a", 2.0)
    assert p.learned_of("a") is not learned and p.learned_of("a")[0][1] == "t0"


def test_a_time_learned_of_a_task_this_app_lacks_changes_nothing() -> None:
    p = profiles()
    version = p.workflow_version("w")
    assert not p.adopt_exec("other", "t0", "a", 1.0, 3)
    assert not p.adopt_exec("w", "nope", "a", 1.0, 3)
    assert p.workflow_version("w") == version and p.exec_s("w", "t0") == 0.05
    with pytest.raises(ConfigError):
        p.adopt_exec("w", "t0", "a", -1.0, 3)


def test_learned_times_and_the_version_cross_the_wire_and_bad_ones_are_refused() -> None:
    beat = Heartbeat("a", 0.0, frozenset(), 0, 0, version="v1", learned=(("w", "t0", 0.4, 5),))
    assert Heartbeat.from_wire(beat.to_wire()) == beat
    plain = Heartbeat("a", 0.0, frozenset(), 0, 0)
    assert "p" not in plain.to_wire() and "v" not in plain.to_wire()  # nothing to say: no bytes
    wire = beat.to_wire()
    for bad in (
        [["w", "t0", -1.0, 5]],
        [["w", "t0", 0.4, 0]],
        [["w", 7, 0.4, 5]],
        [["w", "t0", float("inf"), 5]],
        [["w", "t0", 0.4]],
        [["w", "t0", 0.4, 1]] * (MAX_LEARNED + 1),
        "w/t0",
    ):
        with pytest.raises(ProtocolError, match="learned"):
            Heartbeat.from_wire({**wire, "p": bad})
    with pytest.raises(ProtocolError, match="'v'"):
        Heartbeat.from_wire({**wire, "v": 3})


def test_a_core_takes_a_peers_learned_times_from_its_heartbeat_and_plans_with_them() -> None:
    a, _ = core("a", ("a", "b", "c"), learn=True)
    b, _ = core("b", ("a", "b", "c"), learn=True)
    for i in range(5):
        (run,) = of(RunTask, a.handle(Submit(float(i), f"a-{i}", "chain", {"x": 1}, 8, 0.0)))
        a.handle(TaskDone(i + 0.5, run.entry, b"x", exec_s=2.0))
    learned = a.profiles.learned_of("a")
    assert learned and learned[0][:2] == ("chain", "a")
    before = b.profiles.exec_s("chain", "a", "b")
    b.handle(Heard(9.0, Heartbeat("a", 0.0, frozenset({"m"}), GB, 10 * GB, learned=learned)))
    names = ("a", "b", "c")
    assert b.profiles.exec_s("chain", "a", "b") > before
    assert b.profiles.exec_matrix("chain", names)[0].tolist() == pytest.approx(
        a.profiles.exec_matrix("chain", names)[0].tolist()
    )
