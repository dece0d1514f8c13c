"""``compass demo``: a local cluster racing compass against hash and jsq."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import Workers

#: the commands of this module, at the top level
commands = typer.Typer()


@commands.command()
def demo(
    seconds: Annotated[
        float, typer.Option(min=1, help="About how long the whole demo runs.")
    ] = 60.0,
    workers: Workers = 5,
) -> None:
    """Start a local cluster and race compass against hash and jsq on the paper's workload."""
    from compass._bench import demo as demo_module

    from .bench import stop_cleanly

    stop_cleanly()
    demo_module.run(seconds=seconds, workers=workers)
