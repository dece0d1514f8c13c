"""``compass bench startup`` on real worker processes: every start timed to its listening line,
wall and CPU, and one start's imports read, in the JSON it writes."""

from __future__ import annotations

import json
from pathlib import Path

from compass._bench import startup


def test_bench_startup_times_each_start_and_reads_one_starts_imports(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    startup.run(workers=1, together=2, rounds=1, bytecode=("cached",), json_path=str(out))
    written = json.loads(out.read_text())
    starts = {(s["mode"], s["round"]) for s in written["starts"]}
    assert len(written["starts"]) == 4  # the seed, one joining it, two at once
    assert starts == {("alone", 0), ("one after another", 0), ("at once", 0)}
    assert {row["mode"] for row in written["summary"]} == set(startup.MODES)
    for start in written["starts"]:
        assert start["cpu_s"] is None or start["cpu_s"] > 0
        assert start["wall_s"] > 0
    imports = written["imports"]["this tree"]
    assert imports["total"] > 0 and imports["modules"] > 100
    # the worker's modules load under the command, which `-m compass` imports first
    assert "compass.worker.process <- (top)" in imports["entries"]
    assert imports["packages"]["compass.core"] > 0
