"""OpenAI-compatible bodies in and out: sans-IO, a request's JSON to a job's inputs and back.

An app maps a model name to a workflow (``app.openai(model="tiny-chat", workflow="chat")``);
the job's inputs are those of the following the workflow declares (all of them when it
declares none):

==========================  =================================================================
endpoint                    job inputs
==========================  =================================================================
``/v1/chat/completions``    ``messages`` (the list of ``{role, content}``), ``options``
``/v1/completions``         ``prompt`` (a string), ``options``
``/v1/embeddings``          ``input`` (a list of strings, one per embedding), ``options``
==========================  =================================================================

``options`` holds the sampling fields given (``max_tokens``, ``temperature``, ``top_p``,
``stop``, ``seed``, ``user``, ...). A text workflow answers a string, or a dict with ``text``
(or ``content``) and optionally ``finish_reason`` and ``usage``; an embedding workflow answers
one vector per input (a 2-D array, a tensor, or a list of lists).

``deadline_ms``, ``priority`` and ``on_miss`` may be given in the body (the SDKs'
``extra_body``). ``stream: true`` (chat and completions) answers server-sent events: one chunk
(:func:`chunk_body`) per partial output of the workflow's step-wise sink (a piece of text),
then one with the ``finish_reason``, then ``data: [DONE]``.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from compass.front.declare import OpenAIKind, OpenAIModel
from compass.front.errors import HttpError

__all__ = [
    "ENDPOINT_KIND",
    "answer_body",
    "chunk_body",
    "job_inputs",
    "models_body",
    "objective_fields",
]

#: path -> the kind of model it serves
ENDPOINT_KIND: dict[str, OpenAIKind] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
_MAIN = {"chat": "messages", "completion": "prompt", "embedding": "input"}
#: body fields that are compass's, not the model's
_OBJECTIVE = ("deadline_ms", "priority", "on_miss")
_NOT_OPTIONS = {"model", "messages", "prompt", "input", "stream", "n", "encoding_format",
                *_OBJECTIVE}  # fmt: skip


def _bad(message: str) -> HttpError:
    return HttpError(400, message)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise _bad("messages must be a non-empty list of {role, content} objects")
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _bad(f"messages[{i}] must be an object with a role and a content")
    return value


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if not isinstance(value, str):
        raise _bad("prompt must be a string (one prompt per request)")
    return value


def _input(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _bad("input must be a string or a non-empty list of strings")
    return value


def job_inputs(kind: OpenAIKind, body: dict[str, Any], declared: Sequence[str]) -> dict[str, Any]:
    """The job's inputs for a request ``body`` to a model of ``kind`` whose workflow declares
    the inputs ``declared`` (none: every input)."""
    if body.get("stream") is True and kind == "embedding":
        raise _bad("stream: true is for chat and completions, not embeddings")
    n = body.get("n", 1)
    if n != 1:
        raise _bad(f"n must be 1 (one choice per request), got {n!r}")
    main = _MAIN[kind]
    if main not in body:
        raise _bad(f"a {kind} request needs {main!r}")
    value: Any
    if kind == "chat":
        value = _messages(body[main])
    elif kind == "completion":
        value = _prompt(body[main])
    else:
        value = _input(body[main])
    inputs = {main: value, "options": {k: v for k, v in body.items() if k not in _NOT_OPTIONS}}
    if declared:
        inputs = {k: v for k, v in inputs.items() if k in declared}
    return inputs


def objective_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``deadline_ms``, ``priority`` and ``on_miss`` from the body, where given."""
    return {k: body[k] for k in _OBJECTIVE if k in body}


def _text(value: Any) -> tuple[str, str, dict[str, int]]:
    usage: dict[str, int] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if isinstance(value, str):
        return value, "stop", usage
    if isinstance(value, dict):
        text = value.get("text", value.get("content"))
        if isinstance(text, str):
            reason = value.get("finish_reason", "stop")
            given = value.get("usage")
            if isinstance(given, dict):
                usage.update({k: int(v) for k, v in given.items() if k in usage})
                if "total_tokens" not in given:
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            return text, str(reason), usage
    raise HttpError(
        500, f"the workflow answered a {type(value).__name__}; a text workflow answers a "
        "string or {text, finish_reason, usage}"
    )  # fmt: skip


def _vectors(value: Any, count: int) -> np.ndarray[Any, Any]:
    numpy = getattr(value, "numpy", None)
    if callable(numpy) and hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        array = np.zeros(0, dtype=np.float32)
    if array.ndim == 1 and count == 1:
        array = array.reshape(1, -1)
    if array.ndim != 2 or array.shape[0] != count:
        raise HttpError(
            500, f"the embedding workflow answered {type(value).__name__} of shape "
            f"{list(array.shape)}; expected one vector per input ({count})"
        )  # fmt: skip
    return array


def answer_body(
    declared: OpenAIModel, job_id: str, value: Any, request: dict[str, Any]
) -> dict[str, Any]:
    """The response body for the job's answer ``value`` to ``request``."""
    if declared.kind == "embedding":
        encoding = request.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise _bad(f"encoding_format must be float or base64, got {encoding!r}")
        vectors = _vectors(value, len(_input(request["input"])))
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()
                if encoding == "base64"
                else row.tolist(),
            }
            for i, row in enumerate(vectors)
        ]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        return {"object": "list", "data": data, "model": declared.model, "usage": usage}
    text, reason, usage_ = _text(value)
    if declared.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": reason,
            "logprobs": None,
        }
        kind, prefix = "chat.completion", "chatcmpl"
    else:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        kind, prefix = "text_completion", "cmpl"
    return {**_envelope(kind, f"{prefix}-{job_id}", declared, choice), "usage": usage_}


def _envelope(
    kind: str, answer_id: str, declared: OpenAIModel, choice: dict[str, Any]
) -> dict[str, Any]:
    """What every text answer and chunk says around its one choice."""
    return {
        "id": answer_id,
        "object": kind,
        "created": int(time.time()),
        "model": declared.model,
        "choices": [choice],
    }


def chunk_body(
    declared: OpenAIModel, job_id: str, piece: Any, finish: Any = None
) -> dict[str, Any]:
    """One server-sent chunk of a streamed answer: ``piece`` of its text (a partial output;
    anything not a string is shown as text), or, last, the final output's ``finish_reason``
    (``finish``: the job's final output)."""
    reason = None
    text = piece if isinstance(piece, str) else ("" if piece is None else str(piece))
    if finish is not None:
        _, reason, _ = _text(finish)
        text = ""
    if declared.kind == "chat":
        delta = {"content": text} if text or reason is None else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
        kind, prefix = "chat.completion.chunk", "chatcmpl"
    else:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        kind, prefix = "text_completion", "cmpl"
    return _envelope(kind, f"{prefix}-{job_id}", declared, choice)


def models_body(models: Sequence[OpenAIModel]) -> dict[str, Any]:
    """``GET /v1/models``."""
    data = [{"id": m.model, "object": "model", "created": 0, "owned_by": m.owned_by}
            for m in models]  # fmt: skip
    return {"object": "list", "data": data}
