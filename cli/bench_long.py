"""``compass bench restarts`` and ``compass bench soak``: the long runs on a local cluster
(faults, and a steady stream for minutes to hours), registered on the same ``bench`` group."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .bench import bench_app
from .checks import check_output, check_plot, fail
from .options import JsonPath, Workers


@bench_app.command("restarts")
def bench_restarts(
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            help="same_name, crash_loop, seed_restart, drain or rolling (repeatable; all five "
            "by default), or campaign (alone: random faults for --duration-s)."
        ),
    ] = None,
    worker_pythonpath: Annotated[
        str | None, typer.Option(help="Run the workers from this checkout (a before/after).")
    ] = None,
    duration_s: Annotated[
        float, typer.Option(min=1.0, help="campaign: how long faults are applied, in seconds.")
    ] = 600.0,
    workers: Annotated[int, typer.Option(min=2, help="campaign: worker processes.")] = 5,
    seed: Annotated[
        int, typer.Option(help="campaign: seeds the faults, their targets and gaps.")
    ] = 0,
    netns: Annotated[
        str,
        typer.Option(
            help="campaign: auto, on or off: each worker in a network namespace of its own, "
            "for cut links (root and `ip netns`; auto: where they can be made)."
        ),
    ] = "auto",
    log_dir: Annotated[
        str | None, typer.Option(help="Keep the workers' logs here (campaign: a temp folder).")
    ] = None,
    json_path: JsonPath = None,
) -> None:
    """Restarts, crashes, drains and a rolling restart on a local cluster: jobs ok, hung,
    failed or run twice, and the time until every view is whole again; or a campaign of random
    faults (kill, pause, graceful restart, cut link) under a stream of jobs."""
    from compass._bench import restarts

    names = scenario or list(restarts.SCENARIOS)
    unknown = [n for n in names if n not in restarts.SCENARIOS and n != "campaign"]
    if unknown:
        choices = ", ".join([*restarts.SCENARIOS, "campaign"])
        fail(f"--scenario {unknown[0]!r}: expected one of {choices}", 2)
    if "campaign" in names and len(names) > 1:
        fail("--scenario campaign runs alone", 2)
    if netns not in ("auto", "on", "off"):
        fail(f"--netns {netns!r}: expected auto, on or off", 2)
    check_output(json_path, "--json")
    if names == ["campaign"]:
        from compass._bench import campaign

        settings = campaign.Settings(
            duration_s=duration_s, workers=workers, seed=seed, netns=netns,
            env=restarts.worker_env(worker_pythonpath), log_dir=Path(log_dir) if log_dir else None,
        )  # fmt: skip
        campaign.run(settings, json_path=json_path)
        return
    restarts.run(names, worker_pythonpath=worker_pythonpath, json_path=json_path, log_dir=log_dir)


@bench_app.command("soak")
def bench_soak(
    workers: Workers = 3,
    jobs: Annotated[
        int | None,
        typer.Option(min=1, help="Stop after this many jobs (with --duration-s: the first)."),
    ] = None,
    duration_s: Annotated[
        float | None,
        typer.Option(
            "--duration-s",
            help="Stop after this many seconds (default: 600 unless --jobs is given).",
            show_default=False,
        ),
    ] = None,
    in_flight: Annotated[int, typer.Option(min=1, help="Jobs out at once, at most.")] = 16,
    rate: Annotated[
        float, typer.Option(min=0.0, help="Jobs offered per second (0: as fast as allowed).")
    ] = 10.0,
    big_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="The share of jobs with a 1 MiB input.")
    ] = 0.25,
    deadline_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="The share of jobs with a deadline.")
    ] = 0.2,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart/--no-restart", help="Drain and restart the last worker a third of the way."
        ),
    ] = True,
    seed: Annotated[int, typer.Option(help="Seed of the job mix.")] = 0,
    time_scale: Annotated[
        float, typer.Option(help="Real seconds per spec second of the paper's workload.")
    ] = 0.02,
    sample_s: Annotated[
        float, typer.Option("--sample-s", help="Seconds between two reads of each worker.")
    ] = 2.0,
    job_timeout_s: Annotated[
        float,
        typer.Option(
            "--job-timeout-s",
            help="A job with no answer by then is hung (past the cluster's pace at --in-flight: "
            "a job waits about in-flight / jobs per second).",
        ),
    ] = 30.0,
    worker_pythonpath: Annotated[
        str | None, typer.Option(help="Run the workers from this checkout (a before/after).")
    ] = None,
    log_dir: Annotated[
        str | None, typer.Option(help="Keep the workers' logs in this folder.")
    ] = None,
    json_path: JsonPath = None,
    plot: Annotated[
        str | None, typer.Option(help="Draw each worker's RSS over time here (PNG).")
    ] = None,
) -> None:
    """A local cluster under a steady stream of jobs (small and 1 MiB inputs, some with
    deadlines), one worker drained and restarted on the way: every job answered once, none
    hung, none run twice, no false deaths, and each worker's RSS and tables flat."""
    from compass._bench import soak

    if duration_s is not None and not 0 < duration_s < float("inf"):
        fail(f"--duration-s must be a number of seconds > 0, got {duration_s:g}", 2)
    if not 0 < sample_s < float("inf"):
        fail(f"--sample-s must be a number of seconds > 0, got {sample_s:g}", 2)
    if restart and workers < 2:
        fail("--workers 1 with a restart: nobody would take the jobs while it is away "
             "(give --workers 2 or more, or --no-restart)", 2)  # fmt: skip
    check_output(json_path, "--json")
    check_plot(plot)
    config = soak.SoakConfig(
        workers=workers,
        jobs=jobs,
        duration_s=duration_s,
        in_flight=in_flight,
        rate=rate,
        big_share=big_share,
        deadline_share=deadline_share,
        restart=restart,
        time_scale=time_scale,
        sample_s=sample_s,
        job_timeout_s=job_timeout_s,
        seed=seed,
    )
    soak.run(
        config,
        worker_pythonpath=worker_pythonpath,
        json_path=json_path,
        plot_path=plot,
        log_dir=log_dir,
    )
