"""Elastic clusters: how many workers the objective needs, and a cluster that follows it.

:mod:`compass.elastic.rule` is the sans-IO rule (the desired worker count from what workers
know); :mod:`compass.elastic.curve` the time-varying traffic (a seeded day, a CSV of
per-minute counts); :mod:`compass.elastic.sim` the simulator whose cluster changes size.
"""

from __future__ import annotations

from compass.elastic.rule import (
    Decision,
    RayServeRule,
    ScaleConfig,
    ScaleRule,
    Signals,
    parse_bounds,
    pick_drain,
    workers_for,
)

__all__ = [
    "Decision",
    "RayServeRule",
    "ScaleConfig",
    "ScaleRule",
    "Signals",
    "parse_bounds",
    "pick_drain",
    "workers_for",
]
