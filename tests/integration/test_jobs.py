"""Jobs through real worker processes: real torch models, emulated workloads, error paths."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from compass.cluster import LocalCluster
from compass.errors import CompassTimeout, InvalidInputs, JobFailed, Overloaded, UnknownWorkflow
from examples import vision_app

from .conftest import PAPER, one_worker_workload, status_when

DATA = np.zeros(8, dtype=np.uint8)


@pytest.mark.asyncio
async def test_real_models_match_running_them_directly(vision_worker: LocalCluster) -> None:
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    expected = vision_app.reference(images)
    async with vision_worker.client() as client:
        got = await client.submit("describe", image=images)
        assert set(got) == set(expected)
        for key, value in expected.items():
            assert isinstance(got[key], torch.Tensor)
            assert torch.equal(got[key], value), key
        status = await client.status()
        assert set(status.cache["resident"]) == {"encoder", "classifier"}


@pytest.mark.asyncio
async def test_errors_fail_the_job_and_the_worker_keeps_serving(
    vision_worker: LocalCluster,
) -> None:
    async with vision_worker.client() as client:
        with pytest.raises(JobFailed) as failed:
            await client.submit("fails", x=41)
        assert failed.value.task == "explode"
        assert failed.value.workflow == "fails"
        assert "ValueError: cannot handle 41" in (failed.value.remote_traceback or "")
        with pytest.raises(UnknownWorkflow, match="nope"):
            await client.submit("nope", x=1)
        with pytest.raises(InvalidInputs, match="image"):
            await client.submit("describe", picture=1)
        assert await client.submit("echo", x="still here") == "still here"


@pytest.mark.asyncio
async def test_a_job_s_id_comes_with_its_result_and_its_error_and_is_in_the_log(
    vision_worker: LocalCluster,
) -> None:
    cluster = vision_worker
    async with cluster.client() as client:
        answer = await client.submit_job("echo", x=7)
        assert answer.value == 7 and answer.job_id.startswith("w0-")
        again = await client.submit_job("echo", x=8)
        assert again.job_id != answer.job_id
        with pytest.raises(JobFailed) as failed:
            await client.submit("fails", x=41)
        job_id = failed.value.job_id
        assert job_id is not None and job_id.startswith("w0-")
        # the worker logged the failure at the default level, with the id the client was given
        log = cluster.log_dir / "w0.log"
        for _ in range(200):
            lines = [line for line in log.read_text().splitlines() if job_id in line]
            if any("WARNING" in line and "failed" in line for line in lines):
                break
            await asyncio.sleep(0.02)
        assert any("WARNING" in line and "failed" in line for line in lines), lines


@pytest.mark.asyncio
async def test_many_concurrent_jobs(vision_worker: LocalCluster) -> None:
    async with vision_worker.client() as client:
        results = await client.submit_many("echo", ({"x": i} for i in range(200)), concurrency=50)
        assert results == list(range(200))


@pytest.mark.asyncio
async def test_emulated_paper_workload_with_eviction(worker_env: dict[str, str]) -> None:
    # 8 GB of cache for 20.8 GB of models: every workflow mix forces evictions
    args = ["--workload", PAPER, "--time-scale", "0.02", "--cache-mb", "8000"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        payload = np.zeros(3000 * 1000, dtype=np.uint8)
        names = ["translation", "question_answer", "img_to_sound", "object_detection"] * 3
        results = await asyncio.gather(*(client.submit(n, data=payload) for n in names))
        assert len(results) == len(names)
        status = await client.status()
        cache = status.cache
        assert status.stats["jobs_completed"] == len(names)
        assert cache["stats"]["evictions"] > 0
        assert cache["capacity_bytes"] <= 8000 * (1 << 20)
        resident = sum(
            {
                "opt": 5720,
                "marian": 800,
                "mt5": 2000,
                "nli": 2140,
                "vit": 1700,
                "txt2speech": 2700,
                "detr": 1800,
                "depth": 3900,
            }[m]
            * 10**6
            for m in cache["resident"]
        )
        assert resident <= cache["capacity_bytes"]


@pytest.mark.asyncio
@pytest.mark.parametrize("host_lanes", [0, 1])
async def test_host_lanes_let_model_less_tasks_pass_a_busy_gpu(
    host_lanes: int, worker_env: dict[str, str], tmp_path
) -> None:
    spec = one_worker_workload(tmp_path, gpu=("m", 1500), cpu=(None, 1))
    args = ["--workload", spec, "--host-lanes", str(host_lanes)]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        order: list[str] = []

        async def run(workflow: str) -> None:
            await client.submit(workflow, data=DATA, timeout=30)
            order.append(workflow)

        gpu = asyncio.create_task(run("gpu"))
        await status_when(client, lambda s: s.queue["running"] == 1)  # it holds the lane
        await asyncio.gather(gpu, run("cpu"))
        status = await client.status()
    # on the GPU lane the model-less task waits for the 1.5 s task; on a host lane it passes
    assert order == (["cpu", "gpu"] if host_lanes else ["gpu", "cpu"])
    assert status.queue["host_lanes"] == host_lanes


@pytest.mark.asyncio
async def test_a_job_whose_caller_gave_up_is_dropped_not_run(
    worker_env: dict[str, str], tmp_path
) -> None:
    # no drain at the end: the first job's 30 s task would hold the worker's exit
    args = ["--workload", one_worker_workload(tmp_path, slow=("m", 30000)), "--drain-timeout", "0"]
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        first = asyncio.create_task(client.submit("slow", data=DATA, timeout=None))
        await status_when(client, lambda s: s.queue["running"] == 1)
        with pytest.raises(CompassTimeout):  # queued behind it; the caller stops waiting
            await client.submit("slow", data=DATA, timeout=0.3)
        status = await status_when(client, lambda s: s.jobs_in_flight == 1)
        # the abandoned job is gone from the ingress and its queued task from the queue;
        # the first job is untouched
        assert status.jobs_in_flight == 1
        assert status.queue["ready"] == 0
        assert status.queue["running"] == 1
        first.cancel()


@pytest.mark.asyncio
async def test_an_ingress_at_its_job_limit_refuses_more_clearly_and_keeps_serving(
    worker_env: dict[str, str], tmp_path
) -> None:
    spec = one_worker_workload(tmp_path, slow=("m", 30000), quick=(None, 1))
    args = ["--workload", spec, "--max-jobs", "2", "--drain-timeout", "0"]  # as above
    async with LocalCluster(1, args=args, env=worker_env) as cluster, cluster.client() as client:
        held = [asyncio.create_task(client.submit("slow", data=DATA, timeout=None)) for _ in "ab"]
        await status_when(client, lambda s: s.jobs_in_flight == 2)
        with pytest.raises(Overloaded, match="2 jobs in flight") as refused:
            await client.submit("quick", data=DATA)
        detail = refused.value.detail
        assert (detail["jobs_in_flight"], detail["max_jobs"]) == (2, 2)
        assert detail["held_bytes"] == 2 * (DATA.nbytes + 8)  # two jobs: an array + its name
        status = await client.status()
        assert status.stats["jobs_refused"] == 1
        for task in held:  # the caller gives up on them: the ingress drops them
            task.cancel()
        await status_when(client, lambda s: s.jobs_in_flight == 0)
        assert await client.submit("quick", data=DATA) is not None  # room again


@pytest.mark.asyncio
async def test_a_job_key_runs_once_however_often_it_is_submitted(
    worker_env: dict[str, str], tmp_path
) -> None:
    spec = one_worker_workload(tmp_path, slow=(None, 300))
    async with (
        LocalCluster(1, args=["--workload", spec], env=worker_env) as cluster,
        cluster.client() as first,
        cluster.client() as second,
    ):
        await first.ping()  # connected: their channels exist
        await second.ping()
        body = {"workflow": "slow", "inputs": {"data": DATA}, "key": "job-7"}
        # raw submissions on the clients' private connections: the test chooses the key
        raw_first, raw_second = first._connected(), second._connected()
        # two clients with one key at once: one job, both answered with its output
        answers = await asyncio.gather(
            raw_first.request("submit", body), raw_second.request("submit", body)
        )
        assert answers[0] is not None and np.array_equal(answers[0], answers[1])
        # and once it is answered, the key gets the kept answer without running again
        again = await raw_first.request("submit", body)
        assert np.array_equal(again, answers[0])
        status = await first.status()
        assert status.stats["tasks_run"] == 1
        assert status.stats["jobs_submitted"] == 1
        # another key is another job
        await raw_first.request("submit", {**body, "key": "job-8"})
        assert (await first.status()).stats["tasks_run"] == 2
