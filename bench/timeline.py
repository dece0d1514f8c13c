"""A benchmark run's timeline: every task and model load on every worker, as a Chrome trace
(``compass bench e2e --trace PATH``, which Perfetto and chrome://tracing open) and as a
per-worker Gantt chart (``--timeline PNG``).

The spans come from each worker's timeline ring (:mod:`compass.observe.timeline`), read over
the ``timeline`` request once a run's jobs are answered (a worker keeps its last 8192 task
spans and 2048 loads; a run that ends more on one worker loses its oldest, and says so).
Times are workload milliseconds from the run's first task (real time divided by the time
scale, as bench e2e reports latencies), so a task lasts what the workload says it does; the
loads of the cluster warming up before the run are left out.

Chrome trace layout: one process per worker (``pid``), named ``<policy>: <worker>``; one
thread per lane (``tid``: GPU lanes from 0, host lanes after them) and one for model loads;
``X`` (complete) events for tasks (a batch is one event naming every job in it), the wait for
a task's model inside it, and loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from compass.client import Client
from compass.cluster import LocalCluster

from .report import pyplot

__all__ = ["LOADS_TID", "chrome_trace", "collect", "plot_timeline", "write_chrome_trace"]

#: the thread id of a worker's model loads in the Chrome trace
LOADS_TID = 999


async def collect(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every worker's task spans and model loads (as maps of their fields), with its name,
    time scale and lanes; ``lost``: its ring wrapped, the oldest spans are missing."""
    parts = []
    for index in range(len(cluster.workers)):
        async with cluster.client(index) as client:
            parts.append(await _worker_part(client))
    return parts


async def _worker_part(client: Client) -> dict[str, Any]:
    timeline = await client.timeline()
    return {
        "name": timeline.name,
        "time_scale": timeline.time_scale,
        "lanes": timeline.lanes,
        "host_lanes": timeline.host_lanes,
        "spans": [span._asdict() for span in timeline.spans],
        "loads": [load._asdict() for load in timeline.loads],
        "lost": timeline.lost,
    }


def _origin(parts: Sequence[Mapping[str, Any]]) -> float:
    """The wall clock the run's timeline starts at: its first task queued (loads that ended
    before it, the cluster warming up before the run, are left out)."""
    times = [s["queued"] for p in parts for s in p["spans"]]
    if not times:
        times = [load["start"] for p in parts for load in p["loads"]]
    return min(times, default=0.0)


def _loads(part: Mapping[str, Any], t0: float) -> list[Mapping[str, Any]]:
    return [load for load in part["loads"] if load["end"] >= t0]


