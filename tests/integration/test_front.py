"""The HTTP front door of a real worker process, driven by the clients people use: tritonclient
(Open Inference Protocol, JSON and binary tensors), the openai SDK, and raw sockets for the
errors, the limits and a fuzz run of malformed requests that the worker outlives."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import openai
import pytest
import tritonclient.http as triton
import trustme
from aiohttp import web
from tritonclient.utils import InferenceServerException

from compass import SyncClient
from compass.cluster import LocalCluster
from compass.config import TLSConfig
from compass.errors import InvalidInputs
from compass.front.body import DIRECT_MIN, BodyConnection, read_body
from compass.front.server import READ_BUFFER, FrontDoor, FrontOptions
from compass.security import client_context, new_token

if TYPE_CHECKING:
    from compass.worker.server import Worker

from .conftest import ROOT, app_environment, cluster_on_its_own_loop, worker_environment

FRONT_APP = """
import time

import numpy as np

import compass

app = compass.App("front")

echo = app.workflow("echo", inputs=["x"])

@echo.task(expected_ms=1)
def same(model, x):
    return x

pair = app.workflow("pair", inputs=["a", "b"])

@pair.task(expected_ms=1)
def both(model, a, b):
    return {"sum": a + b, "words": ["sum", str(float(np.sum(a + b)))]}

app.tensors("pair", inputs={"a": ("FP32", [-1]), "b": ("FP32", [-1])},
            outputs={"sum": ("FP32", [-1]), "words": ("BYTES", [2])})

fails = app.workflow("fails", inputs=["x"])

@fails.task(expected_ms=1)
def boom(model, x):
    raise RuntimeError("boom on purpose")

slow = app.workflow("slow", inputs=["x"])

@slow.task(expected_ms=5000)
def wait(model, x):
    time.sleep(float(x))
    return x

chat = app.workflow("chat", inputs=["messages", "options"])

@chat.task(expected_ms=1, steps=3)
def reply(model, messages, options):
    last = messages[-1]["content"]
    text = f"you said: {last} (max_tokens {options.get('max_tokens')})"
    for i, word in enumerate(text.split(" ")):  # a word a step: what stream: true sends
        yield word if i == 0 else " " + word
    return {"text": text,
            "usage": {"prompt_tokens": len(last.split()), "completion_tokens": 5}}

complete = app.workflow("complete", inputs=["prompt"])

@complete.task(expected_ms=1)
def cont(model, prompt):
    return prompt + " world"

embed = app.workflow("embed", inputs=["input"])

@embed.task(expected_ms=1)
def vectors(model, input):
    return np.array([[len(s), 1.0, 0.5, -1.0] for s in input], dtype=np.float32)

