"""What the soak reads in its workers' logs (``compass bench soak``, :mod:`.soak`): the peers
a worker removed that no restart explains (false deaths), and the notices of a worker told a
peer had declared it dead."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["false_deaths"]

#: a peer removed for any reason but leaving on purpose (a WARNING; a leave is INFO). Earlier
#: workers wrote "peer X lost (why); re-planning its jobs", which counts too.
_LOST = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING compass\.worker: (\S+): peer (\S+) "
    r"(?:removed: (.*)|lost \((.*)\); re-planning)"
)
_DECLARED_DEAD = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ compass\.worker: (\S+): (\S+) had "
    r"declared this worker dead (.*)"
)


def _at(stamp: str) -> float:
    """A log line's time (``logging``'s asctime, local time) as a Unix time."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def false_deaths(
    logs: Sequence[Path], restarts: Sequence[tuple[str, float, float]], since: float
) -> tuple[int, int, list[dict[str, Any]]]:
    """Peer losses in the workers' logs (``<name>.log``) after ``since`` (a Unix time) that
    no restart explains (``(worker, from, to)``: it, and losses logged by it, were expected
    then), the notices of a worker that heard it had been declared dead (same rule), and the
    first 20 of either (``worker`` lost ``peer``, or declared it dead)."""

    def expected(at: float, *names: str) -> bool:
        return any(
            start - 1.0 <= at <= end + 1.0 and worker in names for worker, start, end in restarts
        )

    lost, declared = 0, 0
    events: list[dict[str, Any]] = []
    for path in logs:
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as log:
            for line in log:
                if "removed: " in line or "lost (" in line:
                    match = _LOST.match(line)
                    if match is None:
                        continue
                    at = _at(match[1])
                    if at < since or expected(at, match[2], match[3]):
                        continue
                    lost += 1
                    if len(events) < 20:
                        events.append(
                            {"t": round(at - since, 2), "worker": match[2], "peer": match[3],
                             "why": match[4] or match[5]}
                        )  # fmt: skip
                elif "had declared this worker dead" in line:
                    found = _DECLARED_DEAD.match(line)
                    if found is None:
                        continue
                    at = _at(found[1])
                    if at >= since and not expected(at, found[2], found[3]):
                        declared += 1
                        if len(events) < 20:
                            events.append(
                                {"t": round(at - since, 2), "worker": found[3],
                                 "peer": found[2], "why": "declared dead " + found[4]}
                            )  # fmt: skip
    return lost, declared, events
