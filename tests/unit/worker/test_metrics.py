"""WorkerMetrics without a loop or a socket: what a job's answer and a task's end count, what
the collector reads at scrape time; and the JSON log formatter."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from compass.config import View, WorkerConfig
from compass.core.outcome import TaskOutcome
from compass.core.queue import QueuedTask
from compass.errors import JobFailed, WorkerUnavailable
from compass.observe.metrics import JsonLogFormatter
from compass.worker.process import build_worker
from compass.worker.requests import describe
from compass.worker.server import Worker

PAPER = str(Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json")


@pytest.fixture
def worker() -> Worker:
    # port 0 is never bound here (start() is not called): it only turns the histograms on
    return build_worker(WorkerConfig(name="w0", workload=PAPER, metrics_port=0))


def test_histograms_are_not_fed_when_nothing_can_scrape_them() -> None:
    quiet = build_worker(WorkerConfig(name="w0", workload=PAPER))
    assert not quiet.metrics.enabled
    quiet.metrics.job_answered(record("w0-1", True), None, waited=True)
    assert ("compass_job_latency_seconds_count", frozenset()) not in samples(quiet)
    assert not any(name.startswith("compass_job_latency") and value for (name, _), value
                   in samples(quiet).items())  # fmt: skip


def samples(worker: Worker) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(worker.metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def record(job: str, ok: bool, latency: float = 0.5) -> dict[str, object]:
    return {"job": job, "workflow": "translation", "ok": ok, "latency_s": latency}


def entry(task: str = "generate") -> QueuedTask:
    return QueuedTask(
        job_id="w0-1",
        attempt=0,
        workflow="translation",
        task=task,
        model="opt",
        expected_s=0.5,
        inputs={},
        plan={},
        ingress="w0",
        enqueued_at=0.0,
    )


def test_answers_count_by_outcome_and_feed_the_latency_histogram(worker: Worker) -> None:
    metrics = worker.metrics
    metrics.job_answered(record("a", True, 0.003), None, waited=True)
    metrics.job_answered(record("b", False), JobFailed("task raised"), waited=True)
    # nobody waited for this error: the client had stopped waiting, the job was dropped
    metrics.job_answered(record("c", False), WorkerUnavailable("gone"), waited=False)
    # a job that completes after its client left still completed
    metrics.job_answered(record("d", True), None, waited=False)
    worker.core.stats.jobs_refused = 4  # the core counts refusals
    got = samples(worker)
    jobs = {dict(k[1])["outcome"]: v for k, v in got.items() if k[0] == "compass_jobs_total"}
    assert jobs == {"ok": 2, "failed": 1, "cancelled": 1, "refused": 4}
    ok = frozenset({("workflow", "translation"), ("outcome", "ok")})
    assert got["compass_job_latency_seconds_count", ok] == 2
    assert got["compass_job_latency_seconds_sum", ok] == pytest.approx(0.503)
    assert got["compass_job_latency_seconds_bucket", ok | {("le", "0.005")}] == 1


def test_task_ends_feed_the_task_histograms(worker: Worker) -> None:
    outcome = TaskOutcome(entry(), output=b"", queue_s=0.25, fetch_s=0.5, exec_s=1.0)
    worker.metrics.task_finished(outcome)
    worker.metrics.task_finished(TaskOutcome(entry(), error=ValueError("x"), exec_s=0.1))
    got = samples(worker)
    labels = frozenset({("workflow", "translation"), ("task", "generate")})
    assert got["compass_task_latency_seconds_count", labels] == 2
    assert got["compass_task_latency_seconds_sum", labels] == pytest.approx(1.85)
    assert got["compass_task_exec_seconds_sum", labels] == pytest.approx(1.1)
    queue = frozenset({("workflow", "translation")})
    assert got["compass_task_queue_wait_seconds_sum", queue] == pytest.approx(0.25)
    assert got["compass_task_fetch_seconds_sum", queue] == pytest.approx(0.5)


def batch_outcomes(model: str | None, size: int, errors: int = 0) -> list[TaskOutcome]:
    """The outcomes of one run of ``size`` tasks, as the executor reports them: the first
    entry's first; ``errors`` of them failed (a failed item is still part of the run)."""
    entries = [dataclasses.replace(entry(), job_id=f"w0-{i}", model=model) for i in range(size)]
    return [
        TaskOutcome(
            e, error=ValueError("bad item") if i < errors else None, batch=size, first=i == 0
        )
        for i, e in enumerate(entries)
    ]


