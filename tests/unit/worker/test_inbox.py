"""The inbox gathers a task's inputs; a join waits for every predecessor."""

from __future__ import annotations

import random

from compass.core.jobs import JOB_INPUTS, Inbox, InboxEntry
from compass.core.messages import TaskMsg
from compass.workflow.dag import Task, TaskProfile, Workflow

P = TaskProfile(exec_ms=1.0, output_bytes=8)


def diamond() -> Workflow:
    return Workflow(
        "diamond",
        [
            Task("a", None, (), P),
            Task("b", None, ("a",), P),
            Task("c", None, ("a",), P),
            Task("d", None, ("b", "c"), P),
        ],
    )


def add(
    inbox: Inbox,
    task: str,
    source: str,
    value: object,
    attempt: int = 0,
    plan: dict[str, str] | None = None,
    transfer_s: float = 0.0,
) -> InboxEntry | None:
    msg = TaskMsg(
        job="j1",
        attempt=attempt,
        workflow="diamond",
        task=task,
        source=source,
        value=value,
        plan=dict(plan or {"a": "w0"}),
        ingress="w0",
    )
    return inbox.add(msg, diamond(), transfer_s=transfer_s, now=0.0)


def test_root_gets_the_job_inputs_at_once() -> None:
    inbox = Inbox()
    entry = add(inbox, "a", JOB_INPUTS, {"x": 1, "y": 2})
    assert entry is not None
    assert entry.inputs == {"x": 1, "y": 2}
    assert len(inbox) == 0


def test_join_waits_for_every_predecessor_and_keeps_the_freshest_plan() -> None:
    inbox = Inbox()
    assert add(inbox, "d", "b", 10, plan={"d": "w1", "b": "w1"}, transfer_s=0.2) is None
    assert len(inbox) == 1
    assert add(inbox, "d", "b", 11) is None  # a repeat replaces, it does not complete
    entry = add(inbox, "d", "c", 20, plan={"c": "w2"}, transfer_s=0.1)
    assert entry is not None
    assert entry.inputs == {"b": 11, "c": 20}
    assert entry.plan["c"] == "w2" and entry.plan["d"] == "w1"
    assert entry.transfer_s == 0.2  # the slowest input
    assert len(inbox) == 0


def test_inputs_from_a_non_predecessor_are_ignored() -> None:
    inbox = Inbox()
    assert add(inbox, "d", "a", 1) is None
    assert add(inbox, "d", "b", 2) is None
    assert add(inbox, "d", "c", 3) is not None


def test_drop_job_removes_stale_attempts_only() -> None:
    inbox = Inbox()
    add(inbox, "d", "b", 1, attempt=0)
    add(inbox, "d", "b", 1, attempt=1)
    assert inbox.drop_job("j1", below_attempt=1) == 1
    assert len(inbox) == 1
    assert add(inbox, "d", "c", 2, attempt=1) is not None
    assert inbox.drop_job("j1") == 0


def test_a_task_of_one_input_is_whole_with_it_and_never_waits() -> None:
    inbox = Inbox()
    entry = add(inbox, "b", "a", 7, plan={"b": "w1"}, transfer_s=0.3)
    assert entry is not None and len(inbox) == 0
    assert entry.needed == frozenset({"a"}) and entry.arrived == {"a"}
    assert entry.inputs == {"a": 7} and entry.transfer_s == 0.3
    assert entry.plan == {"b": "w1"} and entry.ingress == "w0" and entry.workflow == "diamond"
    inputs = {"x": 1}
    root = add(inbox, "a", JOB_INPUTS, inputs)
    assert root is not None and root.needed == frozenset({JOB_INPUTS})
    inputs["x"] = 2  # the entry holds a copy of the job's inputs
    assert root.inputs == {"x": 1}
    # an input from a task that does not feed it is kept aside, as for a join
    assert add(inbox, "b", "c", 1) is None and len(inbox) == 1


def test_a_job_is_looked_for_only_where_it_has_entries() -> None:
    # the count of entries per job follows every way in and out (a join waiting, completed,
    # dropped by job or by ingress): drop_job finds what a look through the entries finds
    rng = random.Random(9)
    inbox = Inbox()
    jobs, ingresses = ["j1", "j2", "j3"], ["w0", "w1"]
    for _ in range(3_000):
        op, job = rng.random(), rng.choice(jobs)
        if op < 0.6:
            msg = TaskMsg(job=job, attempt=rng.randrange(2), workflow="diamond", task="d",
                          source=rng.choice("bc"), value=1, plan={"d": "w0"},
                          ingress=rng.choice(ingresses))  # fmt: skip
            inbox.add(msg, diamond(), transfer_s=0.0, now=0.0)
        elif op < 0.85:
            below = rng.choice((None, 1))
            expected = sum(
                1
                for j, attempt, _ in inbox._entries
                if j == job and (below is None or attempt < below)
            )
            assert inbox.drop_job(job, below) == expected
        else:
            inbox.drop_ingress(rng.choice(ingresses))
        for j in jobs:
            assert (j in inbox._jobs) == any(key[0] == j for key in inbox._entries)
            assert inbox._jobs.get(j, 0) == sum(1 for key in inbox._entries if key[0] == j)


def test_entries_waiting_past_their_keep_expire_oldest_first_and_only_those() -> None:
    inbox = Inbox(keep_s=10.0)
    wf = diamond()
    for n, now in enumerate((0.0, 4.0, 9.0)):
        msg = TaskMsg(f"j{n}", 0, "diamond", "d", "b", n, {"d": "w0"}, "w0")
        assert inbox.add(msg, wf, transfer_s=0.0, now=now) is None
    assert inbox.expire(9.5) == []
    expired = inbox.expire(14.5)  # j0 and j1 waited over 10 s; j2 not yet
    assert [key for key, _ in expired] == [("j0", 0, "d"), ("j1", 0, "d")]
    assert [entry.first_at for _, entry in expired] == [0.0, 4.0]
    assert len(inbox) == 1 and inbox.drop_job("j0") == 0  # gone, job index too
    assert [key for key, _ in inbox.expire(100.0)] == [("j2", 0, "d")]
    assert len(inbox) == 0


def test_an_inbox_keeps_its_entries_forever_by_default() -> None:
    inbox = Inbox()
    add(inbox, "d", "b", 1)
    assert inbox.expire(1e12) == [] and len(inbox) == 1
