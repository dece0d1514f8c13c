"""Task messages carry the weights version their job was planned with (issue 39, item 3's
edge): a worker of another version refuses the task, never runs it, and the job's ingress plans
it again without that worker. Sans-IO: the worker core alone."""

from __future__ import annotations

from compass.core.events import RunTask, Send
from compass.core.messages import OTHER_VERSION, FailedMsg, TaskMsg, decode
from compass.workflow.versions import version_id

from .test_state import _job_on_peer, core, of, received, task_msg


def test_a_task_of_another_weights_version_is_refused_and_its_job_planned_without_it() -> None:
    # a plans on b, which restarted with other weights: a has not heard b's version yet
    a, a_view = core("a", ("a", "b", "c"))
    a_view.version_id = version_id("0123456789ab")
    job, root = _job_on_peer(a, a_view, "b")
    # the version leaves with the task, a few bytes of it, and arrives as it left
    arrived = decode("task", root.to_wire())
    assert isinstance(arrived, TaskMsg) and arrived.version == 0x01234567 == a_view.version_id
    b, b_view = core("b", ("a", "b", "c"))
    b_view.version_id = version_id("fedcba987654")
    steps = b.handle(received(arrived, 1.0, "a"))
    assert not of(RunTask, steps) and len(b.inbox) == 0  # never run with b's weights
    (refusal,) = of(Send, steps)
    assert refusal.peer == "a" and isinstance(refusal.msg, FailedMsg)
    assert refusal.msg.code == OTHER_VERSION and "another version" in refusal.msg.message
    # the ingress takes b out of its view (b's heartbeat will say its version) and plans the
    # job again, on c
    a_view.waits["c"] = 0.0
    steps = a.handle(received(refusal.msg, 2.0, "b"))
    assert a_view.removed == ["b"] and a.ingress.jobs[job].attempt == 1
    roots = [s for s in of(Send, steps) if isinstance(s.msg, TaskMsg)]
    assert [s.peer for s in roots] == ["c"] and roots[0].msg.version == a_view.version_id


def test_a_task_of_the_same_version_or_of_none_known_runs() -> None:
    ours = version_id("0123456789ab")
    for mine, sent in ((ours, ours), (0, ours), (ours, 0)):
        b, b_view = core("b", ("a", "b"))
        b_view.version_id = mine
        msg = task_msg(plan={"a": "b", "b": "b"})
        msg.stamp(sent)
        assert of(RunTask, b.handle(received(msg, 1.0, "w9"))), (mine, sent)
