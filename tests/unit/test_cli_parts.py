"""The command line is built from the parts a command line names: ``compass worker start``
builds (and imports) the worker's commands alone, and the whole ``compass`` is what it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import typer.core
import typer.main

from compass._cli.main import PARTS, Part, app_for, build_app

REPO = Path(__file__).resolve().parents[2]

#: the whole command line's top level, in the order ``compass --help`` lists it
TOP_LEVEL = ["up", "status", "submit", "token", "sim", "demo", "worker", "bench", "workload"]


def names(app: typer.Typer) -> list[str]:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    return list(group.commands)


def test_every_part_together_is_the_whole_command_line_in_its_order() -> None:
    assert names(build_app()) == TOP_LEVEL
    assert [word for part in PARTS for word in part.words] == TOP_LEVEL


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.group or p.words[0])
def test_a_part_answers_the_words_it_names(part: Part) -> None:
    assert names(build_app([part])) == list(part.words)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["worker", "start", "--port", "0"], ["worker"]),
        (["up", "3"], ["up"]),
        (["submit", "vqa"], ["status", "submit", "token"]),
        (["bench", "startup"], ["bench"]),
        ([], TOP_LEVEL),
        (["--version"], TOP_LEVEL),
        (["wroker"], TOP_LEVEL),  # the whole command line says what it meant
    ],
)
def test_a_command_line_builds_the_parts_its_first_word_names(
    args: list[str], expected: list[str]
) -> None:
    assert names(app_for(args)) == expected


def test_a_worker_start_imports_no_other_command_module() -> None:
    code = (
        "import json, sys\n"
        "from compass._cli.main import app_for\n"
        "app_for(['worker', 'start'])\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('compass._cli')]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "compass._cli.worker" in loaded
    assert {"compass._cli.jobs", "compass._cli.bench", "compass._cli.sim"}.isdisjoint(loaded)
