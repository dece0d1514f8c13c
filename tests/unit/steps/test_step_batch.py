"""Step batching (continuous batching): step-wise tasks of one group share a lane, joining a
running batch at a step boundary and leaving when their own steps end; the lanes' rules with
plain calls and explicit times, and the simulator's timing of a batch worked by hand."""

from __future__ import annotations

from typing import Any

import pytest

from compass.cache.policy import CacheCore
from compass.cache.pool import SlabPool
from compass.core.events import JoinRun, StopTask, SuspendTask
from compass.core.lanes import CannotRun, Lanes, RunTask, Step
from compass.core.queue import QueuedTask
from compass.sim.arrivals import Arrival
from compass.sim.engine import simulate
from compass.sim.settings import NO_STEP_BATCHING, SimSettings, base_policy, with_step_batching
from compass.workflow.batching import without_step_batches
from compass.workflow.dag import linear_scale
from compass.workflow.spec import parse_workload

GB = 1_000_000_000
#: each extra member makes a step 10% longer
SCALE = linear_scale(0.1, 4)


def gen(
    job: str,
    *,
    group: str | None = "lm/steps",
    expected_s: float = 1.0,
    arrival: float = 0.0,
    deadline: float | None = None,
    model: str = "lm",
) -> QueuedTask:
    """A step-wise task of 10 steps of ``expected_s / 10`` s, that batches up to 4."""
    return QueuedTask(
        job_id=job, attempt=0, workflow="wf", task="gen", model=model, expected_s=expected_s,
        inputs={}, plan={}, ingress="w0", enqueued_at=arrival, arrival=arrival,
        deadline=deadline, remaining_s=expected_s, steps=10, best_s=expected_s,
        group=group, max_batch=4, scale=SCALE,
    )  # fmt: skip


