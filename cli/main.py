"""The ``compass`` command line: flags and environment in, library calls out. No logic here.

This module is the root of it: the ``compass`` group with ``--version``, the commands of each
area (one module each: :mod:`.worker`, :mod:`.jobs`, :mod:`.sim`, :mod:`.bench`, :mod:`.demo`)
registered under it, and :func:`main`.

Every mistake a user can make on the command line (a bad flag value, a missing or broken
workload file, an unknown policy) ends as one line on stderr and a non-zero exit: :func:`main`
maps usage errors, :class:`CompassError` and ``OSError`` to that line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

import compass
from compass.errors import CompassError, ConfigError, WorkflowError

from . import (  # noqa: F401 - bench_long, bench_startup, bench_unfold register on bench
    bench,
    bench_long,
    bench_startup,
    bench_unfold,
    demo,
    jobs,
    sim,
    worker,
)
from .checks import one_line, usage_error

app = typer.Typer(
    name="compass",
    help="Decentralized scheduling of ML workflows across GPU workers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# a Typer added without a name lends its commands to the top level, listed by `compass --help`
# in this order, before the groups
app.add_typer(worker.commands)  # up
app.add_typer(jobs.commands)  # status, submit, token
app.add_typer(sim.commands)  # sim
app.add_typer(demo.commands)  # demo
app.add_typer(worker.worker_app, name="worker")
app.add_typer(bench.bench_app, name="bench")
app.add_typer(sim.workload_app, name="workload")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"compass {compass.__version__}")
        raise typer.Exit()


@app.callback()
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
        code = app(args=args, prog_name="compass", standalone_mode=False)
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