@pytest.mark.parametrize("scraped", [True, False])
def test_each_run_counts_once_by_its_batch_size_per_model(scraped: bool) -> None:
    # counted even when nothing scrapes: compass status shows them
    worker = build_worker(
        WorkerConfig(name="w0", workload=PAPER, metrics_port=0 if scraped else None)
    )
    runs = [("opt", 1, 0), ("opt", 3, 1), ("opt", 3, 3), ("opt", 8, 0), ("whisper", 2, 0)]
    for model, size, errors in runs:
        for outcome in batch_outcomes(model, size, errors):
            worker.metrics.task_finished(outcome)
    for outcome in batch_outcomes(None, 1):  # a task without a model runs on a host lane
        worker.metrics.task_finished(outcome)
    assert worker.metrics.batch_sizes() == {"opt": {"1": 1, "3": 2, "8": 1}, "whisper": {"2": 1}}
    assert describe(worker)["batches"] == worker.metrics.batch_sizes()
    got = samples(worker)
    opt = frozenset({("model", "opt")})
    buckets = {
        le: got["compass_batch_size_bucket", opt | {("le", le)}]
        for le in ("1.0", "2.0", "3.0", "4.0", "8.0", "64.0", "+Inf")
    }
    assert buckets == {"1.0": 1, "2.0": 1, "3.0": 3, "4.0": 3, "8.0": 4, "64.0": 4, "+Inf": 4}
    assert got["compass_batch_size_count", opt] == 4  # runs
    assert got["compass_batch_size_sum", opt] == 15  # tasks they took
    assert got["compass_batch_size_count", frozenset({("model", "whisper")})] == 1


def test_the_collector_reads_the_workers_counters_when_scraped(worker: Worker) -> None:
    before = samples(worker)
    assert before["compass_ready", frozenset()] == 0  # not started
    assert before["compass_peers", frozenset()] == 0
    worker.run_stats.tasks_run, worker.run_stats.tasks_failed = 7, 2  # the adapter's count
    worker.core.stats.peers_lost = 3  # the core's
    after = samples(worker)
    assert after["compass_tasks_total", frozenset({("outcome", "ok")})] == 5
    assert after["compass_tasks_total", frozenset({("outcome", "failed")})] == 2
    assert after["compass_peers_lost_total", frozenset()] == 3
    assert after["compass_cache_capacity_bytes", frozenset()] == worker.cache.capacity_bytes()
    assert worker.metrics.is_ready() == (False, "starting, draining or stopping")


@pytest.mark.parametrize("view", ["mesh", "bounded"])
def test_view_ages_are_exported_by_the_mesh_only(view: View) -> None:
    """A mesh hears every peer every few ms, so a view row's age is that peer's silence (an
    alert fires past 1 s); a bounded view hears a peer on change only, so its rows age while
    idle: it exports none (silence is the failure detector's to judge)."""
    config = WorkerConfig(name="w0", workload=PAPER, metrics_port=0)
    worker = build_worker(
        dataclasses.replace(config, sched=dataclasses.replace(config.sched, view=view))
    )
    peer = worker.gossip.own_state(0.0)
    worker.gossip.port.view.apply_heartbeat(dataclasses.replace(peer, name="w1", seq=1), now=0.0)
    ages = {k: v for k, v in samples(worker).items() if k[0] == "compass_view_age_seconds"}
    assert list(ages) == ([("compass_view_age_seconds", frozenset({("peer", "w1")}))]
                          if view == "mesh" else [])  # fmt: skip


