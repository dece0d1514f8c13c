"""What a worker process holds, for ``compass status`` and ``compass bench soak``: its memory,
descriptors, threads and tasks (:func:`process_usage`), and the sizes of its tables keyed by
jobs, peers or time (:func:`table_sizes`).

A soak reads them over time: every table must stay within its bound or expire its entries,
and the process must stay flat (docs/RESULTS.md, "Soak"). Reading them changes nothing.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import threading
from collections.abc import Iterable, Sized
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compass.wire.channel import Channel
    from compass.worker.server import Worker

__all__ = ["process_usage", "table_sizes"]

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


def _total(groups: Iterable[Sized]) -> int:
    return sum(len(group) for group in groups)


def table_sizes(worker: Worker) -> dict[str, float]:
    """Entries in each of ``worker``'s tables keyed by jobs, peers or time, by name: its
    core's (ingress jobs, the inbox, finished jobs, job keys and the answers kept of them,
    links), the adapter's (clients' futures, tasks, held messages, traces, timeline),
    membership's and the view's. Read-only; private tables are read where they live."""
    core = worker.core
    links = core.links
    timeline = worker.metrics.timeline
    sizes = {
        # the core: jobs and what it remembers of answered ones
        "jobs": len(core.jobs),
        "inbox": len(core.inbox),
        "finished": len(core._finished),
        "keys": len(core._keys),
        "answered_keys": len(core.answered),
        "answered_values": core.answered.values,
        "answered_mb": round(core.answered.bytes / (1 << 20), 3),
        "attached": len(core._attached),
        "links_sent": len(links),
        "links_jobs": len(links._peers),
        "links_orphans": links.orphaned,
        "stimuli": len(core.log),  # its stimulus log: a ring, at most keep_stimuli
        # the adapter
        "answers": len(worker._answers),
        "tasks": len(worker.supervisor),  # its background tasks, the loops among them
        "held": _total(worker._held.values()),
        "dialing": len(worker._dialing),
        "planned": len(worker._planned),
        "trace": len(worker.trace),
        "tracer_jobs": len(worker.tracer.jobs),
        "tracer_kept": len(worker.tracer.kept),
        "timeline_spans": len(timeline.spans),
        "timeline_jobs": len(timeline.jobs),
        "timeline_loads": len(timeline.loads),
        "slo": len(worker.metrics.slo),
        # the view of the peers
        "view": len(worker.gossip.view),
        "view_pending": _total(worker.gossip.view._pending.values()),
        "early_states": len(worker.gossip._early),
        "watchers": len(worker.gossip.watchers),
    }
    channels: list[Channel] = []
    if worker._server is not None:
        sizes["client_channels"] = len(worker._server.channels)
        channels += worker._server.channels
    membership = worker.membership
    if membership is not None:
        table = membership.table
        sizes.update(
            members=len(table.members),
            peers=len(membership.peers),
            lost=len(table._retrying),
            suspicions=len(table.detector.suspicions),
            member_stimuli=len(table.log),
            peer_channels=len(membership._open),
            queued_notifies=_total(membership._queued.values()),
            retries=len(membership._retries),
        )
        channels += membership._open
    sizes["handler_tasks"] = sum(len(c._handler_tasks) for c in channels)
    sizes["request_waiters"] = sum(len(c._waiters) for c in channels)
    return sizes
