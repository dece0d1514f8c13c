from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAPER = str(ROOT / "bench" / "workloads" / "paper.json")


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Environment for worker subprocesses: the repo on the path, no inherited token."""
    env = dict(os.environ)
    env.pop("COMPASS_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def compass_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]
