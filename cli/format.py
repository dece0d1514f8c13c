"""What ``compass status`` and ``compass submit`` print: a worker's status as lines, a job's
result as one line of JSON. A job's trace as a table is :mod:`.traces`."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["result_text", "status_lines"]


def status_lines(info: dict[str, Any]) -> list[str]:
    """A worker's status (``Client.status()``): who it is, its peers, queue and cache, the view
    it plans on, the traces it keeps, and the choices its last jobs decided at run time made."""
    peers = ", ".join(f"{p['name']}@{p['address']}" for p in info["peers"]) or "none"
    queue = info.get("queue", {})
    cache = info.get("cache", {})
    lines = [
        f"{info['name']} at {info['address']}  compass {info['version']}  "
        f"up {info['uptime_s']:.1f} s  policy {info.get('policy')}",
        f"peers: {peers}",
        f"queue: {queue.get('ready', 0)} ready, {queue.get('running', 0)} running, "
        f"wait {queue.get('wait_ms', 0):.1f} ms; host lanes: {queue.get('host_ready', 0)} "
        f"ready, {queue.get('host_running', 0)} running of {queue.get('host_lanes', 0)}",
        f"cache ({cache.get('backend', '?')} on {cache.get('device', '?')}): "
        f"{sorted(cache.get('resident', []))} "
        f"free {cache.get('free_bytes', 0) / 1e9:.2f} GB "
        f"of {cache.get('capacity_bytes', 0) / 1e9:.2f} GB, "
        f"{cache.get('staged_bytes', 0) / 1e9:.2f} GB of weights staged on the host",
    ]
    if info.get("http"):
        lines.insert(1, f"front door: {info['http']} (Open Inference Protocol, OpenAI API)")
    if queue.get("stuck"):
        state = "DEGRADED: takes no work until one returns" if queue.get("degraded") else "ok"
        lines.append(
            f"stuck tasks: {queue['stuck']} past their timeout, threads still running, of "
            f"{queue.get('max_stuck', '?')} allowed ({state})"
        )
    desired = info.get("desired_workers")
    if desired:
        lines.append(
            f"desired workers: {desired['desired']} ({desired['reason']}"
            f"{', under pressure' if desired.get('pressure') else ''})"
        )
    replicas = info.get("replicas")
    if replicas and (replicas.get("warmed") or replicas.get("watching")):
        held = ", ".join(replicas.get("held", [])) or "none"
        watching = ", ".join(replicas.get("watching", [])) or "none"
        lines.append(
            f"hot models warmed here ahead of need: {replicas.get('warmed', 0)} "
            f"({_counts(replicas.get('models', {}))}); still held: {held}; "
            f"holders watched: {watching}"
        )
    if cache.get("fallback"):
        lines.append(f"cache fallback: {cache['fallback']}")
    if info.get("cluster"):
        lines.append("view (what this worker plans on):")
        for row in info["cluster"]:
            lines.append(
                f"  {row['name']}: wait {row['wait_ms']:.1f} ms, models {row['models']}, "
                f"age {row['age_ms']:.1f} ms, placements counted {row['placements_counted']}"
                f"{_version(row.get('version'))}{_learned(row.get('learned'))}"
                f"{_choices(row.get('choices'))}"
            )
    view = info.get("view", {})
    if view.get("version"):
        apart = ", ".join(f"{n} ({v})" for n, v in view.get("apart", {}).items()) or "none"
        lines.append(f"weights version {view['version']}; kept apart (another version): {apart}")
    traces = info.get("traces")
    if traces:
        lines.append(
            f"traces: {traces['traced']} jobs traced here (sampling {traces['sample']:.2%}), "
            f"{traces['kept']} kept; `compass status --trace JOB` prints one"
        )
        for brief in traces["recent"]:
            state = "ok" if brief["ok"] else "failed"
            lines.append(
                f"  {brief['job']} ({brief['workflow']}): {brief['latency_ms']:.1f} ms, "
                f"{brief['tasks']} tasks, {state}"
            )
    taken = info.get("taken")
    if taken:
        lines.append("choices of the last jobs with run-time choices answered here:")
        for job in taken:
            lines.append(
                f"  {job['job']} ({job['workflow']}, {job['outcome']}): {job['taken']}; "
                f"{job['skipped']} tasks skipped"
            )
    return lines


def _version(version: str | None) -> str:
    return f", version {version}" if version else ""


def _learned(learned: list[dict[str, Any]] | None) -> str:
    """The task times a worker learned, as the view holds them: ``wf/task 412.0 ms (5 runs)``."""
    if not learned:
        return ""
    times = ", ".join(
        f"{e['workflow']}/{e['task']} {e['ms']:.1f} ms ({e['runs']} runs)" for e in learned
    )
    return f", learned {times}"


def _choices(learned: list[dict[str, Any]] | None) -> str:
    """The choices a worker learned that moved a likely path: ``agent/llm@0 search``."""
    if not learned:
        return ""
    return ", learned choices " + ", ".join(
        f"{e['workflow']}/{e['task']} {e['likely']}" for e in learned
    )


def result_text(value: Any) -> str:
    """A job's output as JSON (an array's ``tolist()``), or its ``repr`` when not JSON."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        value = tolist()
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _counts(models: dict[str, int]) -> str:
    """``{model: n}`` as ``model xn, ...`` (``none`` when empty)."""
    return ", ".join(f"{model} x{n}" for model, n in models.items()) or "none"
