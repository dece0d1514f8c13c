"""A real worker process under random and mutated frames and malformed peer messages."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from compass._bench.fuzz import APP, FrameFuzzer, fuzz_worker, rss_bytes
from compass.cluster import LocalCluster

MB = 1_000_000


def test_the_fuzzer_is_seeded():
    first, second = FrameFuzzer(5), FrameFuzzer(5)
    assert [first.frame() for _ in range(50)] == [second.frame() for _ in range(50)]
    for op in ("heartbeat", "result", "failed", "placed", "rumors", "watch"):
        assert repr([first.peer_body(op) for _ in range(20)]) == repr(
            [second.peer_body(op) for _ in range(20)]
        )


@pytest.mark.timeout(300)
@pytest.mark.asyncio
async def test_a_fuzzed_worker_keeps_serving_within_bounded_memory():
    async with LocalCluster(1, args=list(APP)) as cluster:
        worker = cluster.workers[0]
        async with cluster.client() as client:
            assert await client.submit("noop", x=1) == 1  # imports and caches of a first job
            before = rss_bytes(worker.process.pid)
            report = await asyncio.to_thread(
                fuzz_worker,
                worker.address,
                cluster.token,
                frames=2000,
                seed=0,
                alive=lambda: worker.running,
            )
            assert worker.running, report.notes
            assert report.frames > 800 and report.peer_messages > 800
            # every frame got an outcome: answered, or the connection closed by the worker
            assert report.hung == 0 and report.health_failures == 0, report.notes
            assert report.dropped > 0 and report.survived > 0
            # well-framed peer messages, however malformed, never cost the connection
            assert report.dropped_peer == 0
            await client.ping()
            status = await client.status()
            assert status.name == "w0"
            assert await client.submit("noop", x=41) == 41
            assert rss_bytes(worker.process.pid) - before < 64 * MB
        # the worker logs at ERROR level: no exception escaped where it was not expected
        assert "Traceback" not in worker.log_path.read_text(errors="replace")


def test_bench_fuzz_command_reports_and_writes_json(tmp_path):
    out = tmp_path / "fuzz.json"
    done = subprocess.run(
        [sys.executable, "-m", "compass", "bench", "fuzz", "--frames", "100", "--idle", "300",
         "--seed", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "kept serving" in done.stdout
    result = json.loads(out.read_text())
    assert 50 < result["frames"] + result["peer_messages"] <= 100
    assert result["crashes"] == 0 and result["kept_serving"] is True
    assert result["client_got_in_past_idle_sockets"] is True
    assert result["rss_end_bytes"] > 0
