"""``compass bench job`` against a real worker process: the no-op job in a task thread, the
same declared ``on_loop``, and the ping floor, each timed, with both ratios in the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from compass._bench import job


def test_bench_job_times_the_job_on_a_thread_and_on_the_loop_against_the_ping(
    tmp_path: Path,
) -> None:
    out = tmp_path / "job.json"
    result = job.run(jobs=30, json_path=str(out))
    written = json.loads(out.read_text())
    for key in ("p50_us", "on_loop_p50_us", "ping_p50_us"):
        assert 0 < written[key] == result[key], key
    assert written["job_over_ping"] == written["p50_us"] / written["ping_p50_us"]
    assert written["on_loop_over_ping"] == written["on_loop_p50_us"] / written["ping_p50_us"]
