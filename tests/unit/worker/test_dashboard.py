"""A worker's part of the dashboard without a loop or a socket: what it holds next to what
``compass status`` shows, the spans and jobs it recorded, and the checks of what it is asked."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from compass.config import WorkerConfig
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import DeadlineExceeded, InvalidInputs
from compass.observe import dashboard
from compass.observe.timeline import JOB_FIELDS, SPAN_FIELDS
from compass.worker.process import build_worker
from compass.worker.requests import describe
from compass.worker.server import Worker

PAPER = str(Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json")


@pytest.fixture
def worker() -> Worker:
    return build_worker(WorkerConfig(name="w0", workload=PAPER, metrics_port=0))


def entry(job: str) -> QueuedTask:
    return QueuedTask(
        job_id=job,
        attempt=0,
        workflow="translation",
        task="generate",
        model="opt",
        expected_s=0.5,
        inputs={},
        plan={},
        ingress="w0",
        enqueued_at=0.0,
    )


def by_field(fields: tuple[str, ...], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(fields, row, strict=True)) for row in rows]


def test_a_part_shows_what_status_shows_and_what_ran(worker: Worker) -> None:
    metrics = worker.metrics
    metrics.task_finished(TaskOutcome(entry("w0:x-1"), output=b"", exec_s=0.2, cache_hit=False))
    metrics.task_finished(TaskOutcome(entry("w0:x-2"), error=ValueError("bad")))
    answered = {"workflow": "translation", "ok": True, "latency_s": 0.5, "priority": 2}
    metrics.job_answered({**answered, "job": "w0:x-1", "deadline_s": 1.0}, None, waited=True)
    metrics.job_answered({**answered, "job": "w0:x-2", "deadline_s": 0.25}, None, waited=True)
    dropped = {**answered, "job": "w0:x-3", "deadline_s": 1.0, "ok": False}
    metrics.job_answered(dropped, DeadlineExceeded("late"), waited=True)
    metrics.job_answered({**answered, "job": "w0:x-4"}, None, waited=True)
    chose = {"taken": "route: expert_b; refine: 2 iterations", "skipped": ["expert_a", "refine@2"]}
    metrics.job_answered({**answered, "job": "w0:x-5", **chose}, None, waited=True)

    part = dashboard.local_view(worker, 60.0)
    status = describe(worker)
    assert part["queue"] == status["queue"]  # the same numbers, key for key
    assert part["name"] == status["name"] and part["instance"] == status["instance"]
    assert part["jobs_in_flight"] == status["jobs_in_flight"]
    resident = [m["name"] for m in part["cache"]["models"] if m["state"] == "resident"]
    assert resident == sorted(status["cache"]["resident"])
    assert part["cache"]["capacity_bytes"] == status["cache"]["capacity_bytes"]
    assert part["slo"] == status["slo"]
    assert part["state"] == "not ready"  # never started
    assert part["http"] is None and status["http"] is None  # no front door (--http-port)
    spans = by_field(SPAN_FIELDS, part["spans"])
    assert [(s["job"], s["cache_hit"], s["error"]) for s in spans] == [
        ("w0:x-1", False, ""),
        ("w0:x-2", True, "ValueError"),
    ]
    assert part["spans_recorded"] == 2 and not part["spans_truncated"]
    jobs = by_field(JOB_FIELDS, part["jobs"])
    assert [(j["job"], j["outcome"], j["priority"]) for j in jobs] == [
        ("w0:x-1", "met", 2),
        ("w0:x-2", "late", 2),
        ("w0:x-3", "dropped", 2),
        ("w0:x-4", "ok", 2),
        ("w0:x-5", "ok", 2),
    ]
    assert jobs[3]["deadline_s"] is None
    # the choices a job of a workflow decided at run time made, here and in `compass status`
    assert [(j["taken"], j["skipped"]) for j in jobs[3:]] == [("", 0), (chose["taken"], 2)]
    assert [j["taken"] for j in status["taken"]] == [chose["taken"]]
    json.loads(dashboard.to_json(part))  # JSON as it is


def test_the_peer_request_checks_its_window(worker: Worker) -> None:
    answer: Any = dashboard._answer
    assert answer(worker, None, {"window_s": 5})["name"] == "w0"
    assert answer(worker, None, {})["name"] == "w0"  # the default window
    bodies: list[Any] = [None, [], {"window_s": "5"}, {"window_s": True}, {"window_s": -1},
                         {"window_s": math.nan}, {"window_s": 1e9}]  # fmt: skip
    for body in bodies:
        with pytest.raises(InvalidInputs):
            answer(worker, None, body)


@pytest.mark.parametrize(
    ("query", "window"),
    [("", dashboard.DEFAULT_WINDOW_S), ("window=2.5", 2.5), ("window=600", 600.0)],
)
def test_window_parameter(query: str, window: float) -> None:
    assert dashboard.window_of(query) == window


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("window=0", r"window must be in \(0, 600\]"),
        ("window=601", r"window must be in \(0, 600\]"),
        ("window=nan", r"window must be in"),
        ("window=ten", r"window must be a number of seconds, got 'ten'"),
        ("window=1&window=2", r"give window once"),
        ("since=5", r"unknown parameter 'since'"),
        ("window", r"cannot parse the query 'window'; try \?window=15"),
        ("window=", r"window must be a number of seconds, got ''"),
        ("&&", r"cannot parse the query"),
    ],
)
def test_a_bad_window_parameter_says_what_is_wrong(query: str, message: str) -> None:
    with pytest.raises(InvalidInputs, match=message):
        dashboard.window_of(query)


def test_json_has_no_nan_or_infinity() -> None:
    text = dashboard.to_json({"a": math.inf, "b": [1.5, -math.inf, {"c": math.nan}], "d": "x"})
    assert json.loads(text) == {"a": None, "b": [1.5, None, {"c": None}], "d": "x"}


def test_the_page_loads_nothing_from_elsewhere() -> None:
    page = dashboard.page().decode()
    assert page.startswith("<!doctype html>")
    # no script, style, font or image from a URL: it works offline (and its CSP forbids it)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    assert "api/cluster" in page
    assert "default-src 'none'" in dashboard.PAGE_HEADERS