class Harness:
    """One GPU lane over a 4 GB cache with model ``lm`` resident."""

    def __init__(self) -> None:
        self.cache = CacheCore(SlabPool(4 * GB, GB // 4), {"lm": GB, "other": GB})
        plan = self.cache.plan_load("lm")
        assert plan is not None
        self.cache.begin_load("lm", plan)
        self.cache.finish_load("lm")
        self.lanes = Lanes(lanes=1, cache=self.cache)
        self.failed: list[tuple[str, Any]] = []

    def steps(self, steps: list[Step]) -> list[Any]:
        out = []
        for step in steps:
            if isinstance(step, CannotRun):
                self.failed.append((step.entry.job_id, step.error))
            else:
                out.append(step)
        return out


def test_a_task_of_a_running_batchs_group_joins_it_instead_of_waiting_for_the_lane() -> None:
    h = Harness()
    first, second = gen("j1"), gen("j2", arrival=0.25)
    (run,) = h.steps(h.lanes.submit(first, 0.0))
    assert isinstance(run, RunTask) and run.entry is first
    (join,) = h.steps(h.lanes.submit(second, 0.25))
    assert join == JoinRun(first, (second,), run.lane)
    assert h.lanes.busy == 1 and len(h.lanes.queue) == 0
    assert set(h.lanes.running()) == {first, second}
    # the first member leaves: the lane is still the batch's
    assert h.steps(h.lanes.ended(first, 1.1)) == []
    assert h.lanes.busy == 1
    # the last one leaves: the lane is free, the model unpinned
    h.steps(h.lanes.ended(second, 1.4))
    assert h.lanes.busy == 0 and h.cache.pins("lm") == 0


def test_a_full_batch_takes_no_more_and_a_freed_seat_goes_to_the_queue() -> None:
    h = Harness()
    members = [gen(f"j{i}") for i in range(4)]
    h.steps(h.lanes.submit(members[0], 0.0))
    for m in members[1:]:
        h.steps(h.lanes.submit(m, 0.01))
    late = gen("j4", arrival=0.02)
    assert h.steps(h.lanes.submit(late, 0.02)) == []  # four seats taken (the curve's limit)
    assert list(h.lanes.queue) == [late]
    (join,) = h.steps(h.lanes.ended(members[2], 1.2))
    assert isinstance(join, JoinRun) and join.entries == (late,)
    assert join.lead is members[0] and not list(h.lanes.queue)


def test_other_models_and_plain_tasks_wait_for_the_lane() -> None:
    h = Harness()
    h.steps(h.lanes.submit(gen("j1"), 0.0))
    plain = gen("p", group=None)
    other = gen("o", group="other/steps", model="other")
    for entry in (plain, other):  # (the other model may be prefetched meanwhile)
        decided = h.steps(h.lanes.submit(entry, 0.1))
        assert not [s for s in decided if isinstance(s, RunTask | JoinRun)]
    assert len(h.lanes.queue) == 2


def test_a_join_that_would_make_a_member_miss_its_deadline_is_refused() -> None:
    h = Harness()
    # the first member ends at 1.0 alone, at 0.5 + 0.5 * 1.1 = 1.05 with a second member
    tight = gen("tight", deadline=1.02)
    h.steps(h.lanes.submit(tight, 0.0))
    assert h.steps(h.lanes.submit(gen("j2", arrival=0.5), 0.5)) == []
    assert len(h.lanes.queue) == 1
    h2 = Harness()
    h2.steps(h2.lanes.submit(gen("roomy", deadline=1.1), 0.0))
    assert len(h2.steps(h2.lanes.submit(gen("j2", arrival=0.5), 0.5))) == 1


def test_a_member_past_saving_stops_at_its_step_and_its_job_is_dropped() -> None:
    h = Harness()
    h.lanes.preempt = True
    doomed, fine = gen("doomed", deadline=1.2), gen("fine", arrival=0.0)
    h.steps(h.lanes.submit(doomed, 0.0))
    h.steps(h.lanes.submit(fine, 0.0))  # joins: steps of 0.11 s, the doomed one ends at 1.1
    assert h.steps(h.lanes.stepped(doomed, 5, 0.55)) == []  # on time so far
    # slower than expected: after 5 steps at 0.9 s, 5 more of 0.11 s end at 1.45
    decided = h.steps(h.lanes.stepped(doomed, 5, 0.9))
    assert decided == [StopTask((doomed,))]
    assert [job for job, _ in h.failed] == ["doomed"]
    # the other member is never suspended for the queue: a task of its group would join
    h.steps(h.lanes.submit(gen("p", group=None, arrival=0.6), 0.6))
    assert h.steps(h.lanes.stepped(fine, 6, 0.6)) == []


# -- the simulator -------------------------------------------------------------------------

SPEC = {
    "name": "two-generations",
    "cluster": {"workers": 1, "gpu_memory_mb": 4000, "h2d_gbps": 10, "d2h_gbps": 10,
                "net_gbps": 10, "net_fixed_us": 0},
    "models": {"lm": {"size_mb": 1000}},
    "workflows": {
        "talk": {
            "tasks": {
                "gen": {"model": "lm", "exec_ms": 1000, "steps": 10, "batch": 4,
                        "batch_item": 0.1, "after": [], "input_kb": 0, "output_kb": 0},
            }
        }
    },
    "arrivals": {"mean_interval_ms_per_client": 1000, "jobs": 2},
}  # fmt: skip


def _run(step_batch: bool) -> Any:
    workload = parse_workload(SPEC)
    arrivals = [Arrival(0.0, "talk", 0), Arrival(0.25, "talk", 1)]
    settings = SimSettings(workers=1, policy="compass", step_batch=step_batch, warm_start=True)
    return simulate(workload, settings, arrivals)


def test_the_simulator_times_a_step_batch_step_by_step() -> None:
    result = _run(True)
    ends = sorted(j.latency_s for j in result.jobs)
    # the first runs 3 steps alone (0.1 s each, to 0.3), then 7 at 0.11 s: 0.3 + 0.77; the
    # second joins at 0.3: 7 steps at 0.11 (to 1.07), then 3 alone (1.37), 1.12 s after it came
    assert ends == pytest.approx([1.07, 1.12], abs=1e-6)
    lane_s = sum(t.exec_s for t in result.tasks)
    assert lane_s == pytest.approx(1.37, abs=1e-6)  # the lane's busy time, shared out
    alone = sorted(j.latency_s for j in _run(False).jobs)
    assert alone == pytest.approx([1.0, 1.75], abs=1e-6)  # the second waits for the lane


def test_no_step_batching_is_a_policy_suffix_and_a_workload_transform() -> None:
    assert with_step_batching(("compass",), "both") == ("compass", "compass" + NO_STEP_BATCHING)
    assert base_policy("jsq (no preemption) (no step batching)") == "jsq"
    settings = SimSettings(workers=1, policy="jit (no preemption) (no step batching)")
    assert (settings.policy, settings.preempt, settings.step_batch) == ("jit", False, False)
    task = without_step_batches(parse_workload(SPEC)).workflows["talk"].tasks["gen"]
    assert task.batch == 1


def test_a_lone_member_is_suspended_for_another_group_and_resumes_as_a_batch() -> None:
    h = Harness()
    h.lanes.preempt = True
    gen_ = gen("long", expected_s=1.0)
    h.steps(h.lanes.submit(gen_, 0.0))
    other = gen("short", group=None, expected_s=0.05, arrival=0.1)
    other.steps, other.best_s = 1, 0.05
    h.steps(h.lanes.submit(other, 0.1))
    decided = h.steps(h.lanes.stepped(gen_, 1, 0.1))
    assert [type(s).__name__ for s in decided] == ["SuspendTask", "RunTask"]
    assert decided[1].entry is other and gen_.done_steps == 1
    resumed = h.steps(h.lanes.ended(other, 0.15)) + h.steps(h.lanes.fill(0.15))
    (run,) = [s for s in resumed if isinstance(s, RunTask)]
    assert run.entry is gen_ and run.entry.done_steps == 1
    # a second member of its group makes it a batch again: a task of the group then joins
    assert len(h.steps(h.lanes.submit(gen("j2", arrival=0.2), 0.2))) == 1


def batch_of_two_and_a_short_job(h: Harness, **short_kw: Any) -> tuple[QueuedTask, ...]:
    """``a`` and ``b`` run as one step batch (each reported its first step at 0.1 s), then a
    short plain job of the same model is queued at 0.15 s."""
    h.lanes.preempt = True
    a, b = gen("a"), gen("b")
    h.steps(h.lanes.submit(a, 0.0))
    h.steps(h.lanes.submit(b, 0.0))  # takes a seat at the next boundary
    assert h.steps(h.lanes.stepped(a, 1, 0.1)) == []  # nothing queued: it goes on
    assert h.steps(h.lanes.stepped(b, 1, 0.1)) == []
    quick = gen("short", group=None, expected_s=0.05, arrival=0.15, **short_kw)
    quick.steps, quick.best_s = 1, 0.05
    h.steps(h.lanes.submit(quick, 0.15))
    return a, b, quick


def test_a_batch_is_suspended_whole_and_its_members_resume_together() -> None:
    h = Harness()
    a, b, quick = batch_of_two_and_a_short_job(h)
    decided = h.steps(h.lanes.stepped(a, 2, 0.2))
    assert [type(s).__name__ for s in decided] == ["SuspendTask", "SuspendTask", "RunTask"]
    assert [s.entry for s in decided] == [a, b, quick]
    # b reports the same boundary after a: its step counts, nothing more is decided
    assert h.steps(h.lanes.stepped(b, 1, 0.2)) == []
    assert (a.done_steps, b.done_steps) == (2, 2)
    assert list(h.lanes.suspended) == [a, b] and h.lanes.suspensions == 1
    assert h.cache.pins("lm") == 3  # one a suspended member, one the short job's run
    resumed = h.steps(h.lanes.ended(quick, 0.25)) + h.steps(h.lanes.fill(0.25))
    (run,) = [s for s in resumed if isinstance(s, RunTask)]
    assert (run.entry, run.mates) == (a, (b,))  # together, one run, one pin
    assert not h.lanes.suspended and h.cache.pins("lm") == 1


def test_a_member_ending_where_its_batch_is_suspended_ends_and_never_resumes() -> None:
    h = Harness()
    h.lanes.preempt = True
    a, last = gen("a"), gen("last")
    last.done_steps, last.expected_s = 9, 0.1  # resumed earlier: one step left
    h.steps(h.lanes.submit(a, 0.0))
    h.steps(h.lanes.submit(last, 0.0))
    quick = gen("short", group=None, expected_s=0.05, arrival=0.05)
    quick.steps, quick.best_s = 1, 0.05
    h.steps(h.lanes.submit(quick, 0.05))
    decided = h.steps(h.lanes.stepped(a, 1, 0.1))  # both suspended, as far as the core knows
    assert [s.entry for s in decided if isinstance(s, SuspendTask)] == [a, last]
    h.steps(h.lanes.ended(last, 0.1))  # but its steps were done at that boundary
    assert list(h.lanes.suspended) == [a] and last not in list(h.lanes.queue)
    assert h.cache.pins("lm") == 2  # a's and the short job's
    resumed = h.steps(h.lanes.ended(quick, 0.15)) + h.steps(h.lanes.fill(0.15))
    (run,) = [s for s in resumed if isinstance(s, RunTask)]
    assert (run.entry, run.mates) == (a, ())


def test_a_batch_is_not_suspended_when_a_member_would_miss_its_deadline() -> None:
    h = Harness()
    h.lanes.preempt = True
    a, b = gen("a"), gen("b", deadline=1.15)  # b's batch ends about 1.1 s: 0.05 s to spare
    h.steps(h.lanes.submit(a, 0.0))
    h.steps(h.lanes.submit(b, 0.0))
    quick = gen("short", group=None, expected_s=0.1, arrival=0.15)
    quick.steps, quick.best_s = 1, 0.1
    h.steps(h.lanes.submit(quick, 0.15))
    assert h.steps(h.lanes.stepped(a, 2, 0.2)) == []
    # without b's deadline the same batch gives way
    h2 = Harness()
    h2.lanes.preempt = True
    a2, b2 = gen("a"), gen("b")
    h2.steps(h2.lanes.submit(a2, 0.0))
    h2.steps(h2.lanes.submit(b2, 0.0))
    quick2 = gen("short", group=None, expected_s=0.1, arrival=0.15)
    quick2.steps, quick2.best_s = 1, 0.1
    h2.steps(h2.lanes.submit(quick2, 0.15))
    assert len(h2.steps(h2.lanes.stepped(a2, 2, 0.2))) == 3


def test_a_batch_is_not_suspended_unless_every_members_state_fits() -> None:
    h = Harness()  # 3 GB free beside the model: 12 slabs of 0.25 GB
    a, b, _ = batch_of_two_and_a_short_job(h)
    for member in (a, b):
        member.state_bytes = 1_200_000_000  # a after 2 steps: 10 slabs; b after 1: 5
    assert h.steps(h.lanes.stepped(a, 2, 0.2)) == []
    assert h.lanes.refused_for_state == 1 and h.cache.state_bytes == 0  # nothing kept
    b.state_bytes = 250_000_000  # now 10 + 2 slabs (b after 2 steps)
    decided = h.steps(h.lanes.stepped(b, 2, 0.3))
    assert [type(s).__name__ for s in decided] == ["SuspendTask", "SuspendTask", "RunTask"]
    assert h.cache.state_bytes == 12 * GB // 4


def test_a_resumed_members_last_step_is_its_last() -> None:
    h = Harness()
    h.lanes.preempt = True
    entry = gen("resumed")
    entry.done_steps, entry.expected_s = 8, 0.2  # two steps left
    h.steps(h.lanes.submit(entry, 0.0))
    h.steps(h.lanes.submit(gen("short", group=None, expected_s=0.01, arrival=0.0), 0.0))
    # after its second step of this run nothing is left: it ends, it is not suspended
    assert h.steps(h.lanes.stepped(entry, 2, 0.2)) == []


def test_with_two_lanes_tasks_join_whichever_batch_of_their_group_is_still_running() -> None:
    h = Harness()
    h.lanes = Lanes(lanes=2, cache=h.cache)
    a, b = gen("a"), gen("b")
    h.steps(h.lanes.submit(a, 0.0))
    h.steps(h.lanes.submit(b, 0.0))  # the second lane is idle: a batch of its own
    assert h.lanes.busy == 2
    (join,) = h.steps(h.lanes.submit(gen("c", arrival=0.1), 0.1))
    assert isinstance(join, JoinRun) and join.lead is a  # the first with room
    h.steps(h.lanes.ended(b, 0.5))  # the second batch is over; the first still runs
    h.steps(h.lanes.submit(gen("p", group=None, arrival=0.5), 0.5))  # on the lane it freed
    (join,) = h.steps(h.lanes.submit(gen("d", arrival=0.6), 0.6))
    assert isinstance(join, JoinRun) and join.lead is a
