"""examples/webapp.py under a real uvicorn (uvloop) over real workers, driven by httpx.

Hundreds of concurrent jobs each come back with their own input; every compass error becomes
its HTTP status; a caller that hangs up gets its job dropped at the worker.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass.cluster import LocalCluster
from compass.reports import WorkerStatus

from .conftest import ROOT, app_environment, one_worker_workload, status_when

httpx = pytest.importorskip("httpx", reason="the examples extra: pip install -e '.[examples]'")
pytest.importorskip("fastapi", reason="the examples extra: pip install -e '.[examples]'")
pytest.importorskip("uvicorn", reason="the examples extra: pip install -e '.[examples]'")

APP = ["--app", "examples.vision_app"]
REQUESTS = 300  # all sent at once, each on its own connection
WAIT = 60.0  # a hang detector only


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def webapp(cluster: LocalCluster, env: dict[str, str]) -> AsyncIterator[str]:
    """uvicorn serving examples.webapp:app for ``cluster``; yields its base URL."""
    port = free_port()
    env = {**env, "COMPASS_WORKERS": ",".join(cluster.addresses), "COMPASS_TOKEN": cluster.token}
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "uvicorn", "examples.webapp:app", "--host", "127.0.0.1"],
        *["--port", str(port), "--loop", "uvloop", "--no-access-log"],
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    log: list[str] = []

    async def read_log() -> None:
        assert process.stderr is not None
        async for line in process.stderr:
            log.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read_log())
    try:
        while not any("Application startup complete" in line for line in log):
            assert not reader.done(), "uvicorn ended at startup:\n" + "".join(log)
            await asyncio.wait({reader}, timeout=0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()
        await reader


def percentile_ms(seconds: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(seconds) * 1e3, q)), 1)


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_hundreds_of_concurrent_jobs_and_every_request_error(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    async with (
        LocalCluster(2, args=APP, env=worker_env) as cluster,
        webapp(cluster, worker_env) as base,
    ):
        limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=REQUESTS)
        async with httpx.AsyncClient(base_url=base, timeout=WAIT, limits=limits) as http:
            health = await http.get("/healthz")
            assert health.status_code == 200 and health.json()["worker"] in cluster.addresses

            async def one(i: int) -> tuple[int, int, Any, float]:
                x = {"id": i, "tag": f"request-{i}", "values": [i, i / 2, None, True]}
                t0 = time.perf_counter()
                response = await http.post("/jobs/echo", json={"x": x})
                seconds = time.perf_counter() - t0
                echoed = response.json() == {"workflow": "echo", "result": x}
                return i, response.status_code, echoed, seconds

            # the first burst opens its connections; the second finds them open
            for burst in ("new connections", "kept-alive connections"):
                t0 = time.perf_counter()
                answers = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
                wall = time.perf_counter() - t0
                seconds = [s for *_, s in answers]
                errors = sum(status != 200 for _, status, _, _ in answers)
                figures = {
                    "burst": burst,
                    "requests": len(answers),
                    "concurrency": REQUESTS,
                    "errors": errors,
                    "p50_ms": percentile_ms(seconds, 50),
                    "p99_ms": percentile_ms(seconds, 99),
                    "wall_s": round(wall, 2),
                }
                print("webapp load:", json.dumps(figures))
                assert errors == 0
                assert sorted(i for i, *_ in answers) == list(range(REQUESTS))  # none lost
                assert all(echoed for _, _, echoed, _ in answers)  # each got its own input

            unknown = await http.post("/jobs/no_such_workflow", json={"x": 1})
            assert unknown.status_code == 404
            assert unknown.json()["error"] == "unknown_workflow"
            assert "no_such_workflow" in unknown.json()["message"]

            wrong_name = await http.post("/jobs/echo", json={"y": 1})
            assert wrong_name.status_code == 422
            assert wrong_name.json()["error"] == "invalid_inputs"
            not_an_object = await http.post("/jobs/echo", json=[1, 2])
            assert not_an_object.status_code == 422
            # an input named like an option is an input: echo has none of that name
            unexpected = await http.post("/jobs/echo", json={"x": 1, "timeout": 2})
            assert unexpected.status_code == 422 and "'timeout'" in unexpected.json()["message"]
            bad_timeout = await http.post("/jobs/echo?timeout=-1", json={"x": 1})
            assert bad_timeout.status_code == 422

            failed = await http.post("/jobs/fails", json={"x": 5})
            assert failed.status_code == 500
            body = failed.json()
            assert body["error"] == "job_failed"
            assert body["task"] == "explode" and body["workflow"] == "fails"

            tensors = await http.post("/jobs/echo", json={"x": {"nested": [[1.5, 2.5]]}})
            assert tensors.json()["result"] == {"nested": [[1.5, 2.5]]}


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_timeouts_refusals_hangups_and_a_lost_worker(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    # slow runs on the host lane and keeps running there when its job is dropped; quick has a
    # model, so it runs on the GPU lane beside it
    spec = one_worker_workload(tmp_path, slow=(None, 60_000), quick=("m", 1))
    args = ["--workload", spec, "--max-jobs", "1", "--max-job-mb", "0.05"]
    async with (
        LocalCluster(1, args=args, env=worker_env) as cluster,
        cluster.client() as worker,
        webapp(cluster, worker_env) as base,
        httpx.AsyncClient(base_url=base, timeout=WAIT) as http,
    ):
        data = {"data": [1, 2, 3]}

        def idle(status: WorkerStatus) -> bool:
            return bool(status.jobs_in_flight == 0)

        quick = await http.post("/jobs/quick", json=data)
        assert quick.status_code == 200, quick.text

        huge = await http.post("/jobs/quick", json={"data": "x" * 60_000})  # > 0.05 MiB
        assert huge.status_code == 413 and huge.json()["error"] == "job_too_large", huge.text
        assert "Retry-After" not in huge.headers and "--max-job-mb" in huge.json()["message"]

        late = await http.post("/jobs/slow?timeout=0.2", json=data)
        assert late.status_code == 504 and late.json()["error"] == "timeout"
        assert idle(await status_when(worker, idle, tries=1000))  # the worker dropped it

        held = asyncio.create_task(http.post("/jobs/slow", json=data))
        busy = await status_when(worker, lambda s: s.jobs_in_flight == 1, tries=1000)
        assert busy.jobs_in_flight == 1
        refused = await http.post("/jobs/quick", json=data)
        assert refused.status_code == 503 and refused.json()["error"] == "overloaded"
        assert refused.headers["Retry-After"] == "1"

        held.cancel()  # the caller hangs up: httpx drops the connection
        with suppress(asyncio.CancelledError):
            await held
        # a 60 s job, gone from the worker because nobody waits for it any more
        assert idle(await status_when(worker, idle, tries=1000))
        assert (await http.post("/jobs/quick", json=data)).status_code == 200

        cluster.workers[0].kill()
        await cluster.workers[0].process.wait()
        gone = await http.post("/jobs/quick", json=data)
        assert gone.status_code == 503 and gone.headers["Retry-After"] == "1"
        assert gone.json()["error"] in {"lost", "connect"}


STREAM_APP = """
import compass

