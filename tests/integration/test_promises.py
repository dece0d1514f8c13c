"""What the docs and flags promise a new user, held on a real worker process (issue 39): a job
whose result comes past its deadline is no success through any client; ``compass submit``
sends tensors; the clients read ``COMPASS_TOKEN``; a job too large for one frame is refused
on the client (submitted or streamed), and one past ``--max-job-mb`` by the worker, each
naming its flag.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compass import Client, SyncClient
from compass.cluster import LocalCluster
from compass.config import Limits
from compass.errors import AuthenticationError, DeadlineExceeded, JobTooLarge
from compass.reports import WorkerStatus
from compass.security import new_token

from .conftest import PAPER, app_environment, cluster_on_its_own_loop, compass_argv

PROMISES_APP = """
import time

import compass

app = compass.App("promises")

# one workflow per client under test: a worker learns a task's real time from its first run
# and then refuses the next such job at once (DeadlineUnreachable), which is another promise
for name in ("late_async", "late_sync", "late_cli", "late_http"):
    @app.workflow(name, inputs=["ms"]).task(expected_ms=50)
    def sleep(model, ms):
        time.sleep(float(ms) / 1000.0)
        return float(ms)

@app.workflow("echo", inputs=["x"]).task(expected_ms=1)
def same(model, x):
    return x

@app.workflow("double", inputs=["x"]).task(expected_ms=1)
def twice(model, x):
    return x.float() * 2  # as the README's tasks are written: x is a tensor

@app.workflow("ones", inputs=["n"]).task(expected_ms=1)
def ones(model, n):
    import torch
    return torch.ones(int(n))

@app.workflow("describe", inputs=["x"]).task(expected_ms=1)
def what(model, x):
    kind = type(x)
    return {"type": f"{kind.__module__}.{kind.__name__}", "dtype": str(x.dtype),
            "shape": list(x.shape), "sum": float(x.sum())}
