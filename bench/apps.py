"""Apps used by the benchmarks: a no-op job, long chains of trivial tasks, and a generating
task that runs in steps."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import compass

app = compass.App("bench")

noop = app.workflow("noop", inputs=["x"])


@noop.task(expected_ms=0.001, output_bytes=8)
def nothing(model: None, x: Any) -> Any:
    return x


def _step(model: None, **inputs: Any) -> Any:
    (value,) = inputs.values()
    return value + 1


CHAIN_LENGTHS = (10, 100, 1000)

for _length in CHAIN_LENGTHS:
    _chain = app.workflow(f"chain_{_length}", inputs=["x"])
    for _i in range(_length):
        _chain.task(
            _step,
            name=f"t{_i}",
            after=[f"t{_i - 1}"] if _i else [],
            expected_ms=0.001,
            output_bytes=8,
        )


# a generating task, a step at a time: ``steps`` steps of ``step_ms`` each, each yielding a
# partial output of ``chunk`` bytes (the final output is all of them joined): what
# ``compass bench stream`` streams and submits unstreamed
generation = app.workflow("generation", inputs=["steps", "step_ms", "chunk"])


@generation.task(expected_ms=20.0, steps=4, step_ms=5.0, output_bytes=64)
def generate(model: None, steps: int, step_ms: float, chunk: int) -> Iterator[bytes]:
    piece = bytes(chunk)
    for _ in range(steps):
        time.sleep(step_ms / 1000.0)
        yield piece