def test_two_workers_in_one_process_never_share_a_metric() -> None:
    first = build_worker(WorkerConfig(name="a", workload=PAPER))
    second = build_worker(WorkerConfig(name="b", workload=PAPER))
    first.core.stats.jobs_refused = 1
    refused = frozenset({("outcome", "refused")})
    assert samples(first)["compass_jobs_total", refused] == 1
    assert samples(second)["compass_jobs_total", refused] == 0


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("compass.worker", logging.INFO, __file__, 1, "ran %s", ("t",), None)
    record.__dict__.update(extra)
    return record


def test_json_lines_carry_the_message_and_the_extra_fields() -> None:
    line = JsonLogFormatter().format(_record(worker="w0", job="w0-1", task="t", path=Path("/x")))
    assert "\n" not in line
    got = json.loads(line)
    assert got["level"] == "info" and got["logger"] == "compass.worker"
    assert got["message"] == "ran t"
    assert got["time"].endswith("+00:00")
    assert (got["worker"], got["job"], got["task"]) == ("w0", "w0-1", "t")
    assert got["path"] == "/x"  # what JSON cannot hold is written as its str()
    assert "exception" not in got and "args" not in got and "msg" not in got


def test_json_lines_carry_a_traceback_as_one_field() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("compass", logging.ERROR, __file__, 1, "failed", (), exc_info)
    line = JsonLogFormatter().format(record)
    assert "\n" not in line
    got = json.loads(line)
    assert got["level"] == "error"
    assert "Traceback" in got["exception"] and "ValueError: boom" in got["exception"]


def test_a_worker_with_other_seeds_and_no_peer_is_not_ready_and_a_first_worker_is() -> None:
    from compass.wire.rpc import Router
    from compass.wire.transport import ChannelOptions
    from compass.worker.membership import Membership, MembershipOptions

    router = Router()

    def alone(seeds: list[str]) -> Worker:
        split = build_worker(WorkerConfig(name="a", workload=PAPER, join=("127.0.0.1:7399",)))
        split.membership = Membership(
            "127.0.0.1:7400", MembershipOptions(ChannelOptions(name="a", token=None)),
            handler=router.handle_request, notify_handler=router.handle_notify,
            on_join=lambda peer: None, on_leave=lambda name, why: None,
        )  # fmt: skip
        split.membership.use_seeds(seeds)
        split.metrics.ready = True
        return split

    ready, why = alone(["127.0.0.1:7399"]).metrics.is_ready()
    assert not ready and "no peer" in why  # split off: no orchestrator should route here
    assert alone([]).metrics.is_ready() == (True, "ready")  # its only seed was itself: the first
    draining = alone([])
    draining.metrics.ready = False  # what drain() does
    assert draining.metrics.is_ready() == (False, "starting, draining or stopping")


def test_jobs_with_a_deadline_are_counted_by_workflow_priority_and_outcome(worker: Worker) -> None:
    from compass.errors import DeadlineExceeded, DeadlineUnreachable

    def answered(latency: float, error: Any = None, priority: int = 0, deadline: Any = 1.0) -> None:
        record = {"job": "j", "workflow": "vqa", "ok": error is None, "latency_s": latency,
                  "priority": priority, "deadline_s": deadline}  # fmt: skip
        worker.metrics.job_answered(record, error, waited=True)

    answered(0.5)  # met
    answered(1.5)  # answered, late
    answered(0.0, DeadlineUnreachable("no plan"))
    answered(0.7, DeadlineExceeded("too late"))
    answered(0.2, priority=1)
    answered(0.2, deadline=None)  # no deadline: not an SLO job
    slo = describe(worker)["slo"]["vqa"]
    assert slo["0"] == {"met": 1, "late": 1, "unreachable": 1, "dropped": 1, "failed": 0,
                        "attainment": 0.25}  # fmt: skip
    assert slo["1"]["met"] == 1 and slo["1"]["attainment"] == 1.0
    got = samples(worker)
    labels = frozenset({("workflow", "vqa"), ("priority", "0"), ("outcome", "dropped")})
    assert got["compass_slo_jobs_total", labels] == 1
