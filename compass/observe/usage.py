"""What a worker process holds, for ``compass status`` and ``compass bench soak``: its memory,
descriptors, threads and tasks (:func:`process_usage`); the sizes of its tables are
:func:`compass.worker.tables.table_sizes`.

A soak reads them over time: every table must stay within its bound or expire its entries,
and the process must stay flat (docs/RESULTS.md, "Soak"). Reading them changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

__all__ = ["process_usage"]

MB = 1e6


def process_usage() -> dict[str, Any]:
    """``rss_mb`` (resident memory, MB of 10^6 bytes), ``open_fds``, ``asyncio_tasks`` (of the
    running loop) and ``threads`` of this process. On Linux from ``/proc/self``; elsewhere the
    RSS is the peak (``getrusage``) and a figure that cannot be read is None."""
    current_kb, threads = _proc_status()
    if current_kb is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss_kb = peak / 1024 if sys.platform == "darwin" else float(peak)  # bytes there
    else:
        rss_kb = float(current_kb)
    try:
        tasks: int | None = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (a worker not started, a test)
        tasks = None
    return {
        "rss_mb": round(rss_kb * 1024 / MB, 1),
        "open_fds": _open_fds(),
        "asyncio_tasks": tasks,
        "threads": threads if threads is not None else threading.active_count(),
    }


def _proc_status() -> tuple[int | None, int | None]:
    """VmRSS (KiB) and Threads of ``/proc/self/status``; None where there is no such file."""
    rss = threads = None
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except OSError:
        return None, None
    return rss, threads


def _open_fds() -> int | None:
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return None
