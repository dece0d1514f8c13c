"""Benchmarks and traces on real clusters, briefly: ``bench e2e --trace/--timeline`` writes
the run as a Chrome trace and a Gantt chart; ``bench job --trace`` times every side of
tracing in one run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from compass._bench import e2e, job
from compass._bench.timeline import LOADS_TID

from .conftest import PAPER


@pytest.mark.timeout(120)
def test_bench_e2e_writes_the_run_as_a_chrome_trace_and_a_timeline(tmp_path: Path) -> None:
    config = e2e.E2EConfig(
        workload=PAPER, workers=2, jobs=10, time_scale=0.05, policies=("compass",),
        extra_args=("--no-warm",),  # cold caches: the run loads its models
    )  # fmt: skip
    trace, png = tmp_path / "run.json", tmp_path / "run.png"
    out = e2e.run(config, trace_path=str(trace), timeline_path=str(png))
    summary = out["results"]["compass"]
    assert summary["completed"] == 10 and "timeline" not in summary

    document = json.loads(trace.read_text())
    events = document["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert sorted(names) == [(1, "compass: w0"), (2, "compass: w1")]  # a process per worker
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert threads == {(1, 0): "lane 0", (1, LOADS_TID): "model loads",
                       (2, 0): "lane 0", (2, LOADS_TID): "model loads"}  # fmt: skip
    complete = [e for e in events if e["ph"] == "X"]
    kinds = Counter(e["cat"] for e in complete)
    tasks = [e for e in complete if e["cat"] == "task"]
    # every task run is one event (a batch one event naming its jobs), on its worker's lane
    ran = sum(len(e["args"]["jobs"]) for e in tasks)
    assert ran == sum(runs * int(size) for size, runs in summary["batch_sizes"].items()) + sum(
        1 for e in tasks if e["args"]["model"] is None
    )
    assert kinds["load"] >= 2  # cold caches: each worker loaded models
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in complete)
    assert all(e["tid"] == 0 for e in tasks)
    assert all(e["tid"] == LOADS_TID for e in complete if e["cat"] == "load")
    # workload time: a task of the paper's workload lasts what the spec says, not 1/20 of it
    assert max(e["dur"] for e in tasks) > 50_000
    assert document["otherData"]["lost"] == []
    assert png.stat().st_size > 20_000 and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(120)
def test_bench_job_times_every_side_of_tracing_in_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three of its five sides (a worker process each, and each imports torch: seconds)
    sides = {side: job.TRACE_SIDES[side] for side in ("plain", "traced", "returned")}
    monkeypatch.setattr(job, "TRACE_SIDES", sides)
    path = tmp_path / "job.json"
    result = job.run(jobs=30, json_path=str(path), trace=True)
    written = json.loads(path.read_text())
    for side in sides:
        assert written[side]["p50_us"] > 0 and written[side]["p99_us"] >= written[side]["p50_us"]
    for side in ("traced", "returned"):
        assert written[f"{side}_over_plain"] == pytest.approx(
            written[side]["p50_us"] / written["plain"]["p50_us"]
        )
    # the traced side's worker kept a trace of every job it ran (the warm-up's too)
    assert result["traced_kept"] == 60
