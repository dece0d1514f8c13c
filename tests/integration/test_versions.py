"""Apps and weights told apart (issue 39, item 3), on real worker processes: a worker of another
app is refused at join with a line naming what differs; workers whose weights differ serve side
by side during a rolling upgrade, each job on workers of its ingress's version alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from cli.format import status_lines
from compass import Client
from compass._bench.fuzz import RawPeer
from compass.cluster import LocalCluster
from compass.core.messages import JOB_INPUTS, TaskMsg
from compass.errors import CompassError
from compass.workflow.versions import version_id

from .conftest import app_environment

# three tasks in a chain, each multiplying by the model's one weight w: a job answers w**3 when
# all its tasks ran on one version, and a product of two versions' weights when it mixed them
REG_APP = """
import torch
from torch import nn

import compass

app = compass.App("reg")
app.model("reg", lambda: nn.Linear(1, 1, bias=False), weights="reg.safetensors")
chain = app.workflow("chain", inputs=["x"])


def times_w(model, value):
    return float(model(torch.tensor([[float(value)]]))[0, 0])


@chain.task(model="reg", expected_ms=1)
def one(model, x):
    return times_w(model, x)


@chain.task(model="reg", after=["one"], expected_ms=1)
def two(model, one):
    return times_w(model, one)


@chain.task(model="reg", after=["two"], expected_ms=1)
def three(model, two):
    return times_w(model, two)
