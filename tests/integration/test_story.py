"""A job's story, read through the command line: ``compass status ADDRESS --story JOB`` prints
what a real worker's core logged about the job (each event, its cause id, what it decided), and
``--json`` the same as data; the worker that ran its second task tells its part, and the member
table's log tells a peer's story (it joined)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from compass.cluster import LocalCluster

from .conftest import compass_argv
from .test_traces import args, pair_workload


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_jobs_story_is_read_through_the_cli(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    spec = pair_workload(tmp_path)  # embed on w0 (the ingress), decode on w1 (round robin)
    async with LocalCluster(2, args=args(spec), env=worker_env) as cluster, cluster.client() as c:
        result = await c.submit_job("pair", data=np.zeros(1000, dtype=np.uint8), timeout=30)
        job = result.job_id
        peer_story = await c.story("w1")  # the member table's side, at w0
        env = {**worker_env, "COMPASS_TOKEN": cluster.token}

        def cli(*more: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(compass_argv("status", *more), env=env, capture_output=True,
                                  text=True, timeout=60, check=False)  # fmt: skip

        text = await asyncio.to_thread(cli, cluster.addresses[0], "--story", job)
        as_json = await asyncio.to_thread(cli, cluster.addresses[1], "--story", job, "--json")
        unknown = await asyncio.to_thread(cli, cluster.addresses[0], "--story", "no-such-job")

    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"story of {job} at worker w0:")
    assert lines[1] == "worker core:"
    # the ingress: the submit (its id, the client request's or the core's name for it) ran
    # embed here or loaded its model first; embed's end sent decode to w1; w1's result
    # answered the client
    # (its cause, the core's name for it, is not printed twice)
    assert lines[2].startswith(f"  +0.000000 s  submit:{job}#") and "(cause " not in lines[2]
    assert f"      -> send task {job}/decode to w1" in lines
    assert f"      -> answer {job}: ok" in lines
    assert lines.index(f"      -> send task {job}/decode to w1") < lines.index(
        f"      -> answer {job}: ok"
    )
    # w1, as data: every entry is about the job; it received decode, ran it, sent the result
    assert as_json.returncode == 0, as_json.stderr
    told = json.loads(as_json.stdout)
    assert (told["worker"], told["key"]) == ("w1", job)
    assert told["core"] and all(job in entry["about"] for entry in told["core"])
    first = told["core"][0]
    assert first["event"].startswith(f"received:{job}/decode<embed#")
    assert first["cause"] == first["event"]  # an anonymous event: its name is its cause
    did = [d for entry in told["core"] for d in entry["did"]]
    assert f"run {job}/decode on lane 0" in did
    assert f"send result {job}/decode to w0" in did
    times = [entry["now"] for entry in told["core"]]
    assert times == sorted(times)
    # a peer's story at w0: w1 joined it (its member table's log)
    joins = [e for e in peer_story["members"] if any(d.startswith("peer-up name=w1")
                                                     for d in e["did"])]  # fmt: skip
    assert joins and joins[0]["cause"].startswith("join-")
    # a key nobody logged: said so, no error
    assert unknown.returncode == 0, unknown.stderr
    assert "nothing logged" in unknown.stdout
