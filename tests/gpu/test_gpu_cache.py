"""The model cache on a real GPU: eviction and slab reuse under the compute fence, concurrent
loads, every dtype, the default capacity, ``auto``, the worker's fetch path, pinned staging,
and ``close()`` giving the memory back.

Skipped cleanly (one line) without CuPy or a CUDA device that torch shares.
"""

from __future__ import annotations

import asyncio
import functools
import gc

import pytest
import torch
from torch import nn

from compass._bench.gpu import dtype_zoo
from compass._bench.leases import LeasingCache
from compass.cache import Model, ModelCache
from compass.cache.backend import CupyBackend, cuda_problem, make_backend, resolve_cache
from compass.cache.policy import LoadPlan
from compass.config import GPU_HEADROOM_BYTES, CacheConfig
from compass.errors import CompassError

pytestmark = pytest.mark.gpu

_problem = cuda_problem()
if _problem is not None:
    pytest.skip(f"no GPU for the cupy backend: {_problem}", allow_module_level=True)

MiB = 1 << 20


def linear(seed: int, width: int = 2048) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(width, width)  # 16 MiB of fp32 weights


def config(capacity_mib: int, slab_mib: int = 32) -> CacheConfig:
    return CacheConfig(capacity_bytes=capacity_mib * MiB, slab_bytes=slab_mib * MiB, backend="cupy")


def raw(tensor: torch.Tensor) -> bytes:
    return bytes(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def chain(module: nn.Module, x: torch.Tensor, depth: int) -> torch.Tensor:
    """``depth`` layers of ``module``, each normalized: long enough to keep the GPU busy."""
    out = x
    for _ in range(depth):
        out = nn.functional.normalize(module(out), dim=1)
    return out


@pytest.mark.asyncio
async def test_eviction_reuses_slabs_only_after_the_compute_fence():
    models = {"a": Model("a", lambda: linear(1)), "b": Model("b", lambda: linear(2))}
    x = torch.randn(8192, 2048)
    async with LeasingCache(models, config(32)) as cache:  # one slab: a and b take turns
        lease = await cache.ensure("a")
        module = lease.module
        assert module is not None
        first_address = next(module.parameters()).data_ptr()
        with cache.compute(None):
            out = chain(module, x.cuda(), 40)  # queued on this thread's compute stream
        # the scope's fence waited for those kernels; the release fences again and unpins, and
        # b's copy goes into the very slab a's kernels read: had they still run, out would mix
        # a's weights with b's
        lease.release()
        with await cache.ensure("b") as lease_b:
            assert lease_b.module is not None
            assert next(lease_b.module.parameters()).data_ptr() == first_address  # same slab
        assert cache.stats.evictions == 1
        result = out.cpu()
    with torch.inference_mode():
        expected = chain(linear(1), x, 40)
    torch.testing.assert_close(result, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.asyncio
async def test_concurrent_loads_land_intact():
    models = {f"m{i}": Model(f"m{i}", functools.partial(linear, i)) for i in range(4)}
    async with LeasingCache(models, config(256)) as cache:
        leases = await asyncio.gather(*(cache.ensure(name) for name in models))
        for lease, seed in zip(leases, range(4), strict=True):
            assert lease.module is not None
            weight = lease.module.get_parameter("weight")
            assert raw(weight) == raw(linear(seed).get_parameter("weight"))
            lease.release()
        assert cache.stats.loads == 4


build_zoo = dtype_zoo  # one tensor of each dtype and layout


@pytest.mark.asyncio
async def test_every_dtype_and_layout_byte_for_byte_on_the_gpu():
    async with LeasingCache({"zoo": Model("zoo", build_zoo)}, config(64, 4)) as cache:
        with await cache.ensure("zoo") as lease:
            assert lease.module is not None
            got = dict(lease.module.state_dict())
            start, end = cache.backend.address_range()
            for key, expected in build_zoo().state_dict().items():
                tensor = got[key]
                assert tensor.device.type == "cuda", key
                assert (tensor.dtype, tensor.shape, tensor.stride()) == (
                    expected.dtype, expected.shape, expected.stride(),
                ), key  # fmt: skip
                assert raw(tensor) == raw(expected), key
                storage = tensor.untyped_storage().data_ptr()
                at = storage + tensor.storage_offset() * tensor.element_size()
                assert start <= at <= end and at % 256 == 0, key


def test_default_capacity_leaves_headroom_and_auto_picks_cupy():
    resolved = resolve_cache(CacheConfig(backend="cupy"))
    free, _ = torch.cuda.mem_get_info(0)
    assert resolved.capacity_bytes is not None
    assert resolved.capacity_bytes <= free * 0.8
    assert resolved.capacity_bytes <= free - GPU_HEADROOM_BYTES
    auto = make_backend(CacheConfig(64 * MiB, 32 * MiB, "auto"))
    assert isinstance(auto, CupyBackend)
    assert auto.fallback is None
    assert auto.describe() == {"backend": "cupy", "device": "cuda:0"}
    auto.close()


@pytest.mark.asyncio
async def test_the_workers_fetch_path_and_pinned_staging():
    models = {"a": Model("a", lambda: linear(3))}
    async with ModelCache(models, config(64)) as cache:
        staged = cache._host["a"]
        assert staged.is_pinned()  # cudaHostAlloc memory, exactly the staging size
        assert staged.numel() == cache.core.layout("a").staging_bytes
        plan = cache.core.acquire("a")
        assert isinstance(plan, LoadPlan)
        cache.core.begin_load("a", plan)
        cache.core.pin("a")  # as the lanes do: the task that asked holds it
        done: asyncio.Future[float | CompassError] = asyncio.get_running_loop().create_future()
        cache.fetch("a", plan.evict, lambda name, result: done.set_result(result))
        seconds = await asyncio.wait_for(done, 60)
        assert isinstance(seconds, float) and seconds > 0  # CUDA event time of the copies
        cache.core.finish_load("a", seconds)
        module = cache.module("a")
        assert module is not None
        x = torch.randn(8, 2048)
        with cache.compute("a"):
            out = module(x.cuda()).cpu()
        cache.core.unpin("a")
        assert cache.backend.reads_in_flight() == {}
    with torch.inference_mode():
        torch.testing.assert_close(out, linear(3)(x), rtol=1e-4, atol=1e-4)


def test_close_gives_the_memory_back():
    torch.cuda.synchronize()
    gc.collect()
    free_before, _ = torch.cuda.mem_get_info(0)
    backend = CupyBackend(1024 * MiB, 64 * MiB)
    free_held, _ = torch.cuda.mem_get_info(0)
    assert free_before - free_held >= 1000 * MiB
    backend.close()
    del backend
    gc.collect()
    free_after, _ = torch.cuda.mem_get_info(0)
    assert free_after >= free_before - 64 * MiB
