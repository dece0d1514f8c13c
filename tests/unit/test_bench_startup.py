"""``compass bench startup``: its reading of ``-X importtime`` and its checks of the flags (the
run itself starts workers: `compass bench startup --rounds 1` by hand)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from compass._bench.startup import cpu_seconds, import_profile, parse_importtime
from compass._cli.main import main

# what `python -X importtime -m compass ...` writes: each module after those it imported
IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       100 |        100 |   _io
import time:       200 |        300 | site
import time:       500 |        500 |       numpy._core
import time:      1000 |       1500 |     numpy
import time:       300 |       1800 |   compass.workflow.profile
import time:        50 |         50 |   compass.errors
import time:       400 |       2250 | compass.app
compass worker listening on 127.0.0.1:1
"""


def test_each_import_line_is_read_with_what_imported_it() -> None:
    lines = parse_importtime(IMPORTTIME)
    assert [(line.module, line.depth, line.importer) for line in lines] == [
        ("_io", 1, "site"),
        ("site", 0, ""),
        ("numpy._core", 3, "numpy"),
        ("numpy", 2, "compass.workflow.profile"),
        ("compass.workflow.profile", 1, "compass.app"),
        ("compass.errors", 1, "compass.app"),
        ("compass.app", 0, ""),
    ]
    assert (lines[3].self_us, lines[3].cumulative_us) == (1000, 1500)


def test_the_profile_sums_packages_and_names_where_each_cost_enters() -> None:
    profile = import_profile(parse_importtime(IMPORTTIME))
    assert profile["total"] == pytest.approx(2.55)
    assert profile["packages"]["numpy"] == pytest.approx(1.5)
    assert profile["packages"]["compass.workflow"] == pytest.approx(0.3)
    # numpy enters through compass code; numpy._core through numpy's own, so is no entry
    assert profile["entries"] == {
        "site <- (top)": 0.3,
        "compass.app <- (top)": 2.25,
        "numpy <- compass.workflow.profile": 1.5,
        "compass.workflow.profile <- compass.app": 1.8,
        "compass.errors <- compass.app": 0.05,
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bytecode", "some"], "--bytecode 'some': expected cached, none or both"),
        (["--worker-pythonpath", "/nonexistent"], "/nonexistent: no compass package in it"),
        (["--workers", "-1"], "--workers"),
        (["--workload", "/nonexistent.json"], "/nonexistent.json"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "startup", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read from /proc")
def test_a_process_cpu_reading_grows_as_its_own_count_does() -> None:
    # compared as growth: threads that have ended count in the process's own count only
    reading, own = cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - own < 0.1:  # a tenth of a second of CPU at least
        pass
    later, own_later = cpu_seconds(os.getpid()), time.process_time()
    assert reading is not None and later is not None
    assert later - reading == pytest.approx(own_later - own, abs=0.03)  # a tick, at worst
