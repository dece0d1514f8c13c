"""The ring of recent task spans and answered jobs, with hand-driven clocks: what one span
holds, times on an emulated worker's clock, the bound, and the reads by window."""

from __future__ import annotations

import pytest

from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import CompassTimeout
from compass.observe.timeline import (
    JOB_FIELDS,
    LOAD_FIELDS,
    SPAN_FIELDS,
    JobEnd,
    TaskSpan,
    Timeline,
    rows,
)


class Clocks:
    """A worker clock and a wall clock that move together (``scale``: workload seconds per
    real second is ``1 / scale``)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.real = 0.0
        self.scale = scale

    def worker(self) -> float:
        return self.real / self.scale

    def wall(self) -> float:
        return 1_700_000_000.0 + self.real


def entry(job: str = "w0:a-1", model: str | None = "m", **times: float) -> QueuedTask:
    return QueuedTask(
        job_id=job,
        attempt=1,
        workflow="wf",
        task="t",
        model=model,
        expected_s=0.1,
        inputs={},
        plan={},
        ingress="w0",
        enqueued_at=times.get("enqueued_at", 0.0),
        started_at=times.get("started_at", 0.0),
        transfer_s=times.get("transfer_s", 0.0),
    )


def timeline(clocks: Clocks, **kwargs: int) -> Timeline:
    return Timeline(clock=clocks.worker, time_scale=clocks.scale, wall=clocks.wall, **kwargs)


@pytest.mark.parametrize("scale", [1.0, 0.02])
def test_a_span_holds_wall_clock_times_and_real_seconds(scale: float) -> None:
    clocks = Clocks(scale)
    ring = timeline(clocks)
    # on the worker's clock: queued at 10, a lane at 12, its model 0.5 later, ended at 13
    task = entry(enqueued_at=10.0, started_at=12.0, transfer_s=0.25)
    clocks.real = 13.0 * scale
    outcome = TaskOutcome(task, fetch_s=0.5, exec_s=0.5, cache_hit=False, batch=3, lane=2)
    ring.task_ended(outcome)
    (span,) = ring.spans
    end = clocks.wall()
    assert span.end == end
    times = (span.queued, span.start, span.fetch_s, span.transfer_s, span.exec_s)
    assert times == pytest.approx(
        (end - 3.0 * scale, end - 1.0 * scale, 0.5 * scale, 0.25 * scale, 0.5 * scale)
    )
    zeroed = span._replace(queued=0.0, start=0.0, fetch_s=0.0, transfer_s=0.0, exec_s=0.0)
    assert zeroed == TaskSpan(
        seq=1, job="w0:a-1", attempt=1, workflow="wf", task="t", model="m", queued=0.0,
        start=0.0, end=end, fetch_s=0.0, transfer_s=0.0, batch=3, cache_hit=False, error="",
        lane=2, exec_s=0.0,
    )  # fmt: skip


def test_a_failed_task_names_its_error_and_a_model_less_one_no_cache_hit() -> None:
    clocks = Clocks()
    ring = timeline(clocks)
    ring.task_ended(TaskOutcome(entry(model=None), output=1))
    ring.task_ended(TaskOutcome(entry(), error=CompassTimeout("too long")))
    first, second = ring.spans
    assert (first.cache_hit, first.error) == (None, "")
    assert (second.cache_hit, second.error, second.seq) == (True, "CompassTimeout", 2)
    assert ring.recorded == 2


def test_the_rings_are_bounded_and_reads_take_the_window_newest_last() -> None:
    clocks = Clocks()
    ring = timeline(clocks, max_spans=5, max_jobs=3)
    for second in range(8):
        clocks.real = float(second)
        ring.task_ended(TaskOutcome(entry(job=f"j{second}")))
        ring.job_answered(f"j{second}", "wf", 0.1, 0.2, "met")
    assert [s.job for s in ring.spans] == ["j3", "j4", "j5", "j6", "j7"]
    assert ring.recorded == 8  # seq keeps counting past the bound
    assert [j.job for j in ring.jobs] == ["j5", "j6", "j7"]
    spans, cut = ring.recent_spans(2.0, limit=10)  # ended at 5, 6, 7; now is 7
    assert ([s.job for s in spans], cut) == (["j5", "j6", "j7"], False)
    spans, cut = ring.recent_spans(100.0, limit=2)  # the newest two, and it says so
    assert ([s.job for s in spans], cut) == (["j6", "j7"], True)
    jobs, cut = ring.recent_jobs(0.5, limit=10)
    assert ([j.job for j in jobs], cut) == (["j7"], False)
    assert ring.recent_spans(100.0, limit=0) == ([], True)


def test_rows_are_field_lists_rounded_to_microseconds() -> None:
    span = TaskSpan(7, "j", 0, "wf", "t", None, 1.23456789, 2.0, 3.0, 0.0, 0.1234567, 1, None, "")
    assert rows([span]) == [[7, "j", 0, "wf", "t", None, 1.234568, 2.0, 3.0, 0.0, 0.123457, 1,
                             None, "", 0, 0.0]]  # fmt: skip
    job = JobEnd("j", "wf", 5.0, 0.5, None, "ok", 2)
    assert dict(zip(JOB_FIELDS, rows([job])[0], strict=True))["priority"] == 2
    assert SPAN_FIELDS[:3] == ("seq", "job", "attempt") and len(SPAN_FIELDS) == 16
    assert SPAN_FIELDS[-2:] == ("lane", "exec_s")  # added last: readers index by name


def test_loads_are_kept_and_export_pages_through_the_spans() -> None:
    clocks = Clocks()
    ring = timeline(clocks, max_spans=4)
    clocks.real = 5.0
    ring.load_ended("m", start=clocks.wall() - 2.0, prefetch=True)
    ring.load_ended("n", start=clocks.wall() - 1.0, prefetch=False, error="CacheError")
    assert [(load.seq, load.model, load.prefetch, load.error) for load in ring.loads] == [
        (1, "m", True, ""), (2, "n", False, "CacheError"),
    ]  # fmt: skip
    assert ring.loads[0].end - ring.loads[0].start == pytest.approx(2.0)
    for i in range(3):
        ring.task_ended(TaskOutcome(entry(job=f"j{i}"), lane=i))
    first = ring.export(after=0, limit=2)
    spans = [dict(zip(first["span_fields"], row, strict=True)) for row in first["spans"]]
    assert [s["job"] for s in spans] == ["j0", "j1"] and [s["lane"] for s in spans] == [0, 1]
    assert first["more"] and not first["lost"]
    assert [row[1] for row in first["loads"]] == ["m", "n"]
    assert first["load_fields"] == list(LOAD_FIELDS)
    rest = ring.export(after=spans[-1]["seq"], limit=2)
    assert [row[1] for row in rest["spans"]] == ["j2"] and not rest["more"]
    for i in range(3, 8):  # the ring keeps 4: spans 1-4 fall off
        ring.task_ended(TaskOutcome(entry(job=f"j{i}")))
    late = ring.export(after=3, limit=10)
    assert late["lost"] and [row[0] for row in late["spans"]] == [5, 6, 7, 8]
    assert not ring.export(after=4, limit=10)["lost"]
