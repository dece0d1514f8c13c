"""``compass bench startup`` on real worker processes: every start timed to its listening line,
wall and CPU, and one start's imports read per tree, in the JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

from compass._bench import startup

REPO = Path(__file__).resolve().parents[2]


def test_bench_startup_times_each_start_and_reads_each_trees_imports(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    # this checkout twice: as itself, and as "another" one on PYTHONPATH
    startup.run(
        workers=1,
        together=1,
        rounds=1,
        bytecode=("cached",),
        worker_pythonpath=str(REPO),
        json_path=str(out),
    )
    written = json.loads(out.read_text())
    assert {row["mode"] for row in written["summary"]} == set(startup.MODES)
    assert len(written["starts"]) == 6  # per tree: the seed, one joining it, one more at once
    for start in written["starts"]:
        assert start["cpu_s"] is None or start["cpu_s"] > 0
        assert start["wall_s"] > 0
    mine, other = written["imports"]["this tree"], written["imports"][str(REPO)]
    # each profile is one start's: the same modules load, no log holds two starts
    assert mine["modules"] == other["modules"] > 100
    # the worker's modules load under the command, which `-m compass` imports first
    assert "compass.worker.process <- (top)" in mine["entries"]
    assert mine["packages"]["compass.core"] > 0