app.openai(model="tiny-chat", workflow="chat")
app.openai(model="tiny-complete", workflow="complete", kind="completion")
app.openai(model="tiny-embed", workflow="embed", kind="embedding")
"""

#: --max-job-mb of the worker: bodies past it are refused with 413
MAX_JOB_MB = 2
IDLE_S = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


Headers = dict[str, str]


class Door:
    """The worker under test: its native address, its HTTP port and its token."""

    def __init__(self, cluster: LocalCluster, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.cluster = cluster
        self.port = port
        self.tls = tls
        assert cluster.token is not None
        self.token: str = cluster.token

    @property
    def auth(self) -> dict[str, str]:
        """A new dict each time: tritonclient adds its own headers to the one it is given."""
        return {"Authorization": f"Bearer {self.token}"}

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = (
            http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            if self.tls is None
            else http.client.HTTPSConnection("127.0.0.1", self.port, timeout=30, context=self.tls)
        )
        try:
            conn.request(method, path, body=body, headers={**self.auth, **(headers or {})})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def infer(self, workflow: str, doc: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        status, headers, body = self.request(
            "POST", f"/v2/models/{workflow}/infer", json.dumps(doc).encode()
        )
        return status, headers, json.loads(body)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    folder: Path = tmp_path_factory.mktemp("front")
    env = app_environment(folder, "front_app", FRONT_APP)
    port = free_port()
    args = ["--app", "front_app", "--http-port", str(port), "--max-job-mb", str(MAX_JOB_MB),
            "--max-jobs", "2", "--http-idle-s", str(IDLE_S)]  # fmt: skip
    with cluster_on_its_own_loop(1, args, env=env, token=new_token()) as cluster:
        yield Door(cluster, port)


def tensor_input(name: str, array: np.ndarray[Any, Any], *, binary: bool) -> triton.InferInput:
    datatype = (
        "BYTES"
        if array.dtype == object
        else {"float32": "FP32", "int64": "INT64"}[str(array.dtype)]
    )
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


# -- tritonclient ----------------------------------------------------------------------------
def test_tritonclient_health_metadata_and_infer_in_json_and_binary(door: Door) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{door.port}")
    try:
        assert client.is_server_live()  # health needs no token
        assert client.is_server_ready()
        assert client.is_model_ready("pair", headers=door.auth)
        assert client.get_server_metadata(headers=door.auth)["extensions"] == [
            "binary_tensor_data",
            "openai",
        ]
        meta = client.get_model_metadata("pair", headers=door.auth)
        assert meta["inputs"] == [
            {"name": "a", "datatype": "FP32", "shape": [-1]},
            {"name": "b", "datatype": "FP32", "shape": [-1]},
        ]
        a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
        b = np.array([0.5, 0.5, 0.5], dtype=np.float32)
        for binary in (False, True):
            inputs = [tensor_input("a", a, binary=binary), tensor_input("b", b, binary=True)]
            outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("sum", "words")]
            result = client.infer("pair", inputs, outputs=outputs, headers=door.auth)
            np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
            assert result.as_numpy("sum").dtype == np.float32
            assert [w if isinstance(w, str) else w.decode() for w in result.as_numpy("words")] == [
                "sum",
                "7.5",
            ]
        # strings in and out, and a 1 MB tensor (binary by default for tritonclient's outputs)
        words = np.array(["héllo", "wörld"], dtype=object)
        result = client.infer("echo", [tensor_input("x", words, binary=True)], headers=door.auth)
        assert [w.decode() for w in result.as_numpy("output")] == ["héllo", "wörld"]
        big = np.arange(256 * 1024, dtype=np.float32)
        result = client.infer("echo", [tensor_input("x", big, binary=True)], headers=door.auth)
        np.testing.assert_array_equal(result.as_numpy("output"), big)
    finally:
        client.close()


def test_tritonclient_errors_are_the_native_clients_messages(door: Door) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{door.port}")
    one = [tensor_input("a", np.ones(2, dtype=np.float32), binary=True)]
    try:
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("nope", one, headers=door.auth)
        assert unknown.value.status() == "404"
        assert "unknown workflow 'nope'" in str(unknown.value.message())
        with pytest.raises(InferenceServerException) as bad:
            client.infer("pair", one, headers=door.auth)
        assert bad.value.status() == "400"
        with pytest.raises(InferenceServerException) as denied:
            client.infer("pair", one)  # no token
        assert denied.value.status() == "401"
    finally:
        client.close()
    native = SyncClient(door.cluster.addresses[0], token=door.token)
    with native, pytest.raises(InvalidInputs) as natively:
        native.submit("pair", a=np.ones(2, dtype=np.float32))
    assert bad.value.message() == str(natively.value)  # the same one line


# -- the openai SDK ----------------------------------------------------------------------------
def test_openai_sdk_chat_completion_embeddings_and_models(door: Door) -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{door.port}/v1", api_key=door.token)
    try:
        assert [m.id for m in client.models.list()] == ["tiny-chat", "tiny-complete", "tiny-embed"]
        chat = client.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "hi there"}], max_tokens=7
        )
        assert chat.choices[0].message.content == "you said: hi there (max_tokens 7)"
        assert chat.usage is not None and chat.usage.total_tokens == 7
        assert (
            client.completions.create(model="tiny-complete", prompt="hello").choices[0].text
            == "hello world"
        )
        vectors = client.embeddings.create(model="tiny-embed", input=["ab", "abcd"])
        assert [d.embedding for d in vectors.data] == [[2, 1, 0.5, -1], [4, 1, 0.5, -1]]
        floats = client.embeddings.create(model="tiny-embed", input="abc", encoding_format="float")
        assert floats.data[0].embedding == [3, 1, 0.5, -1]
        with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-9'"):
            client.chat.completions.create(
                model="gpt-9", messages=[{"role": "user", "content": "x"}]
            )
        # streamed: the words as the task makes them, then the finish reason
        chunks = list(
            client.chat.completions.create(
                model="tiny-chat", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
        pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        assert "".join(pieces) == "you said: hi (max_tokens None)" and len(pieces) == 5
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        with pytest.raises(openai.BadRequestError, match="stream: true is for chat"):
            client.embeddings.create(model="tiny-embed", input="x", extra_body={"stream": True})
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url=f"http://127.0.0.1:{door.port}/v1", api_key="wrong"
            ).models.list()
    finally:
        client.close()


# -- errors ------------------------------------------------------------------------------------
def test_a_failed_task_is_500_with_its_job_id_and_a_deadline_refusal_429(door: Door) -> None:
    x = {"name": "x", "datatype": "FP32", "shape": [], "data": [0.0]}
    status, headers, body = door.infer("fails", {"inputs": [x]})
    assert status == 500, body
    assert "boom on purpose" in body["error"] and body["job_id"] == headers["X-Compass-Job"]
    assert body["job_id"] in body["error"]
    # the slow workflow's expected time is 5 s: a 10 ms deadline cannot be met
    status, headers, body = door.infer("slow", {"inputs": [x], "parameters": {"deadline_ms": 10}})
    assert (status, headers["Retry-After"]) == (429, "1"), body
    # the protocol's own timeout (microseconds) is the same deadline
    status, _, _ = door.infer("slow", {"inputs": [x], "parameters": {"timeout": 10_000}})
    assert status == 429
    status, _, body = door.infer("echo", {"inputs": [x], "parameters": {"priority": -1}})
    assert status == 400 and "priority" in body["error"]


def test_an_overloaded_worker_answers_503_with_retry_after(door: Door) -> None:
    # the worker takes 2 jobs in flight (--max-jobs 2): hold both, then a third is refused
    slow = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [], "data": [1.5]}]}
    held = [threading.Thread(target=door.infer, args=("slow", slow)) for _ in range(2)]
    for thread in held:
        thread.start()
    try:
        with SyncClient(door.cluster.addresses[0], token=door.token) as native:
            for _ in range(200):  # until both are in flight (bounded)
                if native.status().jobs_in_flight >= 2:
                    break
                time.sleep(0.01)
        echo = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}]}
        status, headers, body = door.infer("echo", echo)
        assert (status, headers.get("Retry-After")) == (503, "1"), body
    finally:
        for thread in held:
            thread.join(timeout=30)


def test_a_body_over_max_job_mb_is_413_without_being_read(door: Door) -> None:
    size = MAX_JOB_MB * 1024 * 1024 + 1
    with socket.create_connection(("127.0.0.1", door.port), timeout=10) as sock:
        head = (
            f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            f"{door.token}\r\nContent-Length: {size}\r\n\r\n"
        )
        sock.sendall(head.encode())  # and not one byte of the body
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer


# -- limits and a fuzz run -------------------------------------------------------------------
def recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_idle_and_slow_loris_connections_are_closed(door: Door) -> None:
    address = ("127.0.0.1", door.port)
    idle = socket.create_connection(address, timeout=IDLE_S * 20)
    slow = socket.create_connection(address, timeout=IDLE_S * 20)
    with idle, slow:
        slow.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # never ends its head
        assert recv_all(idle) == b""  # the server closed it
        assert recv_all(slow) == b""


def test_a_body_slower_than_twice_the_idle_time_is_408(door: Door) -> None:
    # a large body: past its first bytes it is being received straight into its buffer
    head, body = binary_echo(door.token, np.ones(256 * 1024, dtype=np.float32))
    with socket.create_connection(("127.0.0.1", door.port), timeout=IDLE_S * 20) as sock:
        sock.sendall(head + body[: len(body) // 2])  # and the rest never comes
        answer = recv_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"the request body took over 2.0 s" in answer


def binary_tensor(x: np.ndarray[Any, Any]) -> tuple[int, bytes]:
    """An FP32 tensor's binary infer body, answered binary: its JSON header's length and it."""
    header = json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return len(header), header + x.tobytes()


def binary_echo(token: str, x: np.ndarray[Any, Any], chunked: bool = False) -> tuple[bytes, bytes]:
    """A binary infer request of ``x`` to echo: its head and its body."""
    header_length, body = binary_tensor(x)
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = (
        f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Inference-Header-Content-Length: {header_length}\r\n{length}\r\n\r\n"
    )
    return head.encode(), body


def read_answer(answers: Any) -> tuple[int, bytes]:
    """One answer's status and body, from a connection's file (answers one after another)."""
    status = int(answers.readline().split()[1])
    length = 0
    while (line := answers.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, answers.read(length)


def test_a_large_body_is_read_whole_in_pieces_chunked_and_with_the_next_request_after_it(
    door: Door,
) -> None:
    x = np.arange(256 * 1024, dtype=np.float32)  # 1 MiB: most of it received past aiohttp
    head, body = binary_echo(door.token, x)
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", door.port), timeout=30) as sock:
        answers = sock.makefile("rb")
        pieces = [head + body[:1000], body[1000:300_000], body[300_000:700_000]]
        for piece in pieces:  # in pieces, as a slow client sends it
            sock.sendall(piece)
            time.sleep(0.02)
        sock.sendall(body[700_000:] + live)  # the next request right after the body
        status, answer = read_answer(answers)
        assert status == 200 and answer.endswith(x.tobytes()), answer[:200]
        assert read_answer(answers) == (200, b"")  # parsed as a request of its own
        # and the same connection serves a large body again
        sock.sendall(head + body)
        status, answer = read_answer(answers)
        assert status == 200 and answer.endswith(x.tobytes()), answer[:200]
    head, body = binary_echo(door.token, x, chunked=True)
    with socket.create_connection(("127.0.0.1", door.port), timeout=30) as sock:
        chunks = [body[:5000], body[5000:600_000], body[600_000:]]
        sock.sendall(head + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n")
        status, answer = read_answer(sock.makefile("rb"))
        assert status == 200 and answer.endswith(x.tobytes()), answer[:200]


def test_a_chunked_body_whose_chunk_ends_come_after_their_bytes_is_read_whole(
    door: Door,
) -> None:
    # a chunk's bytes read before the line that ends it arrives: aiohttp then says the chunk
    # ended with no bytes, (b"", True), which is not the body's end (the test above failed so
    # once in a whole `make test`, when its chunks arrived split that way)
    x = np.arange(64 * 1024, dtype=np.float32)
    head, body = binary_echo(door.token, x, chunked=True)
    half = len(body) // 2
    with socket.create_connection(("127.0.0.1", door.port), timeout=30) as sock:
        sock.sendall(head + b"%x\r\n" % half + body[:half])  # no line end yet
        time.sleep(0.2)  # the door reads the chunk's bytes
        sock.sendall(b"\r\n%x\r\n" % (len(body) - half) + body[half:])
        time.sleep(0.2)
        sock.sendall(b"\r\n0\r\n\r\n")
        status, answer = read_answer(sock.makefile("rb"))
        assert status == 200 and answer.endswith(x.tobytes()), answer[:200]


def test_a_body_held_back_for_100_continue_is_asked_for(door: Door) -> None:
    # what curl does with a body past 1 KB: the head, then the body once told to go on (or
    # after a second); a body over the limit is refused at once instead
    head, body = binary_echo(door.token, np.arange(4, dtype=np.float32))
    head = head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n")
    with socket.create_connection(("127.0.0.1", door.port), timeout=IDLE_S) as sock:
        sock.sendall(head)
        answers = sock.makefile("rb")
        assert read_answer(answers) == (100, b"")  # before the idle time: not a 408
        sock.sendall(body)
        status, answer = read_answer(answers)
        assert status == 200 and answer.endswith(np.arange(4, dtype=np.float32).tobytes())
    over = b"Content-Length: %d" % (MAX_JOB_MB * 1024 * 1024 + 1)
    with socket.create_connection(("127.0.0.1", door.port), timeout=IDLE_S) as sock:
        sock.sendall(head.replace(b"Content-Length: %d" % len(body), over))
        assert read_answer(sock.makefile("rb"))[0] == 413


def test_a_large_body_shorter_than_declared_is_400_and_bytes_past_one_are_the_next_request(
    door: Door,
) -> None:
    x = np.ones(256 * 1024, dtype=np.float32)
    head, body = binary_echo(door.token, x)
    with socket.create_connection(("127.0.0.1", door.port), timeout=30) as sock:
        sock.sendall(head + body[:600_000])
        sock.shutdown(socket.SHUT_WR)  # the client sends no more
        answer = recv_all(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"the body ended after 600000 of its %d bytes" % len(body) in answer
    with socket.create_connection(("127.0.0.1", door.port), timeout=30) as sock:
        sock.sendall(head + body + b"NOT HTTP\r\n\r\n")  # bytes past the declared length
        answers = sock.makefile("rb")
        status, answer = read_answer(answers)
        assert status == 200 and answer.endswith(x.tobytes())
        status, answer = read_answer(answers)  # what came after: a request, a malformed one
        assert status == 400 and b"malformed HTTP request" in answer, answer


MALFORMED: list[tuple[bytes, dict[str, str]]] = [
    (b"{not json", {}),
    (b"\xff\xfe\x00", {}),
    (b"[]", {}),
    (b'{"inputs": []}', {}),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1]}]}', {}),
    (b'{"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]}', {}),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}]}', {}),
    (b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": [5]}]}', {}),
    (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [300]}]}', {}),
    (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
        b'"parameters": {"binary_data_size": 4}}]}',
        {"Inference-Header-Content-Length": "9999"},
    ),
    (
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
        b'"parameters": {"binary_data_size": 8}}]}\x00\x00\x80?',
        {},
    ),
    (b"{}", {"Inference-Header-Content-Length": "-3"}),
    (b"{}", {"Inference-Header-Content-Length": "abc"}),
]


def test_malformed_requests_are_refused_in_one_line_and_the_worker_keeps_serving(
    door: Door,
) -> None:
    binary_bytes_header = (
        b'{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], '
        b'"parameters": {"binary_data_size": 6}}]}'
    )
    cases = [
        *MALFORMED,
        (binary_bytes_header + struct.pack("<I", 99) + b"ab",
         {"Inference-Header-Content-Length": str(len(binary_bytes_header))}),
    ]  # fmt: skip
    for body, headers in cases:
        status, _, answer = door.request("POST", "/v2/models/echo/infer", body, headers)
        message = json.loads(answer)["error"]
        assert status == 400 and "\n" not in message and message, (body, message)
    for body in (b"{not json", b'{"model": 3}', b'{"model": "tiny-chat"}', b"[1]"):
        status, _, answer = door.request("POST", "/v1/chat/completions", body)
        assert status == 400 and json.loads(answer)["error"]["message"], body
    # bytes that are not HTTP, and random ones (seeded), each on a connection of its own
    rng = np.random.default_rng(36)
    garbage = [
        b"\x00\x01\x02\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /v2 HTTP/1.1\r\nContent-Length: zz\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    ]
    garbage += [rng.bytes(int(rng.integers(1, 2000))) + b"\r\n\r\n" for _ in range(30)]
    for junk in garbage:
        with socket.create_connection(("127.0.0.1", door.port), timeout=IDLE_S * 20) as sock:
            sock.sendall(junk)
            answer = recv_all(sock)
        if answer:  # else closed without a word
            head, _, text = answer.partition(b"\r\n\r\n")
            assert head.split()[1].startswith(b"4"), (junk[:40], answer[:200])
            assert json.loads(text)["error"] and b"\n" not in text, text
    assert door.request("GET", "/nowhere")[0] == 404
    assert door.request("DELETE", "/v2/health/live")[0] == 405
    x = {"name": "x", "datatype": "INT64", "shape": [2], "data": [4, 2]}
    status, _, body = door.infer("echo", {"inputs": [x]})
    assert status == 200 and body["outputs"][0]["data"] == [4, 2]


def issue(authority: trustme.CA, folder: Path, name: str, *identities: str) -> TLSConfig:
    issued = authority.issue_cert(*identities)
    cert, key, ca = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}-ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    authority.cert_pem.write_to_path(str(ca))
    return TLSConfig(str(cert), str(key), str(ca))


def test_over_mutual_tls_with_private_health_a_draining_worker_answers_503(
    tmp_path: Path,
) -> None:
    env = app_environment(tmp_path, "front_app", FRONT_APP)
    port = free_port()
    authority = trustme.CA()
    worker_tls = issue(authority, tmp_path, "worker", "127.0.0.1")
    client_tls = issue(authority, tmp_path, "client", "client.compass.test")
    stranger_tls = issue(trustme.CA(), tmp_path, "stranger", "client.compass.test")
    args = ["--app", "front_app", "--http-port", str(port), "--drain-timeout", "20",
            "--http-private-health"]  # fmt: skip
    started = cluster_on_its_own_loop(1, args, env=env, token=new_token(), tls=worker_tls)
    with started as cluster:
        https = client_context(client_tls.cert, client_tls.key, client_tls.ca)
        door = Door(cluster, port, tls=https)
        assert door.request("GET", "/v2/health/live")[0] == 200  # HTTPS, the client's cert
        # --http-private-health: the health routes need the token too
        assert door.request("GET", "/v2/health/live", headers={"Authorization": ""})[0] == 401
        plain = Door(cluster, port)  # no TLS at all: the handshake fails, nothing is served
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/v2/health/live")
        stranger = client_context(stranger_tls.cert, stranger_tls.key, client_tls.ca)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            Door(cluster, port, tls=stranger).request("GET", "/v2/health/live")
        # a large binary tensor over TLS: most of it received past aiohttp's reader
        x = np.arange(256 * 1024, dtype=np.float32)
        header_length, body = binary_tensor(x)
        extension = {"Inference-Header-Content-Length": str(header_length)}
        status, _, answer = door.request("POST", "/v2/models/echo/infer", body, extension)
        assert status == 200 and answer.endswith(x.tobytes()), answer[:200]
        answers: list[tuple[int, dict[str, str], Any]] = []
        slow = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [], "data": [1.0]}]}
        held = threading.Thread(target=lambda: answers.append(door.infer("slow", slow)))
        held.start()
        try:
            with SyncClient(cluster.addresses[0], token=door.token, tls=client_tls) as native:
                for _ in range(200):  # until the slow job is in flight (bounded)
                    if native.status().jobs_in_flight >= 1:
                        break
                    time.sleep(0.01)
            cluster.workers[0].process.send_signal(signal.SIGTERM)
            for _ in range(200):  # until it drains (bounded)
                ready = door.request("GET", "/v2/health/ready")
                if ready[0] == 503:
                    break
                time.sleep(0.01)
            assert (ready[0], ready[1].get("Retry-After")) == (503, "1")
            assert b"not ready" in ready[2]
            echo = {"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}]}
            status, headers, body = door.infer("echo", echo)
            assert (status, headers.get("Retry-After")) == (503, "1"), body
            assert "draining" in body["error"]
        finally:
            held.join(timeout=30)
        assert answers and answers[0][0] == 200  # the job it held was finished
        assert answers[0][2]["outputs"][0]["data"] == [1.0]


def readme_http_section() -> tuple[list[str], str]:
    """The README's "Over HTTP" section: its bash lines and its Python block."""
    text = (ROOT / "README.md").read_text()
    start = text.index("### Over HTTP")
    section = text[start : text.index("\n## ", start)]
    (bash,) = re.findall(r"^```bash\n(.*?)^```", section, flags=re.S | re.M)
    (python,) = re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    return [line for line in bash.splitlines() if line.strip()], python


