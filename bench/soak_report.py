"""``compass bench soak``'s report: the table and verdict (:func:`print_soak`), the RSS plot
(:func:`plot_soak`), and the end of a run (:func:`finish`), which writes the whole JSON over
the results kept so far."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import print_table, pyplot, save_figure, write_json

__all__ = ["SLOW_S", "finish", "plot_soak", "print_soak"]

#: a job answered later than this counts as ``slow`` (its workflow's best is under 0.1 s)
SLOW_S = 5.0


def finish(
    out: dict[str, Any], json_path: str | None, checkpoint: Path | None, plot_path: str | None
) -> None:
    """A soak's end: its table and verdict printed, the whole JSON written and the results so
    far (``checkpoint``) removed, which it replaces; the RSS plot drawn."""
    print_soak(out)
    write_json(json_path, out)
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)
    if plot_path:
        plot_soak(plot_path, out)
        print(f"wrote {plot_path}")


def _at_or_before(series: Sequence[dict[str, Any]], t: float) -> dict[str, Any] | None:
    before = [s for s in series if s["t"] <= t]
    return before[-1] if before else (series[0] if series else None)


def print_soak(out: dict[str, Any]) -> None:
    """The soak's table (one row per worker) and verdict lines."""
    samples = out["samples"]
    end_s = max((s["t"] for s in samples.get("driver", [])), default=0.0)
    rows = []
    for name, growth in out["rss_growth_mb_second_half"].items():
        series = samples.get(name, [])
        first, middle = (series[0] if series else None), _at_or_before(series, end_s / 2)
        last = series[-1] if series else None

        def get(sample: dict[str, Any] | None, key: str) -> Any:
            return None if sample is None else sample.get(key)

        rows.append([
            name, get(first, "rss_mb"), get(middle, "rss_mb"), get(last, "rss_mb"), growth,
            out["rss_last_minus_middle_mb"].get(name), get(last, "open_fds"),
            get(last, "asyncio_tasks"), get(last, "threads"),
            (get(middle, "tables") or {}).get("answered_keys"),
            (get(last, "tables") or {}).get("answered_keys"),
        ])  # fmt: skip
    driver = samples.get("driver", [])
    if driver:
        middle = _at_or_before(driver, end_s / 2) or driver[0]
        rows.append([
            "driver", driver[0]["rss_mb"], middle["rss_mb"], driver[-1]["rss_mb"],
            out["driver_rss_growth_mb_second_half"], None, None, None, None, None, None,
        ])  # fmt: skip
    cfg, jobs = out["config"], out["jobs"]
    print_table(
        f"compass bench soak: {cfg['workers']} workers, {jobs['submitted']} jobs in "
        f"{out['duration_s']:g} s ({out['jobs_per_s']} jobs/s): RSS (MB) at the start, the "
        f"middle and the end, its growth over the second half (fit) and end-mid; at the end "
        f"fds, asyncio tasks, threads; answered keys kept (ingress) mid and end",
        ["", "start", "mid", "end", "2nd half", "end-mid", "fds", "tasks", "threads",
         "keys mid", "keys end"],
        rows,
    )  # fmt: skip
    errors = ", ".join(f"{k} {v}" for k, v in sorted(jobs["errors"].items())) or "none"
    print(
        f"jobs: submitted {jobs['submitted']}, ok {jobs['ok']}, failed {jobs['failed']} "
        f"({errors}), hung {jobs['hung']}, twice {jobs['twice']}; {jobs['big']} with "
        f"{cfg['big_bytes'] / (1 << 20):g} MiB inputs, {jobs['with_deadline']} with deadlines; "
        f"{jobs['slow']} answered after more than {SLOW_S:g} s (longest "
        f"{jobs['max_latency_s']:g} s)"
    )
    restart = out["restart"]
    if restart is not None and restart["error"] is not None:
        print(f"restart: {restart['worker']} could not be started again: {restart['error']}")
    elif restart is not None:
        print(
            f"restart: {restart['worker']} at {restart['at_s']:g} s, exited in "
            f"{restart['exit_s']} s, back in {restart['back_s']} s, every view whole "
            f"{restart['view_s']} s later"
        )
    refuted = sum(out["suspicions_refuted"].values())
    print(f"false deaths: {out['false_deaths']} (declared-dead notices: {out['declared_dead']}); "
          f"suspicions refuted in time: {refuted}; jobs re-planned: "
          f"{sum(out['replans'].values())}")  # fmt: skip
    grown = _grown_tables(samples, end_s)
    if grown:
        print("tables that grew over the second half: " + "; ".join(grown))
    failed = [name for name, ok in out["checks"].items() if not ok]
    verdict = "PASS" if out["passed"] else "FAIL: " + ", ".join(failed)
    print(f"verdict: {verdict} (RSS limit {cfg['rss_limit_mb']:g} MB over the second half)")


def _grown_tables(samples: dict[str, list[dict[str, Any]]], end_s: float) -> list[str]:
    """``worker table mid->end`` for each table that grew over the second half."""
    out = []
    for name, series in samples.items():
        if name == "driver" or not series:
            continue
        middle, last = _at_or_before(series, end_s / 2), series[-1]
        assert middle is not None
        if middle.get("instance") != last.get("instance"):
            continue
        before, after = middle.get("tables") or {}, last.get("tables") or {}
        out += [
            f"{name} {table} {before[table]}->{size}"
            for table, size in after.items()
            if table in before and size > before[table] and size > 16
        ]
    return out


def plot_soak(path: str, out: dict[str, Any]) -> None:
    """RSS per worker (and the driver's) against time, and each worker's kept answers."""
    plt = pyplot(path)

    samples = out["samples"]
    end_s = max((s["t"] for s in samples.get("driver", [])), default=0.0)
    fig, (rss, keys) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, series in samples.items():
        rss.plot([s["t"] for s in series], [s["rss_mb"] for s in series], label=name)
        if name != "driver":
            keys.plot(
                [s["t"] for s in series],
                [(s.get("tables") or {}).get("answered_keys") for s in series],
                label=name,
            )
    for ax in (rss, keys):
        ax.axvline(end_s / 2, color="grey", linestyle=":", label="second half")
        if out["restart"] is not None:
            ax.axvline(out["restart"]["at_s"], color="red", linestyle="--", label="restart")
        ax.set_xlabel("seconds")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    rss.set_title("RSS (MB)")
    keys.set_title("answered job keys kept (ingress)")
    jobs = out["jobs"]
    fig.suptitle(
        f"compass bench soak: {out['config']['workers']} workers, {jobs['submitted']} jobs, "
        f"{out['duration_s']:g} s"
    )
    save_figure(fig, path)
