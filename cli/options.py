"""The options more than one command takes, declared once: each an ``Annotated`` type carrying
its flag, help and environment variable, so a command's signature reads as its flags.

Declarations only; what is checked after parsing is in :mod:`.checks`. An option one command
alone takes is declared in that command's signature.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

TIME_SCALE_HELP = (
    "Real seconds per spec second (default: 0.25, slower for workloads whose shortest "
    "workflow would take under 25 ms real)."
)


class Batching(StrEnum):
    on = "on"
    off = "off"


class BatchGain(StrEnum):
    """The curves of :data:`compass.workflow.batching.BATCH_GAINS` (a test pins them equal)."""

    none = "none"
    mild = "mild"
    strong = "strong"


# connecting to a cluster: every command that talks to a worker, and the worker itself
Token = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="COMPASS_TOKEN", help="Shared cluster token (or COMPASS_TOKEN)."
    ),
]
TlsCert = Annotated[
    str | None,
    typer.Option(
        "--tls-cert",
        envvar="COMPASS_TLS_CERT",
        help="Mutual TLS: this side's certificate, PEM (with --tls-key and --tls-ca).",
        show_default=False,
    ),
]
TlsKey = Annotated[
    str | None,
    typer.Option(
        "--tls-key",
        envvar="COMPASS_TLS_KEY",
        help="Mutual TLS: the private key of --tls-cert, PEM.",
        show_default=False,
    ),
]
TlsCa = Annotated[
    str | None,
    typer.Option(
        "--tls-ca",
        envvar="COMPASS_TLS_CA",
        help="Mutual TLS: the cluster CA, PEM; only certificates it signed are trusted.",
        show_default=False,
    ),
]

# benchmarks and the simulator
JsonPath = Annotated[str | None, typer.Option("--json", help="Write results as JSON here.")]
Quick = Annotated[bool, typer.Option("--quick", help="A shorter run.")]
Policies = Annotated[
    str, typer.Option(help="Comma-separated policies: compass, jsq, heft, hash, random, ...")
]
Arrival = Annotated[str, typer.Option(help="uniform, poisson or gamma.")]
HostLanes = Annotated[
    int,
    typer.Option(min=0, help="Host lanes per worker for model-less tasks (0: they use the GPU)."),
]
Workers = Annotated[int, typer.Option(min=1, help="Worker processes.")]
Jobs = Annotated[int, typer.Option(min=1, help="Jobs per policy.")]
Capacity = Annotated[
    bool,
    typer.Option(
        "--capacity", help="Search each policy's highest load multiple that meets each SLO."
    ),
]
SloFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--slo",
        help="--capacity: an SLO besides median2, p95x3, p99x5: pNNxS or medianS (repeatable).",
    ),
]
MaxLoad = Annotated[float, typer.Option(help="--capacity: the highest load multiple tried.")]
BatchingFlag = Annotated[
    Batching,
    typer.Option(
        "--batching",
        case_sensitive=False,
        help="Batched execution on every worker (off: every task runs one item at a time).",
    ),
]
BatchGainFlag = Annotated[
    BatchGain | None,
    typer.Option(
        "--batch-gain",
        case_sensitive=False,
        help="A batch curve for every model task whose spec declares none: none (a batch of b "
        "costs b runs), mild (each extra item +15% of a run), strong (+5%); default: only "
        "tasks whose spec declares a batch profile batch.",
        show_default=False,
    ),
]