def test_the_readme_http_lines_run_as_written(tmp_path: Path) -> None:
    lines, python = readme_http_section()
    native, port = free_port(), free_port()
    env = worker_environment()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # its `compass`
    worker: subprocess.Popen[str] | None = None
    try:
        for line in lines:
            line = line.replace("7351", str(native)).replace("8351", str(port))
            if line.startswith("compass worker start"):
                worker = subprocess.Popen(
                    ["bash", "-c", f"exec {line}"], env=env, cwd=ROOT, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                assert worker.stdout is not None
                while not (said := worker.stdout.readline()).startswith("compass front door"):
                    assert said, "the README's worker exited before its front door listened"
                continue
            script = f"{line}\nstatus=$?\nprintf '\\0'\nenv -0\nexit $status"
            done = subprocess.run(
                ["bash", "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, (line, done.stderr)
            output, _, dump = done.stdout.partition("\0")
            env = dict(item.split("=", 1) for item in dump.split("\0") if "=" in item)
            expected = re.search(r"#\s*prints\s+(.+)$", line)
            if expected:
                assert expected.group(1).strip() in output, (line, output)
        example = tmp_path / "readme_http.py"
        example.write_text(python.replace("8351", str(port)))
        done = subprocess.run(
            [sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["[2. 4. 6.]", "there hi", "2"]
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGINT)
            worker.communicate(timeout=60)
    assert worker is not None and worker.returncode == 0


@pytest.mark.asyncio
async def test_connections_past_the_cap_are_closed_and_the_door_serves_again_below_it() -> None:
    # the health route reads nothing of the worker: a door with none, on a real socket
    door = FrontDoor(cast("Worker", object()), FrontOptions(max_connections=2))
    async with door:
        port = int(door.address.rsplit(":", 1)[1])
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        for reader, writer in held:  # each is served
            writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 10) == b""  # the third: closed at once
        writer.close()
        held[0][1].close()
        await held[0][1].wait_closed()
        for _ in range(100):  # until the server has seen it go (bounded)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(12), 10)
            writer.close()
            if answer:
                break
            await asyncio.sleep(0.01)
        assert answer == b"HTTP/1.1 200"
        held[1][1].close()


@pytest.mark.asyncio
async def test_a_large_body_past_its_first_bytes_is_received_straight_into_its_buffer() -> None:
    # aiohttp's server with the front door's connection and reading, on a real socket: aiohttp's
    # reader saw (total_bytes) less than the body, and every byte of it is right
    seen: list[tuple[bool, int]] = []
    expected = np.random.default_rng(36).bytes(1_000_000)

    async def handler(request: web.BaseRequest) -> web.Response:
        view = await read_body(request, request.content_length or 0)
        seen.append((bytes(view) == expected, request.content.total_bytes))
        return web.Response(body=b"ok")

    class Server(web.Server):
        def __call__(self) -> BodyConnection:
            return BodyConnection(self, loop=self._loop, **self._kwargs)

    server = Server(handler, read_bufsize=READ_BUFFER)
    listener = await asyncio.get_running_loop().create_server(server, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(expected)
        for _ in range(2):  # the second on the same connection: read by the parser made anew
            writer.write(head + expected)
            answer = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
            assert answer.startswith(b"HTTP/1.1 200"), answer
        writer.close()
        await writer.wait_closed()
    finally:
        listener.close()
        await server.shutdown(1.0)
        await listener.wait_closed()
    assert [same for same, _ in seen] == [True, True]
    assert all(through <= len(expected) - DIRECT_MIN for _, through in seen), seen
