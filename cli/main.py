"""The ``compass`` command line: flags and environment in, library calls out. No logic here.

This module is the root of it: the ``compass`` group with ``--version``, the commands of each
area (one module each: :mod:`.worker`, :mod:`.jobs`, :mod:`.sim`, :mod:`.bench`, :mod:`.demo`)
registered under it, and :func:`main`. Only the area a command line names is imported and
built (:func:`app_for`): a worker's start pays for ``worker``'s commands, not for all of them.

Every mistake a user can make on the command line (a bad flag value, a missing or broken
workload file, an unknown policy) ends as one line on stderr and a non-zero exit: :func:`main`
maps usage errors, :class:`CompassError` and ``OSError`` to that line.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import typer

import compass
from compass.errors import CompassError, ConfigError, WorkflowError

from .checks import one_line, usage_error


@dataclass(frozen=True)
class Part:
    """One Typer of the command line: the modules of this folder that define (and register on)
    it, the attribute of the first that holds it, the group it is added as (None: its
    commands are lent to the top level) and the first words of the command lines it answers."""

    modules: tuple[str, ...]
    typer: str
    group: str | None
    words: tuple[str, ...]


#: everything ``compass`` holds, in the order ``compass --help`` lists it: the top-level
#: commands, then the groups. A test checks ``words`` against the commands each part defines.
PARTS = (
    Part(("worker",), "commands", None, ("up",)),
    Part(("jobs",), "commands", None, ("status", "submit", "token")),
    Part(("sim",), "commands", None, ("sim",)),
    Part(("demo",), "commands", None, ("demo",)),
    Part(("worker",), "worker_app", "worker", ("worker",)),
    # bench_long, bench_startup and bench_unfold register their commands on bench's group
    Part(
        ("bench", "bench_long", "bench_startup", "bench_unfold"), "bench_app", "bench", ("bench",)
    ),
    Part(("sim",), "workload_app", "workload", ("workload",)),
)


def build_app(parts: Sequence[Part] = PARTS) -> typer.Typer:
    """The ``compass`` group with ``--version`` and ``parts`` (every part: the whole command
    line), importing only their modules."""
    app = typer.Typer(
        name="compass",
        help="Decentralized scheduling of ML workflows across GPU workers.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    app.callback()(_root)
    for part in parts:
        modules = [importlib.import_module(f"{__package__}.{name}") for name in part.modules]
        app.add_typer(getattr(modules[0], part.typer), name=part.group)
    return app


def app_for(args: Sequence[str]) -> typer.Typer:
    """The command line that ``args`` need: the parts that answer its first word, or all of
    them (no word, an option such as ``--version`` first, or a word none answers, which the
    whole command line then reports). Typer reads the signature of every command it builds,
    so building only ``worker`` cut each ``compass worker start`` by 30-45 ms of CPU, 5-8% of
    a worker's start (docs/RESULTS.md), and other commands alike."""
    word = args[0] if args else ""
    parts = [part for part in PARTS if word in part.words]
    return build_app(parts or PARTS)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"compass {compass.__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", is_eager=True, callback=_version
        ),
    ] = False,
) -> None:
    """Decentralized scheduling of ML workflows across GPU workers."""


#: columns ``--help`` wraps at when stdout is no terminal (piped into ``less`` or ``grep``, or
#: a file): rich would take 80, which wraps an option's help into a column of a few words
PIPED_HELP_WIDTH = 100


def _help_width() -> None:
    """Wrap ``--help`` at :data:`PIPED_HELP_WIDTH` when piped, unless ``COLUMNS`` or typer's
    ``TERMINAL_WIDTH`` says otherwise; a terminal's own width is rich's to read. typer's rich
    help reads no ``context_settings`` width, only ``rich_utils.MAX_WIDTH``, which
    ``rich_utils`` sets from ``TERMINAL_WIDTH`` as typer imports it to print help. So the
    environment says it, and nothing imports ``rich_utils`` here: with rich it would cost every
    command 70 ms of CPU (a tenth of a worker's start) that prints no help."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return
    loaded = sys.modules.get("typer.rich_utils")
    if loaded is None:
        os.environ.setdefault("TERMINAL_WIDTH", str(PIPED_HELP_WIDTH))
    elif getattr(loaded, "MAX_WIDTH", None) is None:  # imported already (a test's process)
        loaded.MAX_WIDTH = PIPED_HELP_WIDTH  # type: ignore[attr-defined]


def main(argv: Sequence[str] | None = None) -> None:
    """The ``compass`` script: exits with the command's code; a user's mistake is one line on
    stderr (exit 2), never a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    _help_width()
    try:
        code = app_for(args)(args=args, prog_name="compass", standalone_mode=False)
    except typer.TyperException as exc:  # usage: a bad flag, a bad value, a missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            # a group called bare: its help (typer has already printed it where rich is used)
            if exc.format_message().strip():
                typer.echo(exc.format_message(), err=True)
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "compass"
        typer.echo(f"{where}: {usage_error(exc, args)}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("compass: aborted", err=True)
        sys.exit(1)
    except (ConfigError, WorkflowError) as exc:  # a bad value or file, found past parsing
        typer.echo(f"compass: {one_line(str(exc))}", err=True)
        sys.exit(2)
    except CompassError as exc:
        typer.echo(f"compass: {one_line(str(exc))}", err=True)
        sys.exit(1)
    except OSError as exc:  # a file named on the command line that cannot be read or written
        typer.echo(f"compass: {one_line(str(exc))}", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
