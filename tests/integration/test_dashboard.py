"""The live dashboard against real worker processes: its JSON over real HTTP, gathered from
every peer (and a peer that does not answer), and its page in a real headless browser
(Debian's chromium), checked against ``compass status``, with a screenshot."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from compass import Client
from compass.cluster import LocalCluster
from compass.observe import dashboard
from compass.observe.timeline import JOB_FIELDS, SPAN_FIELDS

from .chromium import CHROMIUM, Chromium, chromium_path
from .conftest import compass_argv
from .test_metrics import http_get, raw_request


def workload(tmp_path: Path) -> str:
    """Two one-task workflows: ``quick`` (model ``small``, 20 ms) and ``slow`` (model ``big``,
    60 s: it holds a lane and a queue still while the page is compared with status)."""
    spec = {
        "name": "dashboard",
        "cluster": {"workers": 3, "gpu_memory_mb": 1000, "h2d_gbps": 10, "d2h_gbps": 10,
                    "net_gbps": 10, "net_fixed_us": 2},
        "models": {"small": {"size_mb": 100}, "big": {"size_mb": 300}},
        "workflows": {
            "quick": {"tasks": {"t": {"model": "small", "exec_ms": 20, "output_kb": 1,
                                      "after": []}}},
            "slow": {"tasks": {"t": {"model": "big", "exec_ms": 60_000, "output_kb": 1,
                                     "after": []}}},
        },
    }  # fmt: skip
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(spec))
    return str(path)


def args(spec: str) -> list[str]:
    # no warming, so that caches hold still; no drain, so that the 60 s tasks end with the test
    return ["--workload", spec, "--metrics-port", "0", "--no-warm", "--drain-timeout", "0",
            "--host-lanes", "0"]  # fmt: skip


async def get_json(url: str) -> Any:
    status, text = await asyncio.to_thread(http_get, url)
    assert status == 200, text
    return json.loads(text)


def rows_of(fields: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(fields, row, strict=True)) for row in rows]


@pytest.mark.asyncio
async def test_the_json_gathers_every_worker_and_says_which_did_not_answer(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    async with (
        LocalCluster(3, args=args(workload(tmp_path)), env=worker_env) as cluster,
        cluster.client() as client,
    ):
        address = (await client.status()).metrics
        assert address is not None  # the worker serves metrics
        await asyncio.gather(
            *(client.submit("quick", x=i, deadline_ms=5000, timeout=30) for i in range(9))
        )
        view = await get_json(f"http://{address}/api/cluster?window=60")
        assert view["via"] == "w0" and view["window_s"] == 60
        assert view["span_fields"] == list(SPAN_FIELDS)
        assert view["job_fields"] == list(JOB_FIELDS)
        parts = {part["name"]: part for part in view["workers"]}
        assert sorted(parts) == ["w0", "w1", "w2"]
        assert all("error" not in part and part["state"] == "ready" for part in parts.values())
        assert parts["w0"]["peers"] == ["w1", "w2"]
        # the elastic rule's desired size, as `compass status` says: three idle workers are
        # not cut before a sustained surplus (nor pressed: no queue waits)
        assert view["desired_workers"] == parts["w0"]["desired_workers"]
        assert view["desired_workers"] == {"desired": 3, "reason": "hold", "pressure": False}
        assert (await client.status()).desired_workers == view["desired_workers"]
        spans = [s for p in parts.values() for s in rows_of(view["span_fields"], p["spans"])]
        assert len(spans) == 9 == sum(p["spans_recorded"] for p in parts.values())
        assert {s["task"] for s in spans} == {"t"} and {s["model"] for s in spans} == {"small"}
        assert all(s["queued"] <= s["start"] < s["end"] <= view["now"] for s in spans)
        assert any(s["cache_hit"] is False for s in spans)  # each worker's first load
        jobs = rows_of(view["job_fields"], parts["w0"]["jobs"])  # w0 was every job's ingress
        assert len(jobs) == 9 and {j["outcome"] for j in jobs} == {"met"}
        assert not parts["w1"]["jobs"]
        assert {j["job"] for j in jobs} == {s["job"] for s in spans}

        one = await get_json(f"http://{address}/api/worker?window=60")
        assert one["name"] == "w0" and "workers" not in one
        assert one["queue"] == (await client.status()).queue
        assert one["spans"] == parts["w0"]["spans"]
        few = await get_json(f"http://{address}/api/worker?window=0.001")
        assert few["spans"] == [] and few["jobs"] == []

        # a peer that does not answer is a row that says so, within the peer timeout
        cluster.workers[2].process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            view = await get_json(f"http://{address}/api/cluster")
            took = time.monotonic() - started
        finally:
            cluster.workers[2].process.send_signal(signal.SIGCONT)
        parts = {part["name"]: part for part in view["workers"]}
        # it times out, or is declared dead (its channel closed) while the request waits
        error = parts["w2"]["error"]
        assert error.startswith(("CompassTimeout", "ConnectionClosed"))
        assert "queue" not in parts["w2"]
        assert parts["w2"]["address"] == cluster.workers[2].address
        assert "queue" in parts["w1"]
        assert took < dashboard.PEER_TIMEOUT_S + 2.0

        # the page, and clear errors for what is not there
        status, page = await asyncio.to_thread(http_get, f"http://{address}/")
        assert status == 200 and page.encode() == dashboard.page()
        for bad in ("window=0", "window=x", "since=3"):
            status, text = await asyncio.to_thread(http_get, f"http://{address}/api/cluster?{bad}")
            assert status == 400 and bad.split("=")[0] in text, (bad, text)
        assert await asyncio.to_thread(http_get, f"http://{address}/api/nope") == (
            404, "try /, /metrics, /ready, /api/cluster or /api/worker\n"
        )  # fmt: skip
        head = await raw_request(address, b"HEAD / HTTP/1.1\r\n\r\n")
        lines = head.split(b"\r\n\r\n")[0].split(b"\r\n")
        assert lines[0] == b"HTTP/1.1 200 OK" and head.endswith(b"\r\n\r\n")
        assert b"Content-Type: text/html; charset=utf-8" in lines
        assert any(line.startswith(b"Content-Security-Policy: default-src 'none'")
                   for line in lines)  # fmt: skip
        assert b"Cache-Control: no-store" in lines


# -- the page in a real browser ----------------------------------------------------------------

#: what the page shows of each worker, read from its DOM as a person reads the table
READ_PAGE = """JSON.stringify({
  workers: [...document.querySelectorAll('#workers tbody tr[data-worker]')].map((tr) => ({
    name: tr.dataset.worker,
    state: tr.querySelector('.state') && tr.querySelector('.state').innerText.trim(),
    ready: Number(tr.querySelector('.q-ready').innerText),
    waiting: Number(tr.querySelector('.q-waiting').innerText),
    running: Number(tr.querySelector('.q-running').innerText),
    models: [...tr.querySelectorAll('.models .chip:not(.loading)')].map((c) => c.innerText),
  })),
  spans: Number(document.getElementById('stream').dataset.spans),
  histograms: [...document.querySelectorAll('div.hist')].map((h) => ({
    workflow: h.dataset.workflow,
    slo: h.querySelector('line.slo') !== null,
    stats: h.querySelector('.stats').innerText,
  })),
  summary: document.getElementById('summary').innerText,
  desired: document.getElementById('desired').innerText,
  status: document.getElementById('status').innerText,
})"""


def shown(status: dict[str, Any]) -> dict[str, Any]:
    """What the dashboard should show of a worker whose ``compass status --json`` is
    ``status``."""
    queue = status["queue"]
    return {
        "name": status["name"],
        "state": "ready",
        "ready": queue["ready"] + queue["host_ready"],
        "waiting": queue["waiting_inputs"],
        "running": queue["running"] + queue["host_running"],
        "models": sorted(status["cache"]["resident"]),
    }


async def compass_status(address: str, env: dict[str, str]) -> dict[str, Any]:
    """``compass status ADDRESS --json``, the command an operator runs."""
    process = await asyncio.create_subprocess_exec(
        *compass_argv("status", address, "--json"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    info: dict[str, Any] = json.loads(out)
    return info


@contextlib.contextmanager
def serving(routes: dict[str, tuple[str, bytes]]) -> Iterator[str]:
    """A loopback HTTP server answering each path of ``routes`` with (content type, body)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            content_type, body = routes.get(self.path.split("?")[0], ("text/plain", b""))
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def sixteen_workers(view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (a real /api/cluster answer of three workers) grown to sixteen, each with a
    copy of a real worker's part (its spans and jobs renamed, so none is dropped as seen);
    and a peer that did not answer, one lost and one that left on purpose."""
    big = copy.deepcopy(view)
    parts = [p for p in view["workers"] if "queue" in p]
    job_at = view["job_fields"].index("job")
    big["workers"] = []
    for i in range(16):
        part = copy.deepcopy(parts[i % len(parts)])
        part["name"] = f"worker-{i:02d}"
        part["instance"] = f"i{i}"
        for row in part["jobs"]:
            row[job_at] = f"{row[job_at]}/{i}"
        big["workers"].append(part)
    big["workers"].append({"name": "worker-16", "address": "192.0.2.16:7341",
                           "error": "CompassTimeout: no answer within 1 s"})  # fmt: skip
    big["lost"] = [
        {"name": "worker-17", "address": "192.0.2.17:7341", "lost_s": 12.0, "left": False},
        {"name": "worker-18", "address": "192.0.2.18:7341", "lost_s": 3.0, "left": True},
    ]
    return big


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_the_page_in_a_browser_shows_what_status_shows(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    if chromium_path() is None:
        pytest.skip(f"no chromium at {CHROMIUM} nor on PATH (apt-get install chromium)")
    async with contextlib.AsyncExitStack() as stack:
        cluster = LocalCluster(3, args=args(workload(tmp_path)), env=worker_env)
        await stack.enter_async_context(cluster)
        clients = [Client(w.address, token=cluster.token) for w in cluster.workers]
        for client in clients:
            await stack.enter_async_context(client)
        address = (await clients[0].status()).metrics
        assert address is not None  # the worker serves metrics
        # answered jobs (latencies against a deadline) and finished tasks (the stream)
        await asyncio.gather(
            *(clients[0].submit("quick", x=i, deadline_ms=2000, timeout=30) for i in range(24))
        )
        # four 60 s tasks on three single-lane workers: queues that hold still
        slow = [asyncio.create_task(clients[0].submit("slow", x=i, timeout=120)) for i in range(4)]
        stack.push_async_callback(cancelled, slow)
        for _ in range(500):
            statuses = await asyncio.gather(*(c.status() for c in clients))
            placed = sum(s.queue["running"] + s.queue["ready"] for s in statuses)
            if placed == 4 and not any(s.cache["loading"] for s in statuses):
                break
            await asyncio.sleep(0.02)
        assert placed == 4

        page = await asyncio.to_thread(Chromium, tmp_path / "chromium")
        stack.push_async_callback(asyncio.to_thread, page.close)
        await asyncio.to_thread(page.start)
        started = time.monotonic()
        await asyncio.to_thread(page.open, f"http://{address}/")
        await asyncio.to_thread(page.wait_for, "Number(document.body.dataset.workers) === 3")
        three_s = time.monotonic() - started
        # the page reads the cluster once a second: compare until a read shows the statuses
        for _ in range(50):
            seen = json.loads(await asyncio.to_thread(page.evaluate, READ_PAGE))
            statuses = await asyncio.gather(*(c.status() for c in clients))
            if seen["workers"] == [shown(status.to_json()) for status in statuses]:
                break
            await asyncio.sleep(0.2)
        env = {**worker_env, "COMPASS_TOKEN": cluster.token}
        by_cli = await compass_status(cluster.workers[0].address, env)
        await asyncio.to_thread(page.screenshot, tmp_path / "dashboard.png")
        view = await get_json(f"http://{address}/api/cluster?window=120")
        sixteen_s, states = await asyncio.to_thread(open_sixteen, page, sixteen_workers(view))

    assert seen["status"] == ""  # no error reading the cluster
    assert [w["name"] for w in seen["workers"]] == ["w0", "w1", "w2"]
    # every number and model the page shows is what `compass status` shows
    assert seen["workers"] == [shown(status.to_json()) for status in statuses]
    assert shown(by_cli) == seen["workers"][0]
    assert sum(w["running"] for w in seen["workers"]) == 3
    assert sum(w["ready"] for w in seen["workers"]) == 1
    assert {m for w in seen["workers"] for m in w["models"]} == {"small", "big"}
    assert seen["spans"] >= 24  # every quick task (the slow ones are still running)
    assert [(h["workflow"], h["slo"]) for h in seen["histograms"]] == [("quick", True)]
    assert seen["histograms"][0]["stats"].startswith("24 jobs")
    assert "3 of 3 workers answering, via w0" in seen["summary"]
    # a 60 s task queued behind another presses the objective: the rule asks for a fourth
    # worker, and the page says what `compass status` says
    assert statuses[0].desired_workers == {"desired": 4, "reason": "out", "pressure": True}
    assert seen["desired"] == "4 workers wanted (out, objective pressed)"
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    # sixteen workers' worth of the same data is on the page within a second of opening it,
    # in name order, with the peer that did not answer, the lost one and the one that left
    # (a drain or a restart, no failure: not "lost")
    assert [name for name, _ in states] == [f"worker-{i:02d}" for i in range(16)] + [
        "worker-16",
        "worker-17",
        "worker-18",
    ]
    assert {state for _, state in states[:16]} == {"ready"}
    assert states[16:] == [
        ["worker-16", "unreachable"],
        ["worker-17", "lost"],
        ["worker-18", "left"],
    ]
    assert three_s < 5.0 and sixteen_s < 1.0, (three_s, sixteen_s)


async def cancelled(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def open_sixteen(page: Chromium, view: dict[str, Any]) -> tuple[float, Any]:
    """Seconds from opening the page, served with ``view`` as its cluster, until it shows
    every worker and draws their spans; and the states of its rows."""
    body = json.dumps(view).encode()
    routes = {"/": ("text/html", dashboard.page()), "/api/cluster": ("application/json", body)}
    with serving(routes) as base:
        started = time.monotonic()
        page.open(base + "/")
        page.wait_for("Number(document.body.dataset.workers) === 16")
        page.wait_for("Number(document.getElementById('stream').dataset.spans) > 0")
        took = time.monotonic() - started
        states = page.evaluate(
            "[...document.querySelectorAll('#workers tbody tr')].map((tr) => "
            "[tr.dataset.worker || tr.dataset.lost, tr.querySelector('.badge').innerText])"
        )
        return took, states
