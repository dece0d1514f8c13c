"""The commands that talk to a running cluster: ``compass status`` (a worker's status, or a
job's trace it kept), ``compass submit`` (run one job), and ``compass token`` (a new token)."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from compass.config import DEFAULT_PORT, TLSConfig
from compass.errors import CompassError, ConfigError
from compass.submission import JobOptions

if TYPE_CHECKING:
    from compass.streamed import Output

from .checks import check_output, fail, tls_config
from .format import result_text, status_lines
from .inputs import parse_input
from .options import TlsCa, TlsCert, TlsKey, Token
from .running import kept_trace, run_job, stream_job, worker_status, worker_story
from .story import story_lines
from .traces import trace_lines

#: the commands of this module, all at the top level
commands = typer.Typer()

DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"


class OnMiss(StrEnum):
    drop = "drop"
    finish = "finish"


@commands.command()
def status(
    address: Annotated[str, typer.Argument(help="HOST:PORT of a worker.")] = DEFAULT_ADDRESS,
    token: Token = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait.")] = 5.0,
    trace: Annotated[
        str | None,
        typer.Option(
            "--trace",
            metavar="JOB",
            help="Print the trace this worker kept of job JOB (it was the job's ingress).",
            show_default=False,
        ),
    ] = None,
    story: Annotated[
        str | None,
        typer.Option(
            "--story",
            metavar="JOB",
            help="Print what this worker's core and member table logged lately of JOB (a job "
            "id; a peer's name or a cause id work too): each event, its cause, what it decided.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print one worker's status, or with --trace a job's trace, or with --story its story."""
    tls = tls_config(tls_cert, tls_key, tls_ca)
    if story is not None and trace is not None:
        fail("--trace and --story each print a page of their own: give one of them", 2)
    try:
        if story is not None:
            told = worker_story(address, story, token=token, tls=tls, timeout=timeout)
        elif trace is not None:
            job_trace = kept_trace(address, trace, token=token, tls=tls, timeout=timeout)
        else:
            info = worker_status(address, token=token, tls=tls, timeout=timeout)
    except CompassError as exc:
        fail(f"{address}: {exc}", 2 if isinstance(exc, ConfigError) else 1)
    if story is not None:
        typer.echo(json.dumps(told, indent=2) if as_json else "\n".join(story_lines(told)))
        return
    if trace is not None:
        if as_json:
            typer.echo(json.dumps(job_trace.to_json(), indent=2))
        else:
            typer.echo("\n".join(trace_lines(job_trace)))
        return
    if as_json:
        typer.echo(json.dumps(info.to_json(), indent=2, sort_keys=True))
        return
    typer.echo("\n".join(status_lines(info.to_json())))


@commands.command()
def submit(
    target: Annotated[
        list[str],
        typer.Argument(
            metavar="[HOST:PORT] WORKFLOW",
            help=f"The workflow to run, at any worker (the ingress; default {DEFAULT_ADDRESS}).",
            show_default=False,
        ),
    ],
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            help="NAME=VALUE: VALUE as JSON if it parses, else a string. NAME=@FILE: a tensor "
            "from a file (.npy: a numpy array; .pt or .safetensors: a torch tensor, the "
            "file's only one or the one named NAME). NAME:DTYPE=VALUE: a JSON number or list "
            "as a torch tensor of DTYPE (float32, int64, ...; numpy.DTYPE: a numpy array).",
        ),
    ] = None,
    token: Token = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_ca: TlsCa = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the result.")] = 60.0,
    deadline_ms: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Answer within this many ms, or not at all: refused at once when no plan "
            "can (DeadlineUnreachable), dropped when it falls too late or its result comes "
            "late (DeadlineExceeded, exit status 1).",
        ),
    ] = None,
    priority: Annotated[
        int, typer.Option(min=0, max=9, help="0-9; a higher priority's tasks run first.")
    ] = 0,
    on_miss: Annotated[
        OnMiss,
        typer.Option(
            help="finish: run the job to the end even past its deadline, and print "
            "its result however late."
        ),
    ] = OnMiss.drop,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace", help="Trace the job and print its trace as a table after the result."
        ),
    ] = False,
    trace_json: Annotated[
        str | None,
        typer.Option(
            "--trace-json",
            metavar="PATH",
            help="Trace the job and write its trace here as JSON.",
            show_default=False,
        ),
    ] = None,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Print the partial outputs of the job's step-wise sinks as they are made (text "
            "as it comes, anything else a line each), then the result on a line of its own.",
        ),
    ] = False,
) -> None:
    """Run one job and print its result."""
    tls = tls_config(tls_cert, tls_key, tls_ca)

    if len(target) > 2:
        fail(f"expected [HOST:PORT] WORKFLOW, got {' '.join(target)!r}", 2)
    address, workflow = (DEFAULT_ADDRESS, target[0]) if len(target) == 1 else target
    kwargs: dict[str, Any] = {}
    for item in inputs or []:
        try:
            key, value = parse_input(item)
        except ConfigError as exc:
            fail(str(exc), 2)
        kwargs[key] = value

    traced = trace or trace_json is not None
    check_output(trace_json, "--trace-json")
    options = JobOptions(
        deadline_ms=deadline_ms,
        priority=priority,
        on_miss="finish" if on_miss is OnMiss.finish else "drop",
        trace=traced,
    )
    if stream:
        if traced:
            fail("--stream takes no --trace yet: trace the job without it", 2)
        streamed(address, workflow, kwargs, token=token, tls=tls, timeout=timeout,
                 options=options)  # fmt: skip
        return

    try:
        result = run_job(
            address, workflow, kwargs, token=token, tls=tls, timeout=timeout, options=options
        )
    except CompassError as exc:
        fail(f"{address}: {exc}", 2 if isinstance(exc, ConfigError) else 1)
    typer.echo(result_text(result.value))
    if not traced:
        return
    job_trace = result.trace
    if job_trace is None:
        fail(f"{address} answered job {result.job_id} without its trace (an older worker?)")
    if trace_json is not None:
        Path(trace_json).write_text(json.dumps(job_trace.to_json(), indent=2) + "\n")
    if trace:  # on stderr: stdout stays the result alone, for scripts
        typer.echo("\n".join(trace_lines(job_trace)), err=True)


def streamed(
    address: str,
    workflow: str,
    inputs: dict[str, Any],
    *,
    token: str | None,
    tls: TLSConfig | None,
    timeout: float,
    options: JobOptions,
) -> None:
    """``compass submit --stream``: each partial output as it comes, then the result."""
    open_line = [False]  # text written without its newline yet

    def show(out: Output) -> None:
        if out.final:
            if open_line[0]:
                typer.echo()
            return
        if isinstance(out.value, str):
            typer.echo(out.value, nl=False)
            sys.stdout.flush()
            open_line[0] = True
        else:
            typer.echo(("\n" if open_line[0] else "") + result_text(out.value))
            open_line[0] = False

    try:
        value = stream_job(address, workflow, inputs, show, token=token, tls=tls,
                           timeout=timeout, options=options)  # fmt: skip
    except (CompassError, TimeoutError) as exc:
        fail(
            f"{address}: {exc or 'no result within --timeout'}",
            2 if isinstance(exc, ConfigError) else 1,
        )
    typer.echo(result_text(value))


@commands.command("token")
def new_token() -> None:
    """Print a new random cluster token (256 bits, hex): `export COMPASS_TOKEN=$(compass token)`."""
    from compass.security import new_token as make_token

    typer.echo(make_token())
