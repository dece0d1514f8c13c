"""``compass bench scale`` on tiny clusters, as a real subprocess: the JSON's layout, values
that make sense, and no worker process left behind."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import compass_argv

KEYS = {
    "workers", "idle_cpu_per_worker", "loaded_cpu_per_worker", "messages_per_s_per_worker",
    "bytes_per_s_per_worker", "connections_per_worker", "rss_mb_per_worker", "detect_ms",
    "spread_ms_p99",
}  # fmt: skip


def _in_session(session: int) -> list[int]:
    """The processes of session ``session`` (from /proc): the bench runs in a session of its
    own, and its workers inherit it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(120)
@pytest.mark.solo  # it compares an idle worker's CPU with a loaded one's
def test_bench_scale_measures_tiny_clusters_and_ends_its_workers(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    out, plot = tmp_path / "scale.json", tmp_path / "scale.png"
    argv = compass_argv("bench", "scale", "--workers", "2,3", "--seconds", "1", "--probes", "3",
                        "--json", str(out), "--plot", str(plot))  # fmt: skip
    bench = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=worker_env,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        printed, _ = bench.communicate(timeout=100)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        left = _in_session(bench.pid)
        for pid in left:  # a failing run must not leave them behind either
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 0, printed
    assert not left, f"processes left behind: {left}"

    data = json.loads(out.read_text())
    assert set(data) == {"config", "sizes"}
    assert data["config"]["workers"] == [2, 3]
    assert [s["workers"] for s in data["sizes"]] == [2, 3]
    assert [n["workers"] for n in data["config"]["notes"]] == [2, 3]
    for size in data["sizes"]:
        n = size["workers"]
        assert set(size) == KEYS
        # an idle bounded worker spends about 1% of a core: over one second that can read as
        # no clock tick at all (seen once); a light job stream costs more than that
        assert 0 <= size["idle_cpu_per_worker"] < size["loaded_cpu_per_worker"] < 2
        # the bounded view sends its state to nobody while idle: the failure detector's probes
        # and acks (5 a second each) and rumors are all; the mesh sent a heartbeat of about
        # 100 bytes to each peer every 10 ms (100 and 200 a second at 2 and 3 workers)
        assert 0 < size["messages_per_s_per_worker"] < 50
        assert 0 < size["bytes_per_s_per_worker"] < 5000
        assert size["connections_per_worker"] >= n - 1
        assert 10 < size["rss_mb_per_worker"] < 2000
        assert size["detect_ms"] is not None and 0 < size["detect_ms"] < math.inf
        # the probes' changes reached the planners watching their workers (in a bounded view,
        # those that planned over them: every worker plans a touch job first)
        assert size["spread_ms_p99"] is not None and 0 < size["spread_ms_p99"] < 1000
    assert "compass bench scale (bounded view)" in printed and "detect" in printed
    assert all(n["probe_views"] > 0 for n in data["config"]["notes"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_a_benchmark_stopped_with_sigterm_ends_its_workers(worker_env: dict[str, str]) -> None:
    """SIGTERM stops a benchmark as Ctrl-C does: its local cluster's workers end with it
    (by default SIGTERM ended the process at once and left its workers running)."""
    argv = compass_argv("bench", "e2e", "--workers", "2", "--policies", "compass",
                        "--jobs", "400")  # fmt: skip
    bench = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=worker_env,
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_in_session(bench.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)  # the bench and its two workers
        assert len(_in_session(bench.pid)) >= 3, "the workers never started"
        bench.send_signal(signal.SIGTERM)
        printed, _ = bench.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while _in_session(bench.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _in_session(bench.pid)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for pid in _in_session(bench.pid):  # a failing run must not leave them behind either
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode != 0
    assert not left, f"workers left behind: {left}\n{printed[-500:]}"
