"""The front door's sans-IO codecs: Open Inference Protocol tensors, OpenAI bodies, statuses."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from compass import App
from compass.errors import (
    DeadlineUnreachable,
    InvalidInputs,
    JobFailed,
    JobTooLarge,
    Overloaded,
    UnknownWorkflow,
    WorkflowError,
)
from compass.front import openai, tensors
from compass.front.declare import OpenAIModel
from compass.front.errors import HttpError, openai_body, status_of, v2_body


def infer(doc: dict[str, Any], binary: bytes = b"") -> tensors.InferRequest:
    header = json.dumps(doc).encode()
    return tensors.parse_infer(header + binary, len(header) if binary else None)


def test_json_and_binary_tensors_become_arrays_strings_and_scalars() -> None:
    raw = np.arange(6, dtype="<f4").tobytes()
    words = b"".join(struct.pack("<I", len(w)) + w for w in (b"ab", b"\xff"))
    m = {"name": "m", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}
    w: dict[str, Any] = {"name": "w", "datatype": "BYTES", "shape": [2]}
    w["parameters"] = {"binary_data_size": len(words)}
    parsed = infer(
        {
            "id": "r1",
            "inputs": [
                m,
                w,
                {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["héllo"]},
                {"name": "k", "datatype": "INT64", "shape": [], "data": [7]},
                {"name": "n", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
            ],
            "parameters": {"timeout": 250_000, "priority": 3},
        },
        raw + words,
    )  # fmt: skip
    assert parsed.inputs["m"].shape == (2, 3) and parsed.inputs["m"][1, 2] == 5.0
    assert parsed.inputs["w"] == ["ab", b"\xff"]  # bytes where not UTF-8
    assert parsed.inputs["s"] == "héllo" and parsed.inputs["k"] == 7
    assert type(parsed.inputs["k"]) is int  # a scalar is a Python number, as natively
    assert parsed.inputs["n"].dtype == np.int32 and parsed.inputs["n"].tolist() == [[1, 2], [3, 4]]
    assert tensors.objective_fields(parsed.parameters) == {"priority": 3, "deadline_ms": 250.0}


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{oops", None, "malformed JSON: Expecting property name"),
        (b"{}", 99, "Inference-Header-Content-Length is 99 but the body has 2 bytes"),
        (b'{"inputs": 3}', None, "needs a non-empty 'inputs' list"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2]}]}', None,
         "input 'x': 2 elements for shape [3]"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": ["a"]}]}', None,
         "FP32 data must be numbers"),
        (b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [], "data": [300]}]}', None,
         "input 'x': 300 does not fit INT8"),
        (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [2], "data": [1, -1]}]}', None,
         "data does not fit UINT8"),
        (b'{"inputs": [{"name": "x", "datatype": "BF16", "shape": [1], "data": [1]}]}', None,
         "datatype must be one of"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]},'
         b' {"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]}', None, "given twice"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], '
         b'"parameters": {"binary_data_size": 4}}]}AAAA', 100, "4 bytes of FP32 for shape [2]"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_with_one_line_naming_the_fault(
    body: bytes, header_length: int | None, message: str
) -> None:
    with pytest.raises(HttpError) as refused:
        tensors.parse_infer(body, header_length)
    assert refused.value.status == 400
    assert message in refused.value.message and "\n" not in refused.value.message


def test_answers_encode_as_json_or_binary_tensors() -> None:
    request = infer({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}]})
    header, blobs = tensors.encode_answer("wf", "job-1", {"a": np.ones((2, 2)), "t": "hi"}, request)
    assert blobs == []
    doc = json.loads(header)
    assert doc["id"] == "job-1"
    assert doc["outputs"] == [
        {"name": "a", "datatype": "FP64", "shape": [2, 2], "data": [1.0, 1.0, 1.0, 1.0]},
        {"name": "t", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
    ]
    binary = infer({"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [1]}],
                    "parameters": {"binary_data_output": True}})  # fmt: skip
    header, blobs = tensors.encode_answer("wf", "job-2", 3, binary)
    assert json.loads(header)["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(b"".join(blobs), "<i8").tolist() == [3]
    # a contiguous array of its datatype is sent from its own memory; any other, as its bytes
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    _, blobs = tensors.encode_answer("wf", "job-4", {"a": array, "t": array.T}, binary)
    assert np.shares_memory(np.frombuffer(blobs[0], np.float32), array)
    assert bytes(blobs[0]) == array.tobytes() and bytes(blobs[1]) == array.T.copy().tobytes()
    with pytest.raises(HttpError, match="not a tensor"):
        tensors.encode_answer("wf", "job-3", {"a": object()}, request)


def test_openai_requests_become_the_declared_inputs_and_answers_their_shapes() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
            "deadline_ms": 50}  # fmt: skip
    assert openai.job_inputs("chat", body, ("messages",)) == {"messages": body["messages"]}
    assert openai.job_inputs("chat", body, ())["options"] == {"temperature": 0.5}
    assert openai.objective_fields(body) == {"deadline_ms": 50}
    assert openai.job_inputs("chat", {**body, "stream": True}, ()) == openai.job_inputs(
        "chat", body, ()
    )  # stream is how the answer comes, not an input
    with pytest.raises(HttpError, match="stream: true is for chat and completions"):
        openai.job_inputs("embedding", {"model": "e", "input": "x", "stream": True}, ())
    with pytest.raises(HttpError, match="input must be a string"):
        openai.job_inputs("embedding", {"model": "e", "input": [1, 2]}, ())
    chat = openai.answer_body(OpenAIModel("m", "wf"), "j", "hello", body)
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "hello"}
    embed = OpenAIModel("e", "wf", "embedding")
    request = {"model": "e", "input": ["a", "b"], "encoding_format": "base64"}
    vectors = openai.answer_body(embed, "j", np.eye(2), request)
    first = np.frombuffer(__import__("base64").b64decode(vectors["data"][0]["embedding"]), "<f4")
    assert first.tolist() == [1.0, 0.0]
    with pytest.raises(HttpError, match="one vector per input"):
        openai.answer_body(embed, "j", np.eye(3), request)


def test_errors_map_to_statuses_and_each_protocols_body() -> None:
    failed = JobFailed("task t raised", detail={"job_id": "w-1"})
    assert status_of(failed) == (500, None)
    assert v2_body(failed, 500) == {"error": "task t raised (job w-1)", "job_id": "w-1"}
    assert status_of(UnknownWorkflow("x")) == (404, None)
    assert status_of(InvalidInputs("x")) == (400, None)
    assert status_of(JobTooLarge("x")) == (413, None)
    assert status_of(DeadlineUnreachable("x")) == (429, 1)
    assert status_of(Overloaded("x")) == (503, 1)
    assert openai_body(Overloaded("busy"), 503)["error"]["type"] == "overloaded_error"


def test_an_app_declares_openai_models_and_tensors_once() -> None:
    app = App()
    app.openai(model="m", workflow="wf", kind="embedding")
    with pytest.raises(WorkflowError, match="declared twice"):
        app.openai(model="m", workflow="other")
    with pytest.raises(WorkflowError, match="kind must be one of"):
        app.openai(model="n", workflow="wf", kind="speech")  # type: ignore[arg-type]
    with pytest.raises(WorkflowError, match="datatype must be one of"):
        app.tensors("wf", inputs={"x": ("FLOAT", [1])})
