"""``compass bench soak``: its flags checked before any worker starts, and how it judges a
run (RSS growth over the second half, false deaths in the workers' logs)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from compass._bench.soak import SoakConfig, _counted, rss_growth_mb
from compass._bench.soak_logs import false_deaths
from compass._cli.main import main
from compass.errors import ConfigError


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "1"], "--workers 1 with a restart: nobody would take the jobs"),
        (["--duration-s", "0"], "--duration-s must be a number of seconds > 0, got 0"),
        (["--sample-s", "-1"], "--sample-s must be a number of seconds > 0, got -1"),
        (["--in-flight", "0"], "Invalid value for '--in-flight'"),
        (["--jobs", "0"], "Invalid value for '--jobs'"),
        (["--rate", "-2"], "Invalid value for '--rate'"),
        (["--big-share", "1.5"], "Invalid value for '--big-share'"),
    ],
)
def test_a_bad_flag_is_one_line_and_starts_no_worker(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "soak", *argv])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1, err


def test_a_json_path_that_is_a_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "soak", "--json", str(tmp_path)])
    assert done.value.code == 2
    assert "is a folder, expected a file path" in capsys.readouterr().err


def test_the_runner_checks_its_config_too() -> None:
    with pytest.raises(ConfigError, match="--workers 1 with a restart"):
        SoakConfig(workers=1)
    with pytest.raises(ConfigError, match="big_share must be in"):
        SoakConfig(big_share=2.0)
    assert SoakConfig(workers=1, restart=False).limit_s == 600.0  # neither jobs nor duration
    assert SoakConfig(jobs=1_000_000).limit_s is None  # a job count alone: no time limit


def test_rss_growth_is_the_fitted_slope_over_the_second_half() -> None:
    # flat for the first half, then 1 MB per second: 50 MB over the 50 s of the second half
    series: list[dict[str, Any]] = [
        {"t": float(t), "rss_mb": 100.0 + max(0, t - 50), "instance": "a"} for t in range(101)
    ]
    assert rss_growth_mb(series, 100.0) == pytest.approx(50.0)
    flat: list[dict[str, Any]] = [
        {"t": float(t), "rss_mb": 100.0 + (t % 2), "instance": "a"} for t in range(101)
    ]
    assert abs(rss_growth_mb(flat, 100.0) or 0.0) < 1.0  # noise is not growth
    # a restart: only the last process's samples count
    restarted = [{**s, "instance": "b", "rss_mb": 60.0} if s["t"] > 70 else s for s in series]
    assert rss_growth_mb(restarted, 100.0) == pytest.approx(0.0)
    assert rss_growth_mb(series[:52], 100.0) is None  # too few samples in the second half


def test_a_loss_counts_as_false_unless_a_restart_explains_it(tmp_path: Path) -> None:
    def stamp(at: float) -> str:
        return datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]

    t0 = 1_800_000_000.0
    lines = {
        "w0": [
            (t0 + 10, "w0: peer w2 lost (it left the cluster); re-planning its jobs"),  # restart
            (t0 + 30, "w0: peer w1 lost (no answer to probes); re-planning its jobs"),  # false
            (t0 + 32, "w0: peer w2 removed: suspected for 2155 ms without refuting it"),  # false
            (t0 - 5, "w0: peer w1 lost (no answer); re-planning its jobs"),  # before the run
        ],
        "w2": [
            (t0 + 11, "w2: peer w0 lost (it closed); re-planning its jobs"),  # while restarting
            (t0 + 40, "w2: w0 had declared this worker dead (incarnation 0); rejoined as 1"),
            (t0 + 50, "w2: w1 suspected this worker (incarnation 1); refuted as incarnation 2"),
        ],
    }
    for name, entries in lines.items():
        text = "".join(f"{stamp(at)} WARNING compass.worker: {line}\n" for at, line in entries)
        (tmp_path / f"{name}.log").write_text(text)
    with open(tmp_path / "w0.log", "a") as log:  # a peer that left on purpose: INFO, routine
        log.write(f"{stamp(t0 + 60)} INFO compass.worker: w0: peer w1 removed: it left\n")
    logs = sorted(tmp_path.glob("*.log"))
    lost, declared, events = false_deaths(logs, [("w2", t0 + 9, t0 + 15)], t0)
    assert (lost, declared) == (2, 1)
    assert events == [
        {"t": 30.0, "worker": "w0", "peer": "w1", "why": "no answer to probes"},
        {"t": 32.0, "worker": "w0", "peer": "w2",
         "why": "suspected for 2155 ms without refuting it"},
        {"t": 40.0, "worker": "w0", "peer": "w2",
         "why": "declared dead (incarnation 0); rejoined as 1"},
    ]  # fmt: skip


def test_a_counter_is_summed_over_a_worker_s_processes() -> None:
    samples: list[dict[str, Any]] = [
        {"replans": 0}, {"replans": 2}, {"replans": 5}, {},  # a sample without it
        {"replans": 1}, {"replans": 3},  # restarted: it counts from 0 again
    ]  # fmt: skip
    assert _counted(samples, "replans") == 8
    assert _counted([], "replans") == 0
