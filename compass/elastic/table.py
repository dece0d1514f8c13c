"""The capacity table a cluster sizes itself with, as a file: :func:`read_capacity`.

The desired worker count (:class:`~compass.elastic.rule.ScaleRule`) is one rule everywhere:
the bench's ``autoscale``, ``compass sim --traffic`` and the real worker's
``compass_desired_workers`` all size with :func:`table_rule` from a utilization-by-size table
and its margin. Calibrating the table costs minutes of simulation
(:mod:`compass.elastic.capacity`), so it is done once per workload and shipped: the file is
either ``{"by_size": [[workers, utilization], ...], "margin": m}`` or what
``compass bench elastic --json`` writes (each workload's ``capacity``; one chosen by name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compass.elastic.rule import ScaleConfig
from compass.errors import ConfigError

__all__ = ["TABLE_BAND", "Capacity", "read_capacity", "table_rule"]

#: the scale-in band of a table-sized rule: a tenth of the size's utilization (of 0.6)
TABLE_BAND = 0.06


@dataclass(frozen=True, slots=True)
class Capacity:
    """A workload's utilization by cluster size (``(workers, utilization)``, increasing) and
    the share of it the rule aims at (see :func:`~compass.elastic.capacity.day_margin`)."""

    by_size: tuple[tuple[int, float], ...]
    margin: float = 1.0

    def __post_init__(self) -> None:
        if not self.by_size:
            raise ConfigError("a capacity table needs at least one (workers, utilization) point")
        ScaleConfig(by_size=self.by_size, margin=self.margin)  # validates both

    def to_json(self) -> dict[str, Any]:
        return {"by_size": [list(p) for p in self.by_size], "margin": self.margin}


def table_rule(capacity: Capacity, minimum: int = 1, maximum: int = 64) -> ScaleConfig:
    """The rule sized by ``capacity`` within ``minimum:maximum``: each size held to its own
    utilization times the margin, a band of a tenth, starts called off once surplus."""
    return ScaleConfig(
        minimum=minimum,
        maximum=maximum,
        band=TABLE_BAND,
        by_size=capacity.by_size,
        margin=capacity.margin,
    )


def _capacity(entry: Any, where: str) -> Capacity:
    try:
        points = tuple((int(n), float(u)) for n, u in entry["by_size"])
        margin = float(entry.get("margin", 1.0))
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ConfigError(
            f"{where}: expected by_size as [[workers, utilization], ...] and an optional "
            f"margin ({error!r})"
        ) from None
    return Capacity(points, margin)


def read_capacity(path: str | Path, workload: str | None = None) -> Capacity:
    """The table in ``path`` (see the module docstring); from a bench JSON, ``workload``'s
    (optional where it holds one workload). A one-line :class:`ConfigError` otherwise."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read the capacity table {path}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a capacity table is a JSON object")
    if "workloads" not in data:
        return _capacity(data, str(path))
    workloads = data["workloads"]
    if not isinstance(workloads, dict) or not workloads:
        raise ConfigError(f"{path}: 'workloads' holds no workload")
    if workload is None:
        if len(workloads) != 1:
            raise ConfigError(
                f"{path} holds the tables of {', '.join(sorted(workloads))}: say which workload"
            )
        workload = next(iter(workloads))
    if workload not in workloads:
        raise ConfigError(
            f"{path} holds no table for {workload!r}; it holds {', '.join(sorted(workloads))}"
        )
    entry = workloads[workload]
    return _capacity(entry.get("capacity", entry) if isinstance(entry, dict) else entry, str(path))
