"""Apps used by the benchmarks: a no-op job and long chains of trivial tasks."""

from __future__ import annotations

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
