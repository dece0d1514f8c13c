"""The suite's own set-up (tests/conftest.py): under ``pytest -n 2 --dist loadgroup``, as ``make
test`` runs it, the tests of a module with a module-scoped fixture run in one process, so that
the fixture (a cluster, a built wheel) is built once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SHARED = """
import os

import pytest


@pytest.fixture(scope="module")
def built():
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(os.environ.get("PYTEST_XDIST_WORKER", "-") + "\\n")


@pytest.mark.parametrize("n", range(6))
def test_uses_it(built, n):
    pass
"""

ALONE = """
import pytest


@pytest.mark.parametrize("n", range(6))
def test_alone(n):
    pass
"""


@pytest.mark.timeout(120)
def test_a_module_scoped_fixture_is_built_once_under_two_processes(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "test_alone.py").write_text(ALONE)
    log = tmp_path / "built.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BUILT_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
         "-q", "-o", "addopts=", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "12 passed" in done.stdout, done.stdout[-2000:]
    # built once, in one of the two processes (each builds its own when the module is split)
    assert len(log.read_text().split()) == 1, log.read_text()
