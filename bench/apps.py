"""Apps used by the benchmarks: a no-op job (in a task thread, and on the worker's loop), long
chains of trivial tasks, and a generating task that runs in steps."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from typing import Any

import compass

app = compass.App("bench")

noop = app.workflow("noop", inputs=["x"])


@noop.task(expected_ms=0.001, output_bytes=8)
def nothing(model: None, x: Any) -> Any:
    return x


#: the same no-op, declared to run on the worker's event loop (no task thread)
noop_on_loop = app.workflow("noop_on_loop", inputs=["x"])


@noop_on_loop.task(expected_ms=0.001, output_bytes=8, on_loop=True)
async def nothing_on_loop(model: None, x: Any) -> Any:
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


# a three-stage pipeline (generate -> translate -> synthesize), each stage ``steps`` steps of
# ``step_ms``, each item a ``chunk`` of bytes: ``speak_streamed`` streams both edges (each stage
# reads the one before as it comes), ``speak_plain`` is the same code with plain edges (each
# stage gets the whole list the one before returned). What ``compass bench stream`` compares.
Item = dict[str, Any]


def _speak_generate(
    model: None, steps: int, step_ms: float, chunk: int
) -> Generator[Item, None, list[Item]]:
    made = []
    for _ in range(steps):
        time.sleep(step_ms / 1000.0)
        made.append({"ms": step_ms, "data": bytes(chunk)})
        yield made[-1]
    return made


def _speak_stage(model: None, items: Any) -> Generator[Item, None, list[Item]]:
    """A stage after the first: one step per item it reads (a stream, or the whole list)."""
    made = []
    for item in items:
        time.sleep(item["ms"] / 1000.0)
        made.append(item)
        yield item
    return made


PIPELINE_STEPS, PIPELINE_STEP_MS = 10, 10.0
for _streamed in (True, False):
    _speak = app.workflow(
        f"speak_{'streamed' if _streamed else 'plain'}", inputs=["steps", "step_ms", "chunk"]
    )
    _profile: dict[str, Any] = {"steps": PIPELINE_STEPS, "step_ms": PIPELINE_STEP_MS}
    _speak.task(_speak_generate, name="generate", output_bytes=640, **_profile)
    for _stage, _before in (("translate", "generate"), ("synthesize", "translate")):
        _edge: Any = compass.Stream("items") if _streamed else "items"
        _speak.task(_speak_stage, name=_stage, after={_before: _edge}, output_bytes=640,
                    **_profile)  # fmt: skip
