"""Learned admission (:class:`~compass.core.admission.AdmittedShare`), without a loop: an
ingress that saw the jobs of a kind it admitted dropped on the way admits fewer of that kind,
spread evenly, and more again as those it admits make their deadlines; other kinds, failures
that are not deadlines, and the plan-only admission (the default) are left alone."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from compass.config import SchedConfig
from compass.core.admission import (
    DROPS_TARGET,
    KINDS_KEPT,
    MIN_SHARE,
    SHARE_STEP,
    AdmittedShare,
    work_before,
)
from compass.core.events import Answer, Send
from compass.core.messages import FailedMsg, ResultMsg, TaskMsg
from compass.errors import ConfigError, DeadlineUnreachable
from compass.objective import Objective

from .test_objective import submit_with
from .test_state import core, of, received


def _admitted(share: AdmittedShare, n: int, workflow: str = "wf", priority: int = 0) -> list[bool]:
    return [share.admits(workflow, priority) for _ in range(n)]


def test_a_kind_never_dropped_is_always_admitted() -> None:
    share = AdmittedShare()
    assert all(_admitted(share, 50))
    for _ in range(20):
        share.observe("wf", 0, dropped=False)
    assert share.share("wf", 0) == 1.0 and all(_admitted(share, 50))


def test_drops_lower_the_share_admitted_and_it_is_spread_evenly() -> None:
    share = AdmittedShare()
    for _ in range(10):
        share.observe("wf", 0, dropped=True)
    assert share.share("wf", 0) == pytest.approx(1.0 - 10 * SHARE_STEP)  # a half
    admitted = _admitted(share, 20)
    assert sum(admitted) == 10
    assert all(a != b for a, b in itertools.pairwise(admitted))  # every other one
    # another kind (a priority, a workflow) keeps its own share
    assert all(_admitted(share, 10, priority=1)) and all(_admitted(share, 10, workflow="other"))
    # never below the least share: some always run, so the share can recover
    for _ in range(100):
        share.observe("wf", 0, dropped=True)
    assert share.share("wf", 0) == pytest.approx(MIN_SHARE)
    assert sum(_admitted(share, 100)) == pytest.approx(100 * MIN_SHARE, abs=1)


def test_the_share_settles_where_the_target_share_of_the_admitted_are_dropped() -> None:
    share = AdmittedShare()
    for _ in range(10):
        share.observe("wf", 0, dropped=True)
    before = share.share("wf", 0)
    # one drop for every (1 - target) / target made in time: the share holds
    in_time = round((1 - DROPS_TARGET) / DROPS_TARGET)
    for _ in range(5):
        share.observe("wf", 0, dropped=True)
        for _ in range(in_time):
            share.observe("wf", 0, dropped=False)
    assert share.share("wf", 0) == pytest.approx(before)
    # fewer drops than the target: back to admitting all
    for _ in range(500):
        share.observe("wf", 0, dropped=False)
    assert share.share("wf", 0) == 1.0 and all(_admitted(share, 20))


def test_the_kinds_remembered_are_bounded() -> None:
    share = AdmittedShare()
    for i in range(KINDS_KEPT + 10):
        share.observe(f"wf{i}", 0, dropped=True)
    assert len(share._share) <= KINDS_KEPT and len(share._credit) <= KINDS_KEPT


def test_the_target_and_the_setting_are_checked() -> None:
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        AdmittedShare(target=1.0)
    with pytest.raises(ConfigError, match="--admission must be one of plan, learned"):
        SchedConfig(admission="guess")


def _drop(c: Any, job: str, now: float, task: str = "b") -> None:
    """``job`` (a chain a -> b of 100 ms each) dropped at ``task`` (at b: half its work ran)."""
    why = f"DeadlineExceeded: job x: task '{task}' would start 12.0 ms too late; dropped"
    c.handle(received(FailedMsg(job, 0, task, "b", why, "", "deadline_exceeded"), now, "b"))


def _submitted(c: Any, objective: Objective, now: float) -> tuple[str, Answer | None]:
    job, steps = submit_with(c, objective, now)
    answers = of(Answer, steps)
    return job, answers[0] if answers else None


@pytest.mark.parametrize("admission", ["plan", "learned"])
def test_an_ingress_that_saw_its_jobs_dropped_admits_fewer_of_that_kind(admission: str) -> None:
    c, view = core("a", ("a", "b"), admission=admission)
    view.waits.update(a=100.0, b=0.0)  # planned on b, well within the deadline
    low = Objective(deadline_s=30.0)
    now = 0.0
    answers = []
    for _ in range(20):  # every one admitted is dropped on the way
        now += 1.0
        job, refused = _submitted(c, low, now)
        answers.append(refused)
        if refused is None:
            _drop(c, job, now + 0.5)
    refusals = [a for a in answers if a is not None]
    if admission == "plan":  # the plan's estimate alone: every one admitted
        assert not refusals and c.stats.jobs_unreachable == 0
        return
    assert 3 <= len(refusals) <= 12 and c.stats.jobs_unreachable == len(refusals)
    assert all(a is None for a in answers[:2])  # the first ones, before any lesson
    first = refusals[0]
    assert isinstance(first.error, DeadlineUnreachable)
    assert "dropped before their deadline" in first.error.message
    assert first.error.detail["share"] < 1.0
    # a job of a higher priority is its own kind: admitted
    job, refused = _submitted(c, Objective(deadline_s=30.0, priority=1), now + 1.0)
    assert refused is None and job in c.ingress.jobs


def test_only_jobs_answered_in_time_or_dropped_teach_it() -> None:
    c, view = core("a", ("a", "b"), admission="learned")
    view.waits.update(a=100.0, b=0.0)
    learned = c.ingress.learned
    assert learned is not None
    job, _ = _submitted(c, Objective(deadline_s=30.0), 0.0)
    # a task failed (not its deadline): no lesson about admission
    failed = FailedMsg(job, 0, "b", "b", "ValueError: bad", "", "job_failed")
    c.handle(received(failed, 1.0, "b"))
    assert job not in c.ingress.jobs and learned.share("chain", 0) == 1.0
    # dropped at its first task: nothing of it ran, nothing lost
    job, _ = _submitted(c, Objective(deadline_s=30.0), 1.5)
    _drop(c, job, 1.8, task="a")
    assert job not in c.ingress.jobs and learned.share("chain", 0) == 1.0
    # dropped at b, after a ran (half its work): the share falls by half a step
    job, _ = _submitted(c, Objective(deadline_s=30.0), 2.0)
    _drop(c, job, 3.0)
    assert learned.share("chain", 0) == pytest.approx(1.0 - SHARE_STEP / 2)
    job, steps = submit_with(c, Objective(deadline_s=30.0), 4.0)
    sent = [s.msg for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]
    assert sent  # admitted and sent
    c.handle(received(ResultMsg(job, 0, "b", "out"), 5.0, "b"))
    assert job not in c.ingress.jobs and learned.share("chain", 0) > 1.0 - SHARE_STEP / 2


def test_the_work_lost_with_a_dropped_task_is_that_of_the_tasks_before_it() -> None:
    from .test_state import WORKFLOWS

    diamond = WORKFLOWS["diamond"]
    order = list(diamond.order)
    first, last = order[0], order[-1]
    seconds = dict.fromkeys(order, 1.0)
    assert work_before(diamond, first, seconds.__getitem__) == 0.0
    # the last task waits for every other, directly or not
    assert work_before(diamond, last, seconds.__getitem__) == pytest.approx(
        (len(order) - 1) / len(order)
    )
    assert work_before(diamond, None, seconds.__getitem__) == 1.0  # late: all of it ran
    assert work_before(diamond, "nowhere", seconds.__getitem__) == 1.0
