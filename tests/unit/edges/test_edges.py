"""Streamed edges without a loop: the declaration (``Stream``), the worker core's rules
(:mod:`compass.core.edges`), the planner's finish estimate and the reader a task gets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import compass
from compass import Stream
from compass.config import WorkerConfig
from compass.core.edges import StreamedEdges, keep_fed
from compass.core.events import Feed, Send, StopTask, TaskStep
from compass.core.lanes import RunTask
from compass.core.messages import ChunkMsg, DoneMsg, FailedMsg, TaskMsg
from compass.core.queue import QueuedTask
from compass.errors import JobFailed, WorkflowError
from compass.sched import ViewSnapshot, make_policy
from compass.worker.executor import TaskOutcome, TaskRunner
from compass.worker.feeds import Feeds
from compass.worker.windows import StreamedSteps
from compass.workflow import Task, TaskProfile, Workflow

from ..sched.test_planner import job, profiles, worker
from ..worker import test_state
from ..worker.test_state import core, of, received

# -- declaring a streamed edge ----------------------------------------------------------------


def gen(model: Any, x: int) -> Iterator[int]:
    yield from range(x)


def plain(model: Any, x: int) -> int:
    return x


def reads(model: Any, items: Any) -> int:
    return sum(items)


def test_stream_in_after_marks_the_edge_and_names_the_parameter() -> None:
    app = compass.App("edges")
    flow = app.workflow("flow", inputs=["x"])
    flow.task(name="g", steps=4, step_ms=1.0)(gen)
    flow.task(name="r", after={"g": Stream("items")})(reads)
    flow.task(name="s", after={"g": Stream()})(lambda model, g: 0)
    wf = app.get_workflow("flow")
    assert wf.tasks["r"].streamed == {"g"} and wf.tasks["r"].params == {"g": "items"}
    assert wf.tasks["s"].streamed == {"g"} and not wf.tasks["s"].params
    assert wf.streamed_succs("g") == ("r", "s")


def test_a_stream_is_refused_where_it_cannot_be() -> None:
    app = compass.App("edges")
    flow = app.workflow("flow", inputs=["x"])
    flow.task(name="p")(plain)
    flow.task(name="r", after={"p": Stream("items")})(reads)
    with pytest.raises(WorkflowError, match="'p' does not run in steps"):
        app.get_workflow("flow")
    with pytest.raises(WorkflowError, match="only 'after' streams"):
        compass.App("x").workflow("f").task(name="t", inputs={"x": Stream()})(plain)
    profile = TaskProfile(exec_ms=1, output_bytes=0)
    with pytest.raises(WorkflowError, match="not in its 'after'"):
        Task("r", None, ("g",), profile, streamed=frozenset({"h"}))
    with pytest.raises(WorkflowError, match="fed by a stream does not batch"):
        Task("r", "m", ("g",), profile, batch=4, streamed=frozenset({"g"}))


# -- the worker core --------------------------------------------------------------------------

STREAMED = Workflow(
    "streamed",
    [
        Task("a", "m", (), TaskProfile(exec_ms=100, output_bytes=4000, steps=4)),
        Task(
            "b", "m", ("a",), TaskProfile(exec_ms=100, output_bytes=1000), streamed=frozenset("a")
        ),
    ],
)
PLAN = {"a": "a", "b": "b"}


@pytest.fixture(autouse=True)
def streamed_workflow() -> Iterator[None]:
    test_state.WORKFLOWS["streamed"] = STREAMED
    yield
    del test_state.WORKFLOWS["streamed"]


def opening(job: str, value: Any = "c0", opens: bool = True) -> TaskMsg:
    return TaskMsg(job, 0, "streamed", "b", "a", value, dict(PLAN), "a", opens=opens)


def test_a_producer_sends_its_first_step_as_the_input_and_the_rest_as_chunks() -> None:
    c, _ = core("a", ("a", "b"))
    entry = QueuedTask("a-1", 0, "streamed", "a", "m", 0.1, {}, dict(PLAN), "a", 0.0)
    first = of(Send, c.handle(TaskStep(0.0, entry, 0, "c0")))
    (msg,) = [s.msg for s in first]
    assert first[0].peer == "b" and isinstance(msg, TaskMsg)
    assert msg.opens and msg.task == "b" and msg.source == "a" and msg.value == "c0"
    later = [s.msg for s in of(Send, c.handle(TaskStep(0.01, entry, 1, "c1")))]
    assert later == [ChunkMsg("a-1", 0, "a", 1, "c1", to="b")]
    assert TaskMsg.from_wire(msg.to_wire()) == msg  # the flags travel
    assert ChunkMsg.from_wire(later[0].to_wire()) == later[0]


def test_the_successor_is_ready_at_the_first_chunk_and_reads_the_rest_in_order() -> None:
    c, _ = core("b", ("a", "b"))
    steps = c.handle(received(opening("a-1"), sender="a"))
    feed = of(Feed, steps)
    assert [(f.seq, f.value, f.last) for f in feed] == [(0, "c0", False)]
    runs = [s for s in steps if type(s).__name__ == "RunTask"]
    assert runs and steps.index(feed[0]) < steps.index(runs[0]), "fed before it runs"
    chunk = of(Feed, c.handle(received(ChunkMsg("a-1", 0, "a", 1, "c1", to="b"), sender="a")))
    assert [(f.seq, f.value) for f in chunk] == [(1, "c1")]
    end = of(Feed, c.handle(received(opening("a-1", "all", opens=False), sender="a")))
    assert [(f.last, f.value, f.error) for f in end] == [(True, "all", None)]
    assert not of(Send, c.handle(received(opening("a-1", "again", opens=False), sender="a")))


def test_a_gap_in_a_stream_fails_its_job_at_the_ingress() -> None:
    c, _ = core("b", ("a", "b"))
    c.handle(received(opening("a-1"), sender="a"))
    steps = c.handle(received(ChunkMsg("a-1", 0, "a", 2, "c2", to="b"), sender="a"))
    assert not of(Feed, steps)
    (sent,) = of(Send, steps)
    assert sent.peer == "a" and isinstance(sent.msg, FailedMsg)
    assert sent.msg.code == "protocol" and "step 2" in sent.msg.message


def test_a_job_that_ends_breaks_its_open_streams_and_stops_its_task() -> None:
    c, _ = core("b", ("a", "b"))
    c.handle(received(opening("a-1"), sender="a"))
    steps = c.handle(received(DoneMsg("a-1"), sender="a"))
    (broke,) = of(Feed, steps)
    assert isinstance(broke.error, JobFailed) and broke.task == "b"
    assert of(StopTask, steps)
    assert len(c.edges) == 0
    # a chunk of it late: nothing
    assert not c.handle(received(ChunkMsg("a-1", 0, "a", 1, "c1", to="b"), sender="a"))


def test_a_stream_that_never_stepped_opens_and_ends_with_its_end() -> None:
    c, _ = core("b", ("a", "b"))
    steps = c.handle(received(opening("a-2", "none", opens=False), sender="a"))
    assert [(f.last, f.value) for f in of(Feed, steps)] == [(True, "none")]
    assert any(type(s).__name__ == "RunTask" for s in steps)


def test_streams_are_forgotten_once_task_and_streams_ended() -> None:
    edges = StreamedEdges()
    edges.input(opening("j"), "c")
    entry = QueuedTask("j", 0, "streamed", "b", "m", 0.1, {}, dict(PLAN), "a", 0.0)
    edges.task_ended(entry)  # it returned without reading to the end
    assert len(edges) == 1
    assert edges.chunk(ChunkMsg("j", 0, "a", 1, "c1", to="b"), "c") is None  # nobody reads
    assert edges.input(opening("j", opens=False), "c") == (False, [])
    assert len(edges) == 0


def test_dynamic_adjustment_never_moves_a_fed_task() -> None:
    adjusted = {"a": "a", "b": "c"}
    keep_fed(STREAMED, PLAN, adjusted)
    assert adjusted == PLAN


# -- the planner ------------------------------------------------------------------------------


def pipeline(streamed: bool) -> Workflow:
    return Workflow(
        "pipe" if streamed else "plain",
        [
            Task("g", "m", (), TaskProfile(exec_ms=1000, output_bytes=10_000_000, steps=100)),
            Task("t", "m", ("g",), TaskProfile(exec_ms=1000, output_bytes=1000, steps=100),
                 streamed=frozenset({"g"} if streamed else ())),
        ],
    )  # fmt: skip


def test_the_planner_starts_a_streamed_successor_at_the_first_step_on_another_worker() -> None:
    view = ViewSnapshot.build([worker("a", models=("m",)), worker("b", models=("m",))])
    compass_policy = make_policy("compass")
    plain, streamed = pipeline(False), pipeline(True)
    # plain: the successor waits for the end anyway, and its 10 MB input stays put
    assert compass_policy.plan(job(plain), view, profiles(plain), 0.0) == {"g": "a", "t": "a"}
    # streamed: on the other worker it starts after one step (100 kB on the wire), where the
    # generator's lane would hold it for the whole second
    assert compass_policy.plan(job(streamed), view, profiles(streamed), 0.0) == {
        "g": "a",
        "t": "b",
    }


# -- the reader a task gets -------------------------------------------------------------------


def feed(job: str, seq: int, value: Any = None, last: bool = False, error: Any = None) -> Feed:
    return Feed(job, 0, "b", "a", seq, value, last, error)


def test_a_reader_yields_in_order_ends_with_its_stream_and_raises_when_it_breaks() -> None:
    feeds = Feeds()
    entry = QueuedTask("j", 0, "streamed", "b", "m", 0.1, {}, dict(PLAN), "a", 0.0)
    feeds.apply(feed("j", 0, "c0"))
    (reader,) = feeds.readers(entry, ["a"]).values()
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.extend(reader))  # reads as a task would
    thread.start()
    feeds.apply(feed("j", 1, "c1"))
    feeds.apply(feed("j", -1, "final", last=True))
    thread.join(10)
    assert got == ["c0", "c1"] and list(reader) == []
    feeds.discard(entry)
    assert len(feeds) == 0

    other = QueuedTask("k", 0, "streamed", "b", "m", 0.1, {}, dict(PLAN), "a", 0.0)
    feeds.apply(feed("k", 0, "c0"))
    (broken,) = feeds.readers(other, ["a"]).values()
    feeds.apply(Feed("k", 0, "b", "", -1, None, True, JobFailed("gone")))

    async def read_async() -> list[Any]:
        return [item async for item in broken]

    with pytest.raises(JobFailed, match="gone"):
        asyncio.run(read_async())
    assert len(feeds) == 0


def test_an_emulated_reader_waits_for_its_streams_to_end() -> None:
    feeds = Feeds()
    entry = QueuedTask("j", 0, "streamed", "b", "m", 0.1, {}, dict(PLAN), "a", 0.0)
    feeds.readers(entry, ["a"])
    ended: list[bool] = []
    assert feeds.when_ended(entry, lambda: ended.append(True))
    feeds.apply(feed("j", 0, "c0"))
    assert not ended
    feeds.apply(feed("j", -1, "all", last=True))
    assert ended == [True]
    assert not feeds.when_ended(entry, lambda: ended.append(False))  # ended already


@pytest.mark.asyncio
async def test_an_emulated_fed_task_ends_after_its_stream_and_its_producer_tells_steps() -> None:
    app = compass.App("emulated")
    flow = app.workflow("flow", inputs=["x"])
    flow.task(name="g", steps=4, step_ms=5.0)(gen)
    flow.task(name="r", after={"g": Stream("items")}, expected_ms=1.0)(reads)
    outcomes: asyncio.Queue[TaskOutcome] = asyncio.Queue()
    told: list[tuple[str, int]] = []

    class Told(StreamedSteps):
        """The steps reported, no worker behind them (no sink here streams to a caller)."""

        def __init__(self) -> None:
            pass

        def report(self, entry: QueuedTask, seq: int, value: object) -> None:
            told.append((entry.task, seq))

        def open(self, entry: QueuedTask) -> None:
            return None

    runner = TaskRunner(
        lookup=lambda wf, task: app.get_workflow(wf).tasks[task],
        module_of=lambda model: None,
        config=WorkerConfig(name="w", emulate=True),
        on_outcome=outcomes.put_nowait,
        on_returned=lambda entry: None,
        streamed=Told(),
    )
    runner.workflows = app.get_workflow
    plan = {"g": "w", "r": "w"}
    producer = QueuedTask("j", 0, "flow", "g", None, 0.02, {"x": 1}, plan, "w", 0.0)
    fed = QueuedTask("j", 0, "flow", "r", None, 0.001, {"g": None}, plan, "w", 0.0)
    runner.start(RunTask(producer, 0, True, 0.0, None))
    runner.feeds.apply(Feed("j", 0, "r", "g", 0, "c0"))
    runner.start(RunTask(fed, 1, True, 0.0, None))
    first = await asyncio.wait_for(outcomes.get(), 30)
    assert first.entry is producer, "the 1 ms task waited for its stream's end"
    assert told == [("g", 0), ("g", 1), ("g", 2), ("g", 3)]  # a job that does not stream
    runner.feeds.apply(Feed("j", 0, "r", "g", -1, "all", True))
    second = await asyncio.wait_for(outcomes.get(), 30)
    assert second.entry is fed and second.error is None
    assert len(runner.feeds) == 0