"""

#: what the late jobs take and what they are given: far apart, so that the job is admitted and
#: started in time on a busy machine and still finishes late
SLEEP_MS, DEADLINE_MS = 1000, 400


#: the worker's largest frame: small, so that a job too large for it is cheap to make
MAX_FRAME_MB = 4
MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Promised:
    """The worker under test: its native address, HTTP port, token and environment."""

    def __init__(self, cluster: LocalCluster, port: int, env: dict[str, str]) -> None:
        assert cluster.token is not None
        self.cluster = cluster
        self.address = cluster.addresses[0]
        self.port = port
        self.token: str = cluster.token
        self.env = env

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            compass_argv(*args), env={**self.env, "COMPASS_TOKEN": self.token, **(env or {})},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    def infer(self, workflow: str, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            conn.request("POST", f"/v2/models/{workflow}/infer", json.dumps(doc), headers)
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()


@pytest.fixture(scope="module")
def promised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Promised]:
    folder: Path = tmp_path_factory.mktemp("promises")
    env = app_environment(folder, "promises_app", PROMISES_APP)
    port = free_port()
    args = ["--app", "promises_app", "--http-port", str(port), "--max-frame-mb", str(MAX_FRAME_MB)]
    with cluster_on_its_own_loop(1, args, env=env, token=new_token()) as cluster:
        yield Promised(cluster, port, env)


# -- item 1: past the deadline, no success ----------------------------------------------------
def late_detail(error: DeadlineExceeded) -> float:
    """How late the job finished, as its error says (ms)."""
    assert isinstance(error.detail, dict), error.detail
    late_ms = float(error.detail["late_ms"])
    assert late_ms > 0 and error.job_id is not None
    return late_ms


@pytest.mark.timeout(120)
def test_a_result_past_its_deadline_is_deadline_exceeded_in_every_client(
    promised: Promised,
) -> None:
    async def natively() -> None:
        async with Client(promised.address, token=promised.token) as client:
            with pytest.raises(DeadlineExceeded, match="past its deadline") as late:
                await client.submit("late_async", ms=SLEEP_MS, deadline_ms=DEADLINE_MS)
            late_detail(late.value)
            # on_miss="finish" asks for the value however late: it is given
            value = await client.submit(
                "late_async", ms=SLEEP_MS, deadline_ms=DEADLINE_MS, on_miss="finish"
            )
            assert value == SLEEP_MS

    asyncio.run(natively())

    with SyncClient(promised.address, token=promised.token) as sync:
        with pytest.raises(DeadlineExceeded, match="past its deadline") as late:
            sync.submit("late_sync", ms=SLEEP_MS, deadline_ms=DEADLINE_MS)
        late_detail(late.value)
        status = sync.status()

    done = promised.cli(
        "submit", promised.address, "late_cli", "-i", f"ms={SLEEP_MS}",
        "--deadline-ms", str(DEADLINE_MS),
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == ""  # no value printed as if it were an answer
    assert "past its deadline" in done.stderr and 'on_miss="drop"' in done.stderr

    ms = {"name": "ms", "datatype": "FP32", "shape": [], "data": [float(SLEEP_MS)]}
    code, body = promised.infer(
        "late_http", {"inputs": [ms], "parameters": {"deadline_ms": DEADLINE_MS}}
    )
    assert code == 429 and "past its deadline" in body["error"], (code, body)

    # the worker still counts each as late (it finished: answered an error, or with
    # on_miss="finish" its value), not as dropped on the way
    slo = status.slo
    assert (slo["late_async"]["0"]["late"], slo["late_async"]["0"]["dropped"]) == (2, 0)
    assert slo["late_sync"]["0"]["late"] == 1


# -- item 5: the clients read COMPASS_TOKEN ---------------------------------------------------
@pytest.mark.timeout(60)
def test_the_clients_read_compass_token_and_say_so_when_it_is_missing_or_wrong(
    promised: Promised, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPASS_TOKEN", promised.token)
    with SyncClient(promised.address) as sync:  # no token given: the variable's
        assert sync.status().name

    async def ping() -> float:
        async with Client(promised.address) as client:  # the async one too
            return await client.ping()

    assert asyncio.run(ping()) >= 0

    monkeypatch.setenv("COMPASS_TOKEN", new_token())
    with (
        pytest.raises(AuthenticationError, match="the COMPASS_TOKEN environment variable"),
        SyncClient(promised.address, retries=0),  # it connects as the block begins
    ):
        pass
    with SyncClient(promised.address, token=promised.token) as sync:  # a given token wins
        assert sync.status().name

    monkeypatch.delenv("COMPASS_TOKEN")
    with (
        pytest.raises(AuthenticationError, match="no token= given, and COMPASS_TOKEN is not set"),
        SyncClient(promised.address, retries=0),
    ):
        pass


# -- item 6: a job too large for its frame -------------------------------------------------
@pytest.mark.timeout(60)
def test_a_job_too_large_for_one_frame_is_refused_on_the_client_naming_the_flag(
    promised: Promised,
) -> None:
    big = np.zeros((MAX_FRAME_MB + 1) * MiB, dtype=np.uint8)
    with SyncClient(promised.address, token=promised.token) as sync:
        with pytest.raises(JobTooLarge, match=f"the worker's --max-frame-mb is {MAX_FRAME_MB} MiB"):
            sync.submit("echo", x=big)
        # a streamed job is checked alike, before anything is sent (item 6's edge)
        with pytest.raises(JobTooLarge, match=f"the worker's --max-frame-mb is {MAX_FRAME_MB} MiB"):
            next(iter(sync.stream("echo", x=big)))
        # the frame keeps 1 MiB for the message around the inputs: a job of the whole frame,
        # which the wire refused naming no flag before, is refused here naming it
        whole = np.zeros(MAX_FRAME_MB * MiB - 1024, dtype=np.uint8)
        with pytest.raises(JobTooLarge, match="less 1 MiB for the message around the inputs"):
            sync.submit("echo", x=whole)
        # the connection and the worker are as they were: a job that fits is answered
        fits = np.arange(2 * MiB, dtype=np.uint8)
        np.testing.assert_array_equal(sync.submit("echo", x=fits), fits)
        # --max-job-mb follows --max-frame-mb (less 1 MiB): a job the frame carries, whose
        # scalars take it past that, is refused by the worker, naming that flag
        edge = {"x": np.zeros((MAX_FRAME_MB - 1) * MiB, dtype=np.uint8), "tag": 1}
        job_mb = f"--max-job-mb is {MAX_FRAME_MB - 1} MiB"
        with pytest.raises(JobTooLarge, match=job_mb) as refused:
            sync.submit("echo", inputs=edge)
        assert refused.value.job_id is not None  # the worker's answer, about its job
        with pytest.raises(JobTooLarge, match=job_mb):
            next(iter(sync.stream("echo", inputs=edge)))
        np.testing.assert_array_equal(sync.submit("echo", x=fits), fits)
    # this client's own limit is the tighter one: it says so
    small = Limits(max_frame_bytes=2 * MiB)  # carries 1 MiB of a job's inputs
    with SyncClient(promised.address, token=promised.token, limits=small) as sync:
        with pytest.raises(JobTooLarge, match=r"this client's Limits\.max_frame_bytes is 2 MiB"):
            sync.submit("echo", x=fits)
        assert sync.submit("echo", x=1) == 1
        # a scalar counts 24 bytes in payload_bytes and takes a byte on the wire: a list of
        # small ints "larger" than the frame by that count, which fits it, is not refused
        many = [7] * 100_000
        assert sync.submit("echo", x=many) == many


# -- item 4: compass submit sends tensors --------------------------------------------------
@pytest.mark.timeout(120)
def test_compass_submit_sends_tensors_from_files_and_typed_literals(
    promised: Promised, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import save_file

    def submit(workflow: str, *inputs: str) -> Any:
        args = [f"-i{item}" for item in inputs]
        done = promised.cli("submit", promised.address, workflow, *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    # a literal as a list fails a task written for a tensor; a typed one is a tensor
    assert submit("double", "x:float32=[[1, 2], [3, 4]]") == [[2.0, 4.0], [6.0, 8.0]]
    assert submit("describe", "x:numpy.int8=[1, 2, 3]") == {
        "type": "numpy.ndarray", "dtype": "int8", "shape": [3], "sum": 6.0,
    }  # fmt: skip

    np.save(tmp_path / "a.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    torch.save(torch.ones(4, dtype=torch.int64), tmp_path / "b.pt")
    save_file({"x": torch.full((2,), 0.5), "y": torch.zeros(1)}, str(tmp_path / "c.safetensors"))
    assert submit("describe", f"x=@{tmp_path / 'a.npy'}") == {
        "type": "numpy.ndarray", "dtype": "float32", "shape": [2, 3], "sum": 15.0,
    }  # fmt: skip
    assert submit("describe", f"x=@{tmp_path / 'b.pt'}") == {
        "type": "torch.Tensor", "dtype": "torch.int64", "shape": [4], "sum": 4.0,
    }  # fmt: skip
    # a file of several tensors gives the one named like the input
    assert submit("describe", f"x=@{tmp_path / 'c.safetensors'}")["sum"] == 1.0

    # a mistake is one line and a usage error (2); nothing reaches the worker
    for bad, said in (
        (f"x=@{tmp_path / 'missing.npy'}", "No such file"),
        (f"z=@{tmp_path / 'c.safetensors'}", "2 tensors and none named 'z': x, y"),
        ("x:float33=[1]", "unknown dtype 'float33'"),
    ):
        done = promised.cli("submit", promised.address, "describe", f"-i{bad}")
        assert done.returncode == 2, (bad, done.stderr)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


# -- item 8: routine events at INFO -----------------------------------------------------------
def logged(path: Path, text: str) -> set[str]:
    """The levels of the lines of the log at ``path`` that say ``text``."""
    lines = path.read_text(errors="replace").splitlines()
    return {line.split()[2] for line in lines if text in line}


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_drain_and_a_rejoin_are_info_and_a_lost_peer_a_warning(
    worker_env: dict[str, str],
) -> None:
    args = ["--workload", PAPER, "--heartbeat-ms", "20", "--peer-timeout-ms", "500",
            "--log-level", "info"]  # fmt: skip
    async with LocalCluster(3, args=args, env=worker_env) as cluster:
        await cluster.wait_joined()
        await cluster.restart(2)  # SIGTERM: it drains, says it leaves, and comes back
        cluster.workers[1].kill()  # no word: lost

        def settled(status: WorkerStatus) -> bool:
            lost = {m["name"] for m in status.lost}
            return [p["name"] for p in status.peers] == ["w2"] and lost == {"w1"}

        async with cluster.client(0) as client:
            for _ in range(1500):  # bounded: 30 s
                if settled(status := await client.status()):
                    break
                await asyncio.sleep(0.02)
            assert settled(status), status
        w0, w2 = cluster.log_dir / "w0.log", cluster.log_dir / "w2.log"
        # what an operator asked for, or what heals by itself, is INFO
        assert logged(w2, "draining for up to") == {"INFO"}
        assert logged(w2, "drained: every job") == {"INFO"}
        assert logged(w0, "peer w2 removed") == {"INFO"}
        assert logged(w0, "peer w2 gone") == {"INFO"}
        assert logged(w0, "peer w2 is back after") == {"INFO"}
        # a peer lost without a word is what an operator must look at
        assert logged(w0, "peer w1 removed") == {"WARNING"}


def test_help_piped_wraps_at_100_columns_or_at_columns(worker_env: dict[str, str]) -> None:
    def widest(env: dict[str, str]) -> int:
        done = subprocess.run(
            compass_argv("submit", "--help"), env=env, capture_output=True, text=True,
            timeout=60, check=True,
        )  # fmt: skip
        return max(map(len, done.stdout.splitlines()))

    env = {k: v for k, v in worker_env.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    assert widest(env) == 100  # piped: 100 columns, not rich's 80
    assert widest({**env, "COLUMNS": "72"}) == 72  # a width asked for is kept


# -- item 7: the trace names the client's import of torch ---------------------------------
@pytest.mark.timeout(120)
def test_a_traced_tensor_result_names_the_clients_import_of_torch(
    promised: Promised, tmp_path: Path
) -> None:
    def traced(workflow: str, item: str) -> dict[str, float]:
        path = tmp_path / f"{workflow}.json"
        done = promised.cli(
            "submit", promised.address, workflow, "-i", item, "--trace-json", str(path)
        )
        assert done.returncode == 0, done.stderr
        trace = json.loads(path.read_text())
        parts: dict[str, float] = trace["breakdown_ms"]
        assert sum(parts.values()) == pytest.approx(trace["latency_ms"])  # they add up
        return parts

    # the CLI imports torch only to rebuild the tensor it was answered: named, not "client"
    tensor = traced("ones", "n=4")
    assert tensor["import"] > 0 and tensor["client"] < tensor["import"], tensor
    number = traced("echo", "x=4")  # no tensor: nothing imported
    assert number["import"] == 0.0, number
