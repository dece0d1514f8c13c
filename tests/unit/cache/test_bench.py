"""The cache benchmark runs end to end (it measures; this only checks it works)."""

from __future__ import annotations

import json

from compass._bench import cache


def test_cache_benchmark_quick_run_writes_json(tmp_path, capsys):
    path = tmp_path / "cache.json"
    result = cache.run(json_path=str(path), quick=True)
    assert json.loads(path.read_text())["operations"].keys() == result["operations"].keys()
    for row in result["operations"].values():
        assert row["p50_us"] <= row["p99_us"]
    assert "plan eviction" in capsys.readouterr().out
