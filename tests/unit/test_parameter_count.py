"""No function outside ``cli/`` takes more than 8 parameters (a project rule): past that, a
call is a list of loose settings, which belong in a small frozen dataclass.

Counted: positional and keyword parameters, ``*args`` and ``**kwargs`` one each; ``self`` and
``cls`` are not. The command-line functions in ``cli/`` are exempt: each flag is a parameter
there (typer), and they build a config object of them; what they call in ``cli/`` takes
objects, and is held to the rule too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the packages checked (compass/_cli and compass/_bench are links to cli/ and bench/)
CHECKED = ("compass", "bench")
SKIPPED = {REPO / "compass" / "_cli", REPO / "compass" / "_bench"}
MOST = 8
#: functions over the limit for now, each with why; a waiver that no longer applies fails too
WAIVED: dict[str, str] = {}


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a caller may pass: ``self`` and ``cls`` are not counted."""
    args = function.args
    named = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if named and named[0] in ("self", "cls"):
        named = named[1:]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def sources() -> Iterator[Path]:
    for package in CHECKED:
        for path in sorted((REPO / package).rglob("*.py")):
            if not any(path.is_relative_to(skipped) for skipped in SKIPPED):
                yield path


def too_many(path: Path) -> dict[str, int]:
    """``"path name"`` -> parameters, of the functions of ``path`` over the limit."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {
        f"{path.relative_to(REPO).as_posix()} {node.name}": parameters(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and parameters(node) > MOST
    }


def test_the_rule_counts_what_a_caller_passes() -> None:
    code = (
        "def f(a, b, /, c, *d, e, **f): pass\n"
        "class C:\n"
        "    def m(self, a, b, c, d, e, f, g, h, i): pass\n"
    )
    module = ast.parse(code)
    f, cls = module.body
    assert isinstance(f, ast.FunctionDef) and isinstance(cls, ast.ClassDef)
    method = cls.body[0]
    assert isinstance(method, ast.FunctionDef)
    assert (parameters(f), parameters(method)) == (6, 9)


def is_command(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` is a typer command (decorated ``@<app>.command(...)``)."""
    return any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
        for d in function.decorator_list
    )


def test_what_the_commands_call_takes_objects() -> None:
    paths = sorted((REPO / "cli").rglob("*.py"))
    assert paths
    over = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = [
            n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        over += [
            f"{path.relative_to(REPO).as_posix()} {f.name}()"
            for f in functions
            if not is_command(f) and parameters(f) > MOST
        ]
    assert not over, "have these take the config object the command builds:\n" + "\n".join(over)


def test_no_function_outside_cli_takes_more_than_eight_parameters() -> None:
    checked = list(sources())
    assert len(checked) > 100  # the walk found the packages
    over = {name: count for path in checked for name, count in too_many(path).items()}
    offenders = [f"{name}() takes {count}" for name, count in over.items() if name not in WAIVED]
    assert not offenders, "group these parameters in a frozen dataclass:\n" + "\n".join(offenders)
    assert set(WAIVED) <= set(over), f"no longer over the limit: {set(WAIVED) - set(over)}"
