"""The capacity table as a file, and the one rule it sizes with everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass.config import WorkerConfig
from compass.elastic.live import LiveDesired, Seen
from compass.elastic.rule import ScaleConfig
from compass.elastic.table import TABLE_BAND, Capacity, read_capacity, table_rule
from compass.errors import ConfigError

TABLE = ((1, 0.5), (4, 0.5))


def test_a_margin_on_the_table_asks_for_more_workers() -> None:
    """One busy lane's worth of work at a utilization of 0.5 is two workers; aimed at half
    of it (margin 0.5), four."""
    assert ScaleConfig(by_size=TABLE).need(1.0, 1.0, 1) == 2
    assert ScaleConfig(by_size=TABLE, margin=0.5).need(1.0, 1.0, 1) == 4
    with pytest.raises(ConfigError, match="margin"):
        ScaleConfig(by_size=TABLE, margin=0.0)


def test_table_rule_is_the_bench_rule_within_bounds() -> None:
    rule = table_rule(Capacity(TABLE, 0.5), 2, 3)
    assert (rule.minimum, rule.maximum, rule.band) == (2, 3, TABLE_BAND)
    assert rule.by_size == TABLE and rule.margin == 0.5
    assert rule.need(1.0, 1.0, 1) == 3  # four wanted, held to MAX


def test_the_live_rule_sizes_by_the_table() -> None:
    """What the real worker computes: one busy lane, a table at 0.5 times a margin of 0.5
    wants four workers where one utilization of 0.6 wants two."""
    busy = [Seen(wait_s=0.0, lanes=1, busy=1)]
    assert LiveDesired(table_rule(Capacity(TABLE, 0.5))).update(0.0, busy).desired == 4
    assert LiveDesired().update(0.0, busy).desired == 2


def test_read_capacity_from_a_table_or_a_bench_json(tmp_path: Path) -> None:
    bare = tmp_path / "table.json"
    bare.write_text(json.dumps({"by_size": [[1, 0.5], [4, 0.5]], "margin": 0.8}))
    assert read_capacity(bare) == Capacity(TABLE, 0.8)
    bench = tmp_path / "bench.json"
    capacity = {"target_util": 0.3, "by_size": [[3, 0.2], [6, 0.3]], "margin": 0.9}
    other = {"target_util": 0.3, "by_size": [[3, 0.1]]}
    bench.write_text(json.dumps({"workloads": {"paper": {"capacity": capacity},
                                               "generated-1": {"capacity": other}}}))  # fmt: skip
    assert read_capacity(bench, "paper") == Capacity(((3, 0.2), (6, 0.3)), 0.9)
    assert read_capacity(bench, "generated-1") == Capacity(((3, 0.1),), 1.0)
    with pytest.raises(ConfigError, match="say which workload"):
        read_capacity(bench)
    with pytest.raises(ConfigError, match="no table for 'nope'"):
        read_capacity(bench, "nope")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "cannot read the capacity table"),
        ("[1, 2]", "is a JSON object"),
        ('{"by_size": 3}', "expected by_size"),
        ('{"by_size": []}', "at least one"),
        ('{"by_size": [[4, 0.5], [2, 0.5]]}', "increasing sizes"),
        ('{"by_size": [[2, 1.5]]}', "utilization in"),
        ('{"by_size": [[2, 0.5]], "margin": 2}', "margin must be in"),
        ('{"workloads": {}}', "holds no workload"),
    ],
)
def test_bad_tables_are_refused_in_one_line(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "table.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error) as caught:
        read_capacity(path)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read"):
        read_capacity(tmp_path / "missing.json")


def test_a_worker_config_refuses_a_bad_table() -> None:
    assert WorkerConfig(capacity=TABLE, capacity_margin=0.5).capacity == TABLE
    with pytest.raises(ConfigError, match="increasing sizes"):
        WorkerConfig(capacity=((4, 0.5), (1, 0.5)))
    with pytest.raises(ConfigError, match="at least one"):
        WorkerConfig(capacity_margin=0.5)
