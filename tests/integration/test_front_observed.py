"""The HTTP front door as operators see it, on a real worker process: its requests in the
worker's Prometheus scrape (by route template and status, in flight, a latency histogram),
and its address in ``compass status`` (the client's, the command's, its JSON) and in the
dashboard's JSON."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from compass import SyncClient
from compass.security import new_token

from .conftest import ROOT, app_environment, cluster_on_its_own_loop, compass_argv
from .test_front import Door, free_port

APP = """
import time

import compass

app = compass.App("observed")

echo = app.workflow("echo", inputs=["x"])

@echo.task(expected_ms=1)
def same(model, x):
    return x

slow = app.workflow("slow", inputs=["x"])

@slow.task(expected_ms=5000)
def wait(model, x):
    time.sleep(float(x))
    return x
"""
INFER = "/v2/models/{model}/infer"
#: seconds a test waits for what it polls for, at most
WAIT_S = 30.0


class Observed(Door):
    """The worker under test, and its metrics port."""

    metrics_port: int = 0

    def scrape(self) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """The scrape's samples: name -> sorted labels -> value."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as answer:
            text = answer.read().decode()
        samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted(sample.labels.items()))
                samples.setdefault(sample.name, {})[labels] = sample.value
        return samples

    def requests(self, route: str, status: int) -> float:
        counts = self.scrape().get("compass_http_requests_total", {})
        return counts.get((("route", route), ("status", str(status))), 0.0)

    def until(self, what: str, ready: Callable[[], bool]) -> None:
        """Poll ``ready()`` (bounded by :data:`WAIT_S`) until it is true."""
        end = time.monotonic() + WAIT_S
        while not ready():
            assert time.monotonic() < end, f"never saw {what}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    folder: Path = tmp_path_factory.mktemp("observed")
    env = app_environment(folder, "observed_app", APP)
    port, metrics_port = free_port(), free_port()
    args = ["--app", "observed_app", "--http-port", str(port), "--metrics-port", str(metrics_port)]
    with cluster_on_its_own_loop(1, args, env=env, token=new_token()) as cluster:
        door = Observed(cluster, port)
        door.metrics_port = metrics_port
        yield door


def _infer_doc(x: float) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP64", "shape": [], "data": [x]}]}
    ).encode()


def test_the_scrape_counts_requests_by_route_template_and_status(observed: Observed) -> None:
    before = {
        (route, status): observed.requests(route, status)
        for route, status in [(INFER, 200), (INFER, 404), (INFER, 401), ("other", 404),
                              ("/v2/health/live", 200), ("malformed", 400)]
    }  # fmt: skip
    for _ in range(3):
        assert observed.request("POST", "/v2/models/echo/infer", _infer_doc(1.0))[0] == 200
    assert observed.request("POST", "/v2/models/nope/infer", _infer_doc(1.0))[0] == 404
    unauthenticated = {"Authorization": "Bearer wrong"}
    status, _, _ = observed.request(
        "POST", "/v2/models/echo/infer", _infer_doc(1.0), unauthenticated
    )
    assert status == 401
    assert observed.request("GET", "/no/such/path/42")[0] == 404
    assert observed.request("GET", "/v2/health/live")[0] == 200
    with socket.create_connection(("127.0.0.1", observed.port), timeout=30) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert sock.recv(12)[-3:] == b"400"
    after = observed.scrape()
    counts = after["compass_http_requests_total"]
    added = {key: counts.get((("route", key[0]), ("status", str(key[1]))), 0.0) - was
             for key, was in before.items()}  # fmt: skip
    assert added == {(INFER, 200): 3, (INFER, 404): 1, (INFER, 401): 1, ("other", 404): 1,
                     ("/v2/health/live", 200): 1, ("malformed", 400): 1}  # fmt: skip
    # the labels are templates: no path a client chose, no workflow's name
    routes = {dict(labels)["route"] for labels in counts}
    assert "/no/such/path/42" not in routes and not any("echo" in r for r in routes)
    # the histogram: one count per request answered on the route, cumulative buckets
    infer = (("route", INFER),)
    count = after["compass_http_request_duration_seconds_count"][infer]
    assert count == sum(v for k, v in counts.items() if ("route", INFER) in k)
    buckets = {
        dict(labels)["le"]: value
        for labels, value in after["compass_http_request_duration_seconds_bucket"].items()
        if ("route", INFER) in labels
    }
    assert buckets["+Inf"] == count
    ordered = [buckets[le] for le in sorted(buckets, key=float)]
    assert ordered == sorted(ordered)
    assert after["compass_http_request_duration_seconds_sum"][infer] > 0


def test_in_flight_counts_a_request_until_answered_and_a_client_gone_is_499(
    observed: Observed,
) -> None:
    def in_flight() -> float:
        return observed.scrape()["compass_http_requests_in_flight"][()]

    assert in_flight() == 0
    answered: list[int] = []
    slow = threading.Thread(
        target=lambda: answered.append(
            observed.request("POST", "/v2/models/slow/infer", _infer_doc(2.5))[0]
        )
    )
    slow.start()
    try:
        observed.until("the slow request in flight", lambda: in_flight() == 1)
    finally:
        slow.join(timeout=WAIT_S)
    assert answered == [200]
    assert in_flight() == 0
    # a client that hangs up before its answer: its handler is cancelled, counted as 499
    gone = observed.requests(INFER, 499)
    body = _infer_doc(5.0)
    with socket.create_connection(("127.0.0.1", observed.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + observed.token.encode()
            + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        observed.until("the request in flight", lambda: in_flight() == 1)
    observed.until("the request counted as 499", lambda: observed.requests(INFER, 499) == gone + 1)
    assert in_flight() == 0


def test_status_and_dashboard_show_the_front_doors_address(observed: Observed) -> None:
    http = f"http://127.0.0.1:{observed.port}"
    address = observed.cluster.addresses[0]
    with SyncClient(address, token=observed.token) as client:
        status = client.status()
    assert status.http == http
    assert status.to_json()["http"] == http
    command = compass_argv("status", address, "--token", observed.token)
    shown = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=ROOT, check=True
    )
    assert f"front door: {http} (Open Inference Protocol, OpenAI API)" in shown.stdout.splitlines()
    as_json = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60,
                             cwd=ROOT, check=True)  # fmt: skip
    assert json.loads(as_json.stdout)["http"] == http
    url = f"http://127.0.0.1:{observed.metrics_port}/api/worker"
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert json.loads(answer.read())["http"] == http
