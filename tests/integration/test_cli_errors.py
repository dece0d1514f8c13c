"""Every bad flag value or bad file given to the ``compass`` script: one line on stderr that
names what was wrong, a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import PAPER

SCRIPT = Path(sys.executable).with_name("compass")

# (id, arguments, what the one line must contain, extra environment)
CASES: list[tuple[str, list[str], list[str], dict[str, str]]] = [
    ("log-level", ["worker", "start", "--log-level", "loud"], ["--log-level", "loud"], {}),
    ("zero-lanes", ["worker", "start", "--lanes", "0"], ["--lanes", "'0'"], {}),
    ("negative-lanes", ["worker", "start", "--lanes", "-3"], ["--lanes", "-3"], {}),
    ("negative-cache", ["worker", "start", "--cache-mb", "-5"], ["--cache-mb", "-5"], {}),
    ("port-range", ["worker", "start", "--port", "70000"], ["--port", "70000"], {}),
    ("not-a-number", ["worker", "start", "--slab-mb", "big"], ["--slab-mb", "big"], {}),
    ("env-variable", ["worker", "start"], ["COMPASS_LANES", "zero"], {"COMPASS_LANES": "zero"}),
    ("unknown-flag", ["worker", "start", "--cach-mb", "5"], ["--cach-mb"], {}),
    ("backend", ["worker", "start", "--backend", "quantum"], ["quantum"], {}),
    (
        "unknown-policy",
        ["worker", "start", "--port", "0", "--workload", PAPER, "--policy", "fastest"],
        ["fastest"],
        {},
    ),
    ("no-app", ["worker", "start", "--port", "0"], ["--app", "--workload"], {}),
    (
        "missing-workload",
        ["worker", "start", "--port", "0", "--workload", "missing.json"],
        ["missing.json"],
        {},
    ),
    (
        "not-json",
        ["worker", "start", "--port", "0", "--workload", "notjson.json"],
        ["notjson.json", "not valid JSON"],
        {},
    ),
    (
        "deep-json",
        ["worker", "start", "--port", "0", "--workload", "deep.json"],
        ["deep.json", "nested too deeply"],
        {},
    ),
    (
        "bad-join",
        ["worker", "start", "--port", "0", "--workload", PAPER, "--join", "nonsense:abc"],
        ["nonsense:abc"],
        {},
    ),
    (
        "missing-app",
        ["worker", "start", "--port", "0", "--app", "no_such_app_module"],
        ["no_such_app_module"],
        {},
    ),
    ("up-workers", ["up", "--workers", "0"], ["--workers", "'0'"], {}),
    ("up-policy", ["up", "--policy", "fastest"], ["fastest"], {}),
    ("up-missing-workload", ["up", "--workload", "missing.json"], ["missing.json"], {}),
    ("up-deep-json", ["up", "--workload", "deep.json"], ["deep.json"], {}),
    ("up-both", ["up", "--workload", PAPER, "--app", "x"], ["--workload", "--app"], {}),
    ("up-worker-flag-value", ["up", "--lanes", "abc"], ["--lanes", "abc"], {}),
    ("up-worker-log-level", ["up", "--log-level", "loud"], ["loud"], {}),
    ("up-unknown-flag", ["up", "--no-such-flag"], ["--no-such-flag"], {}),
    ("up-owns-port", ["up", "--port", "7341"], ["--port"], {}),
    (
        "up-missing-app",
        ["up", "--workers", "1", "--app", "no_such_app_module"],
        ["no_such_app_module"],
        {},
    ),
    ("sim-workers", ["sim", "--workers", "0"], ["--workers", "'0'"], {}),
    ("sim-jobs", ["sim", "--jobs", "-1"], ["--jobs", "-1"], {}),
    ("sim-policy", ["sim", "--policies", "compass,fastest"], ["fastest"], {}),
    ("sim-arrival", ["sim", "--arrival", "weird"], ["weird"], {}),
    ("sim-sweep", ["sim", "--servers-sweep", "5..2"], ["5..2"], {}),
    ("sim-not-json", ["sim", "--workload", "notjson.json"], ["notjson.json"], {}),
    ("sim-deep-json", ["sim", "--workload", "deep.json"], ["deep.json"], {}),
    ("sim-json-path", ["sim", "--json", "/proc/no/such.json"], ["/proc/no/such.json"], {}),
    ("sim-plot", ["sim", "--plot", "out.png"], ["--plot", "matplotlib"], {"HIDE_MPL": "1"}),
    (
        "e2e-plot",
        ["bench", "e2e", "--plot", "out.png"],
        ["--plot", "matplotlib"],
        {"HIDE_MPL": "1"},
    ),
    ("e2e-policy", ["bench", "e2e", "--policies", "fastest"], ["fastest"], {}),
    ("e2e-workers", ["bench", "e2e", "--workers", "-2"], ["--workers", "-2"], {}),
    ("chain-tasks", ["bench", "chain", "--tasks", "7", "--no-dask"], ["--tasks", "7"], {}),
    ("job-jobs", ["bench", "job", "--jobs", "0"], ["--jobs", "'0'"], {}),
    ("demo-seconds", ["demo", "--seconds", "0"], ["--seconds", "'0'"], {}),
    ("submit-input", ["submit", "127.0.0.1:1", "echo", "--input", "x"], ["--input", "'x'"], {}),
    ("submit-args", ["submit", "a", "b", "c"], ["a b c"], {}),
    ("status-address", ["status", "nonsense:abc"], ["nonsense:abc"], {}),
    ("top-level-flag", ["--nope"], ["--nope"], {}),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder with broken workload files and a matplotlib that will not import."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "notjson.json").write_text("{nope")
    depth = 100_000  # past Python's recursion limit: json raises RecursionError
    (folder / "deep.json").write_text("[" * depth + "]" * depth)
    hidden = folder / "hidden" / "matplotlib"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('matplotlib hidden by the test')\n")
    return folder


@pytest.mark.parametrize(
    ("args", "names", "extra_env"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_value_is_one_line_and_a_non_zero_exit(
    files: Path, args: list[str], names: list[str], extra_env: dict[str, str]
) -> None:
    if not SCRIPT.exists():
        pytest.skip("the compass console script is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPASS_")}
    env.pop("PYTHONPATH", None)
    env.update(extra_env)
    if env.pop("HIDE_MPL", None):
        env["PYTHONPATH"] = str(files / "hidden")
    done = subprocess.run(
        [str(SCRIPT), *args],
        cwd=files,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for name in names:
        assert name in lines[0], lines[0]
    assert done.stdout == ""