def _runs(spans: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """A worker's spans grouped by run: a batch's entries share a lane and a start."""
    runs: dict[tuple[int, float], list[Mapping[str, Any]]] = {}
    for span in spans:
        runs.setdefault((span["lane"], round(span["start"], 6)), []).append(span)
    return list(runs.values())


def chrome_trace(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The Chrome trace event document of ``runs`` (run name, e.g. the policy -> its
    workers' parts as :func:`collect` gives them)."""
    events: list[dict[str, Any]] = []
    for r, (run, parts) in enumerate(runs.items()):
        t0 = _origin(parts)
        for w, part in enumerate(parts):
            pid = r * 1000 + w + 1
            scale = part["time_scale"] or 1.0

            def us(wall: float, scale: float = scale, t0: float = t0) -> float:
                return round((wall - t0) / scale * 1e6, 1)

            events.append(_meta("process_name", pid, None, f"{run}: {part['name']}"))
            events.append(_meta("process_sort_index", pid, None, pid, key="sort_index"))
            for lane in range(part["lanes"] + part["host_lanes"]):
                host = lane >= part["lanes"]
                label = f"host lane {lane - part['lanes']}" if host else f"lane {lane}"
                events.append(_meta("thread_name", pid, lane, label))
            events.append(_meta("thread_name", pid, LOADS_TID, "model loads"))
            for entries in _runs(part["spans"]):
                first = entries[0]
                start, end = us(first["start"]), us(max(e["end"] for e in entries))
                name = f"{first['workflow']}/{first['task']}"
                if len(entries) > 1:
                    name = f"{first['model'] or first['task']} x{len(entries)}"
                events.append({
                    "name": name, "cat": "task", "ph": "X", "pid": pid, "tid": first["lane"],
                    "ts": start, "dur": max(end - start, 0.0),
                    "args": {
                        "jobs": [e["job"] for e in entries],
                        "tasks": sorted({f"{e['workflow']}/{e['task']}" for e in entries}),
                        "model": first["model"],
                        "cache_hit": first["cache_hit"],
                        "queued_ms": [round((e["start"] - e["queued"]) / scale * 1e3, 3)
                                      for e in entries],
                        "batch": len(entries),
                        "error": first["error"],
                    },
                })  # fmt: skip
                if first["fetch_s"] > 0:
                    events.append({
                        "name": f"wait for {first['model']}", "cat": "load wait", "ph": "X",
                        "pid": pid, "tid": first["lane"], "ts": start,
                        "dur": round(first["fetch_s"] / scale * 1e6, 1),
                    })  # fmt: skip
            for load in _loads(part, t0):
                kind = "prefetch" if load["prefetch"] else "load"
                events.append({
                    "name": f"{kind} {load['model']}", "cat": "load", "ph": "X", "pid": pid,
                    "tid": LOADS_TID, "ts": us(load["start"]),
                    "dur": max(us(load["end"]) - us(load["start"]), 0.0),
                    "args": {"model": load["model"], "prefetch": load["prefetch"],
                             "error": load["error"]},
                })  # fmt: skip
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "compass bench e2e",
            "time": "workload time from the run's first task: real time divided by each "
            "worker's time scale",
            "lost": sorted(
                f"{run}: {part['name']}"
                for run, parts in runs.items()
                for part in parts
                if part["lost"]
            ),
        },
    }


def _meta(name: str, pid: int, tid: int | None, value: Any, key: str = "name") -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": {key: value}}
    if tid is not None:
        event["tid"] = tid
    return event


def write_chrome_trace(path: str, runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    import json

    with open(path, "w") as f:
        json.dump(chrome_trace(runs), f, separators=(",", ":"))


def plot_timeline(path: str, runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """A Gantt chart per run: a row per worker lane and one for its model loads, tasks
    coloured by workflow (a batch hatched), loads grey (prefetches lighter)."""
    plt = pyplot(path)
    from matplotlib.patches import Patch

    names = list(runs)
    rows_per_run = [
        sum(p["lanes"] + p["host_lanes"] + 1 for p in runs[name]) for name in names
    ]  # fmt: skip
    fig, axes = plt.subplots(
        len(names), 1, figsize=(14, 1.0 + 0.32 * sum(rows_per_run) + 0.6 * len(names)),
        squeeze=False, height_ratios=[max(n, 1) for n in rows_per_run],
    )  # fmt: skip
    workflows = sorted(
        {s["workflow"] for parts in runs.values() for p in parts for s in p["spans"]}
    )
    palette = plt.get_cmap("tab10")
    colour = {wf: palette(i % 10) for i, wf in enumerate(workflows)}
    for ax, name in zip(axes[:, 0], names, strict=True):
        parts = runs[name]
        t0 = _origin(parts)
        labels: list[str] = []
        row = 0
        for part in parts:
            scale = part["time_scale"] or 1.0
            lanes = part["lanes"] + part["host_lanes"]
            for entries in _runs(part["spans"]):
                first = entries[0]
                start = (first["start"] - t0) / scale
                end = (max(e["end"] for e in entries) - t0) / scale
                y = row + first["lane"]
                ax.broken_barh(
                    [(start, max(end - start, 1e-6))],
                    (y + 0.1, 0.8),
                    facecolors=colour[first["workflow"]],
                    edgecolor="black",
                    linewidth=0.3,
                    hatch="///" if len(entries) > 1 else None,
                )
                if first["fetch_s"] > 0:
                    ax.broken_barh(
                        [(start, first["fetch_s"] / scale)],
                        (y + 0.1, 0.8),
                        facecolors="white",
                        edgecolor="grey",
                        linewidth=0.3,
                        alpha=0.7,
                    )
            for load in _loads(part, t0):
                start, end = (load["start"] - t0) / scale, (load["end"] - t0) / scale
                ax.broken_barh(
                    [(start, max(end - start, 1e-6))],
                    (row + lanes + 0.1, 0.8),
                    facecolors="#bbbbbb" if load["prefetch"] else "#555555",
                    edgecolor="black",
                    linewidth=0.3,
                )
            labels += [
                f"{part['name']} {'host ' if i >= part['lanes'] else ''}lane "
                f"{i - part['lanes'] if i >= part['lanes'] else i}"
                for i in range(lanes)
            ]
            labels.append(f"{part['name']} loads")
            row += lanes + 1
        ax.set_yticks([i + 0.5 for i in range(row)], labels, fontsize=7)
        ax.set_ylim(row, 0)
        ax.set_title(name, fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("workload seconds from the first task")
    handles = [Patch(facecolor=colour[wf], label=wf) for wf in workflows]
    handles += [
        Patch(facecolor="white", edgecolor="black", hatch="///", label="batch"),
        Patch(facecolor="white", edgecolor="grey", label="waiting for its model"),
        Patch(facecolor="#555555", label="model load"),
        Patch(facecolor="#bbbbbb", label="prefetch or warm"),
    ]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncols=min(len(handles), 6))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=120)
    plt.close(fig)
