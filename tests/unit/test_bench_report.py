"""write_json, the one writer of every benchmark's JSON: a write that fails leaves the last whole
file (the soak keeps its results so far this way, an hour's run in one file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass._bench.report import write_json


def test_a_write_that_fails_leaves_the_last_whole_file_and_no_part(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "results.json"
    write_json(str(path), {"runs": 1}, announce=False)
    assert json.loads(path.read_text()) == {"runs": 1}
    with pytest.raises(TypeError):
        write_json(str(path), {"runs": 2, "bad": object()}, announce=False)
    assert json.loads(path.read_text()) == {"runs": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]
    write_json(str(path), {"runs": 3}, announce=False)
    assert json.loads(path.read_text()) == {"runs": 3}
