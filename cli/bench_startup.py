"""``compass bench startup``: how long a worker takes from its process's start to serving, and
which imports that time goes to (bench/startup.py), registered on the ``bench`` group."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .bench import bench_app
from .checks import check_output, check_workload, fail
from .options import JsonPath


@bench_app.command("startup")
def bench_startup(
    workers: Annotated[
        int, typer.Option(min=0, help="Workers started one after another per round.")
    ] = 5,
    together: Annotated[int, typer.Option(min=0, help="Workers started at once per round.")] = 3,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds per tree and bytecode setting.")] = 3,
    bytecode: Annotated[
        str,
        typer.Option(
            help="cached (written under a folder of the run's), none (PYTHONDONTWRITEBYTECODE: "
            "compiled each start) or both."
        ),
    ] = "both",
    worker_pythonpath: Annotated[
        str | None,
        typer.Option(help="Start workers from this checkout too, in turn (a before/after)."),
    ] = None,
    workload: Annotated[
        str | None, typer.Option(help="Workload the workers run emulated (default: paper.json).")
    ] = None,
    json_path: JsonPath = None,
) -> None:
    """Seconds from a worker process's spawn to its 'listening' line, and what its imports cost.

    Workers start alone, one after another joining the first, and several at once; per start
    the wall and the CPU seconds, and one start per round profiled with -X importtime."""
    from compass._bench import startup

    settings = {"both": startup.BYTECODE, "cached": ("cached",), "none": ("none",)}
    if bytecode not in settings:
        fail(f"--bytecode {bytecode!r}: expected cached, none or both", 2)
    if worker_pythonpath is not None and not (Path(worker_pythonpath) / "compass").is_dir():
        fail(f"--worker-pythonpath {worker_pythonpath}: no compass package in it", 2)
    path = workload or startup.WORKLOAD
    check_workload(path)
    check_output(json_path, "--json")
    startup.run(
        workers=workers,
        together=together,
        rounds=rounds,
        bytecode=settings[bytecode],
        worker_pythonpath=worker_pythonpath,
        workload=path,
        json_path=json_path,
    )
