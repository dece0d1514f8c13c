"""Shared output for benchmarks: a table on the terminal and a JSON file."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from compass.errors import ConfigError

__all__ = ["best_cpu_us", "machine", "print_table", "pyplot", "save_figure", "write_json"]


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def pyplot(path: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files, no display), for a plot to ``path``;
    a :class:`~compass.errors.ConfigError` that says how to get it where it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(f"{path}: plots need matplotlib: pip install 'compass[bench]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str) -> None:
    """Lay ``fig`` out, write it to ``path`` (creating the folder), and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row))
    Console().print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def write_json(path: str | None, data: Mapping[str, Any], *, announce: bool = True) -> None:
    """Write ``data`` to ``path`` as indented JSON with sorted keys, creating the folder, and
    say so (``announce``); nothing when ``path`` is empty. The one writer of every
    benchmark's and ``compass sim``'s JSON. Written whole beside it, then renamed over it: a
    run stopped meanwhile leaves the last whole file, never half of one."""
    if not path:
        return
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    part = f"{path}.tmp"
    try:
        with open(part, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(part)
        raise
    os.replace(part, path)
    if announce:
        print(f"wrote {path}")


def best_cpu_us(fn: Callable[[int], Any], count: int, rounds: int) -> float:
    """CPU microseconds per call of ``fn(k)``, the best of ``rounds`` rounds of ``count``."""
    best, k = float("inf"), 0
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(count):
            fn(k)
            k += 1
        best = min(best, time.process_time() - start)
    return best / count * 1e6