"""

# the same app with the chain one task shorter: another app
SHORT_APP = REG_APP.split('@chain.task(model="reg", after=["two"]')[0]

OLD_W, NEW_W = 2.0, 3.0
ANSWERS = {OLD_W**3: "old", NEW_W**3: "new"}
# round_robin spreads a job's tasks over the workers it plans with: without versions kept
# apart, a job would mix them
ARGS = ["--policy", "round_robin", "--host-lanes", "0"]


def write_weights(folder: Path, w: float) -> None:
    save_file({"weight": torch.tensor([[w]])}, str(folder / "reg.safetensors"))


async def status_of(cluster: LocalCluster, index: int) -> Any:
    async with cluster.client(index) as client:
        return await client.status()


async def submit(cluster: LocalCluster, index: int, x: float = 1.0) -> Any:
    async with Client(cluster.workers[index].address, token=cluster.token) as client:
        return await client.submit("chain", x=x, timeout=30)


@pytest.mark.asyncio
async def test_a_worker_of_another_app_is_refused_at_join_and_the_cluster_serves_on(
    tmp_path: Path,
) -> None:
    env = app_environment(tmp_path, "reg_app", REG_APP)
    (tmp_path / "short_app.py").write_text(SHORT_APP)
    write_weights(tmp_path, OLD_W)
    async with LocalCluster(1, args=[*ARGS, "--app", "reg_app"], env=env) as cluster:
        seed = cluster.workers[0].address
        with pytest.raises(CompassError) as info:
            await cluster.spawn("w1", join=seed, extra=["--app", "short_app"])
        message = str(info.value)
        assert "serves another app" in message and "'chain' differs" in message, message
        assert not cluster.workers[1].running and cluster.workers[1].process.returncode != 0
        # the seed says whom it refused, and why, in its own log
        refused = [line for line in cluster.workers[0].log_path.read_text().splitlines()
                   if "refused a join" in line]  # fmt: skip
        assert len(refused) == 1 and "'chain' differs" in refused[0], refused
        status = await status_of(cluster, 0)
        assert status.peers == () and [row["name"] for row in status.cluster] == ["w0"]
        assert await submit(cluster, 0) == OLD_W**3  # the seed serves on


async def peers_settled(cluster: LocalCluster, limit_s: float = 30) -> list[Any]:
    """The workers' statuses once every worker has every other as a peer and has heard each
    one's state since (in its view, or kept apart by version), bounded in time."""
    names = {w.name for w in cluster.workers}
    give_up = time.monotonic() + limit_s
    while True:
        statuses = [await status_of(cluster, i) for i in range(len(cluster.workers))]
        if all(
            len(s.peers) == len(names) - 1
            and {row["name"] for row in s.cluster} | set(s.view["apart"]) == names
            for s in statuses
        ):
            return statuses
        assert time.monotonic() < give_up, [(s.name, s.peers, s.cluster, s.view) for s in statuses]
        await asyncio.sleep(0.1)


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_rolling_upgrade_of_weights_serves_both_versions_and_no_job_mixes_them(
    tmp_path: Path,
) -> None:
    env = app_environment(tmp_path, "reg_app", REG_APP)
    write_weights(tmp_path, OLD_W)
    # two workers are enough for both versions side by side, then one (each restart costs
    # seconds of a model load)
    async with LocalCluster(2, args=[*ARGS, "--app", "reg_app"], env=env) as cluster:
        names = [w.name for w in cluster.workers]
        old = (await status_of(cluster, 0)).view["version"]
        assert old and (await status_of(cluster, 1)).view["version"] == old
        answers: list[tuple[int, Any]] = []  # (ingress, answer) of every job of the stream
        upgrading = True

        async def stream() -> None:
            """Jobs to every worker in turn while the upgrade runs (bounded in count)."""
            for n in range(2000):
                if not upgrading:
                    return
                index = n % 2
                with contextlib.suppress(CompassError):  # restarting: not answered, not retried
                    answers.append((index, await submit(cluster, index)))

        jobs = asyncio.create_task(stream())
        write_weights(tmp_path, NEW_W)  # the checkpoint is replaced; workers restart in turn
        sides = dict.fromkeys(names, old)
        for index in range(2):
            await cluster.restart(index)
            new = (await status_of(cluster, index)).view["version"]
            assert new and new != old
            sides[names[index]] = new
            statuses = await peers_settled(cluster)
            # both versions serve side by side, each job on its ingress's version alone
            for i in range(2):
                for _ in range(3):
                    answer = await submit(cluster, i)
                    expected = NEW_W**3 if sides[names[i]] == new else OLD_W**3
                    assert answer == expected, (names[i], sides, answer)
            # compass status shows the versions: each worker's own, and those kept apart
            for s in statuses:
                mine = sides[s.name]
                apart = {n: v for n, v in sides.items() if v != mine}
                assert s.view["version"] == mine and s.view["apart"] == apart
                assert {row["version"] for row in s.cluster} == {mine}
                shown = ", ".join(f"{n} ({v})" for n, v in sorted(apart.items())) or "none"
                line = f"weights version {mine}; kept apart (another version): {shown}"
                assert line in status_lines(s.to_json())
        upgrading = False
        await jobs
        assert len(answers) > 10
        mixed = [(names[i], a) for i, a in answers if a not in ANSWERS]
        assert mixed == [], mixed
        # compass status shows the versions: one now, nobody kept apart
        status = await status_of(cluster, 1)
        assert status.view["version"] == new and status.view["apart"] == {}
        assert {row["version"] for row in status.cluster} == {new}


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_worker_restarted_with_other_weights_refuses_tasks_planned_on_its_old_version(
    tmp_path: Path,
) -> None:
    """A worker killed and restarted at once on its port with other weights: the jobs
    submitted at once are answered on one version each; and a task planned on its old
    version by a planner that has not heard the restart yet (in the cluster, the window
    between the restart and the planner's first word of it; here a peer connection that sends
    one such task) is refused, never run: task messages carry the version they were planned
    with. Without the check, the restarted worker runs it with its new weights."""
    env = app_environment(tmp_path, "reg_app", REG_APP)
    write_weights(tmp_path, OLD_W)
    async with LocalCluster(2, args=[*ARGS, "--app", "reg_app"], env=env) as cluster:
        old = (await status_of(cluster, 1)).view["version"]
        assert await submit(cluster, 0) == OLD_W**3
        write_weights(tmp_path, NEW_W)
        await cluster.restart(1, kill=True)
        # at once: jobs at both workers, each answered on its ingress's version alone
        answers = await asyncio.gather(*(submit(cluster, i % 2) for i in range(8)))
        assert answers == [OLD_W**3, NEW_W**3] * 4, answers
        restarted = await status_of(cluster, 1)
        assert restarted.view["version"] not in ("", old)
        # a root task of a job w0 planned on w1's old version, as a peer sends it
        job = "w0-stale0planner-1"
        plan = dict.fromkeys(("one", "two", "three"), "w1")
        stale = TaskMsg(job, 0, "chain", "one", JOB_INPUTS, {"x": 1.0}, plan, "w0",
                        version=version_id(old))  # fmt: skip
        with RawPeer(cluster.addresses[1], cluster.token, role="worker", name="planner") as peer:
            peer.handshake()
            peer.notify("task", stale.to_wire())
            async with cluster.client(1) as client:
                for _ in range(100):  # the story of the job at w1 once it handled the task
                    told = await client.story(job)
                    if told["core"]:
                        break
                    await asyncio.sleep(0.05)
        did = [d for entry in told["core"] for d in entry["did"]]
        assert did == [f"send failed {job}/one to w0"], did  # refused to w0, not run
        assert await submit(cluster, 1) == NEW_W**3  # and it serves on
