"""A tiny app for the HTTP front door: what ``curl``, tritonclient and the openai SDK reach.

Start a worker with it and the front door on::

    compass worker start --app examples.text_app --http-port 8341

- ``scale`` (Open Inference Protocol): ``x`` (FP32, any shape) times ``factor`` (FP32 scalar),
  with its tensors declared for ``GET /v2/models/scale``;
- ``chat`` (OpenAI model ``tiny-chat``): answers the last message back, reversed, with a
  token count (words) as usage, a word at a time (``stream: true`` sends each as it comes);
- ``embed`` (OpenAI model ``tiny-embed``): one 8-dimensional unit vector per input string,
  the same for the same string (a hash of its words, no model).

No torch and no weights: it starts at once, and its answers are known exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from typing import Any

import numpy as np

import compass

#: the embedding's size
DIM = 8

app = compass.App("text")

scale = app.workflow("scale", inputs=["x", "factor"])


@scale.task(expected_ms=0.1)
def times(model: None, x: np.ndarray[Any, Any], factor: float) -> np.ndarray[Any, Any]:
    return np.asarray(x, dtype=np.float32) * np.float32(factor)


app.tensors(
    "scale",
    inputs={"x": ("FP32", [-1]), "factor": ("FP32", [])},
    outputs={"output": ("FP32", [-1])},
)

chat = app.workflow("chat", inputs=["messages", "options"])


@chat.task(expected_ms=0.1, steps=8, step_ms=0.01)
def reply(
    model: None, messages: list[dict[str, Any]], options: dict[str, Any]
) -> Generator[str, None, dict[str, Any]]:
    """A word at a time (what ``stream: true`` sends as it comes), then the whole answer."""
    said = str(messages[-1].get("content", ""))
    words = said.split()[::-1][: int(options.get("max_tokens") or 1000)]
    for i, word in enumerate(words):
        yield word if i == 0 else f" {word}"
    prompt = sum(len(str(m.get("content", "")).split()) for m in messages)
    return {
        "text": " ".join(words),
        "finish_reason": "stop",
        "usage": {"prompt_tokens": prompt, "completion_tokens": len(words)},
    }


def vector(text: str) -> np.ndarray[Any, Any]:
    """``text``'s embedding: a unit vector from the hashes of its words."""
    total = np.zeros(DIM, dtype=np.float32)
    for word in text.lower().split():
        digest = hashlib.sha256(word.encode()).digest()[:DIM]
        total += np.frombuffer(digest, dtype=np.uint8).astype(np.float32) - 127.5
    norm = float(np.linalg.norm(total))
    return total / norm if norm else total


embed = app.workflow("embed", inputs=["input"])


@embed.task(expected_ms=0.1)
def vectors(model: None, input: list[str]) -> np.ndarray[Any, Any]:
    return np.stack([vector(text) for text in input])


app.openai(model="tiny-chat", workflow="chat")
app.openai(model="tiny-embed", workflow="embed", kind="embedding")
