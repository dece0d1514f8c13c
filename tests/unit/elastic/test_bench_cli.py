"""``compass bench elastic``'s subset options: refused in one line before any simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compass._bench import elastic
from compass._cli.main import main
from compass.errors import ConfigError


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--workloads", "generated-9"], "unknown workload generated-9; known: "),
        (["--clusters", "autoscale,fastest"], "unknown cluster fastest; known: autoscale"),
    ],
)
def test_an_unknown_subset_is_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    assert_one_line(capsys, ["bench", "elastic", "--generated", "1", *args], error)


def assert_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], error: str) -> None:
    """``compass ARGV`` exits non-zero with ``error`` in a one-line message, having run
    nothing."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code != 0
    err = capsys.readouterr().err
    assert error in err and len(err.splitlines()) == 1, err


def test_a_calibration_is_reused_from_an_earlier_run(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier.json"
    table = [[3, 0.2], [6, 0.3]]
    earlier.write_text(json.dumps({"workloads": {"generated-1": {"capacity": {
        "target_util": 0.25, "by_size": table}}}}))  # fmt: skip
    known = elastic._known_capacity(str(earlier))
    assert known == {"generated-1": (0.25, ((3, 0.2), (6, 0.3)), None)}  # no margin yet
    earlier.write_text(json.dumps({"workloads": {"paper": {"capacity": {
        "target_util": 0.25, "by_size": table, "margin": 0.8}}}}))  # fmt: skip
    assert elastic._known_capacity(str(earlier))["paper"][2] == 0.8
    earlier.write_text("{}")
    with pytest.raises(ConfigError, match="cannot reuse the calibration"):
        elastic._known_capacity(str(earlier))


def test_a_capacity_table_is_for_traffic_and_must_be_readable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["sim", "--capacity-table", str(tmp_path / "t.json")])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == "compass: --capacity-table is for --traffic"
    curve = tmp_path / "curve.csv"
    curve.write_text("minute,jobs\n0,10\n")
    with pytest.raises(SystemExit) as done:
        main(["sim", "--traffic", str(curve), "--capacity-table", str(tmp_path / "t.json")])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("compass: cannot read the capacity table")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ["--cold-s", "5,ten"],
            "--cold-s needs seconds of at least 0, comma-separated, got '5,ten'",
        ),
        (
            ["--cooldown-s", "-1"],
            "--cooldown-s needs seconds of at least 0, comma-separated, got '-1'",
        ),
        (["--real", "--cache-mb", "1000,big"], "--cache-mb needs whole MB"),
        (["--real", "--cache-mb", "1.5"], "--cache-mb needs whole MB"),
        (["--real", "--cache-mb", "0"], "--cache-mb needs whole MB"),
    ],
)
def test_a_bad_replicas_option_is_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    assert_one_line(capsys, ["bench", "replicas", "--generated", "0", *args], error)
