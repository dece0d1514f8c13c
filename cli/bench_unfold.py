"""``compass bench unfold``: what each lever of planning a workflow decided at run time is worth
(bench/unfold.py), registered on the ``bench`` group."""

from __future__ import annotations

from typing import Annotated

import typer

from .bench import bench_app
from .checks import check_output, check_workload, comma_list, fail
from .options import Jobs, JsonPath


@bench_app.command("unfold")
def bench_unfold(
    workloads: Annotated[
        str,
        typer.Option(
            help="Comma-separated workload specs (default: agent-loop.json and triage-rag.json)."
        ),
    ] = "",
    variants: Annotated[
        str,
        typer.Option(
            help="Separated by ';' (default: all): compass, compass-chained, jit, ...; a name "
            "ending in ', preempt' runs with preemption at step boundaries."
        ),
    ] = "",
    seeds: Annotated[str, typer.Option(help="Arrival seeds, 0-2 or 0,1,2.")] = "0,1,2",
    jobs: Jobs = 600,
    json_path: JsonPath = None,
) -> None:
    """Capacity at median2 / p95x3 / p99x5 of each variant of compass on workflows decided at
    run time, against each step run as a job of its own (compass-chained), in the simulator;
    compass over each as the mean of per-seed ratios."""
    from compass._bench import unfold
    from compass.sim.capacity import parse_seeds

    names = [v.strip() for v in variants.split(";") if v.strip()] or list(unfold.VARIANTS)
    unknown = [v for v in names if v.removesuffix(unfold.PREEMPT) not in unfold.VARIANTS]
    if unknown:
        fail(
            f"--variants: unknown {unknown[0]!r}; expected some of: {'; '.join(unfold.VARIANTS)}", 2
        )
    if unfold.base_of(names) is None:
        fail("--variants: compass among them (the others are compared with it)", 2)
    paths = comma_list(workloads) or list(unfold.WORKLOADS)
    for path in paths:
        check_workload(path)
    check_output(json_path, "--json")
    unfold.run(paths, names, parse_seeds(seeds), jobs, json_path)