app = compass.App("words")
tell = app.workflow("tell", inputs=["n"])

@tell.task(steps=4, step_ms=1.0)
def words(model, n):
    for i in range(n):
        yield f"w{i}"
    return " ".join(f"w{i}" for i in range(n))
"""


@pytest.mark.asyncio
async def test_a_streamed_job_comes_as_server_sent_events(tmp_path: Path) -> None:
    env = app_environment(tmp_path, "sse_app", STREAM_APP)
    async with (
        LocalCluster(1, args=["--app", "sse_app"], env=env) as cluster,
        webapp(cluster, env) as base,
        httpx.AsyncClient(base_url=base, timeout=WAIT) as http,
    ):
        async with http.stream("POST", "/streams/tell", json={"n": 3}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            text = "".join([chunk async for chunk in response.aiter_text()])
        events = [block.split("\n", 1) for block in text.strip().split("\n\n")]
        kinds = [kind.removeprefix("event: ") for kind, _ in events]
        data = [json.loads(body.removeprefix("data: ")) for _, body in events]
        assert kinds == ["output", "output", "output", "result"]
        assert [d["value"] for d in data[:3]] == ["w0", "w1", "w2"]
        assert data[3] == {"workflow": "tell", "result": "w0 w1 w2"}
        unknown = await http.post("/streams/nope", json={})
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_workflow"
