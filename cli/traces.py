"""A job's trace as the command line prints it (``compass submit --trace``, ``compass status
--trace JOB``): one line for the job, one row per task, times in milliseconds."""

from __future__ import annotations

from compass.trace import BREAKDOWN, JobTrace

__all__ = ["trace_lines"]

_HEAD = ("task", "worker", "planned", "transfer", "queued", "load", "cache", "exec", "batch",
         "start", "end")  # fmt: skip


def trace_lines(trace: JobTrace) -> list[str]:
    """The lines of ``trace``'s table: the job, where its latency went, then its tasks in the
    order they started (``start`` and ``end`` in ms from the job's arrival at its ingress;
    ``*`` marks the critical path, ``->`` a task run elsewhere than planned)."""
    status = "ok" if trace.ok else f"failed ({trace.error})"
    parts = [f"{p} {trace.breakdown_ms[p]:.1f}" for p in BREAKDOWN if p in trace.breakdown_ms]
    lines = [
        f"job {trace.job} ({trace.workflow}) at {trace.ingress}: {trace.latency_ms:.1f} ms, "
        f"{status}, attempts {trace.attempts}, retries {trace.retries}, trace id "
        f"{trace.trace_id or '-'}",
        "  where it went (ms): " + ", ".join(parts),
    ]
    path = set(trace.critical_path)
    rows = [list(_HEAD)]
    for task in trace.tasks:
        cache = "-" if task.cache_hit is None else ("hit" if task.cache_hit else "miss")
        batch = str(task.batch) if task.batch == 1 else f"{task.batch} (+{len(task.mates)})"
        name = ("*" if task.task in path else " ") + task.task
        if task.attempt:
            name += f" (attempt {task.attempt})"
        moved = "->" if task.worker != task.planned_worker else ""
        rows.append([
            name, moved + task.worker, task.planned_worker, f"{task.transfer_ms:.1f}",
            f"{task.queued_ms:.1f}", f"{task.load_ms:.1f}", cache, f"{task.exec_ms:.1f}", batch,
            f"{(task.start - trace.start) * 1000:.1f}", f"{(task.end - trace.start) * 1000:.1f}",
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEAD))]
    for row in rows:
        cells = [
            cell.ljust(width) if i < 3 or i == 6 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines
