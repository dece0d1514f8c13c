"""CupyBackend on a real GPU: the arena, a real model through the cache, load bandwidth.

Skipped cleanly without CuPy or a CUDA device. The bandwidth comparison is printed (run with
``-s``), never asserted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from compass._bench.leases import LeasingCache
from compass.cache import Model
from compass.cache.backend import CupyBackend, cuda_available, cuda_problem
from compass.config import CacheConfig

pytestmark = pytest.mark.gpu

if not cuda_available():
    pytest.skip(f"no GPU for the cupy backend: {cuda_problem()}", allow_module_level=True)

MiB = 1 << 20


def build_net() -> nn.Module:
    # 1024 x 4096 float32 = 16 MiB: larger than a 4 MiB slab, so a 4-slab run
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 256), nn.LayerNorm(256))


def build_wide() -> nn.Module:
    # four 4096 x 4096 float32 layers: 256 MiB of weights to time a load
    return nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(4)))


def test_cupy_arena_is_one_device_allocation_shared_with_torch():
    backend = CupyBackend(64 * MiB, 4 * MiB)
    arena = backend.arena()
    assert arena.device.type == "cuda"
    assert arena.numel() == 64 * MiB
    assert arena.data_ptr() == backend.array.data.ptr  # DLPack: the same memory, no copy
    source = torch.randn(256, 256)
    offset = 8 * MiB
    backend.copy_in([(offset, source)]).wait()
    view = backend.tensor_view(offset, torch.float32, (256, 256), source.nbytes)
    assert view.device.type == "cuda"
    assert torch.equal(view.cpu(), source)
    start, end = backend.address_range()
    assert start <= view.data_ptr()
    assert view.data_ptr() + view.nbytes <= end
    backend.close()


@pytest.mark.asyncio
async def test_real_model_on_the_gpu_matches_the_direct_module(tmp_path: Path):
    torch.manual_seed(3)
    reference = build_net()
    save_file(reference.state_dict(), str(tmp_path / "net.safetensors"))
    direct = build_net()
    direct.load_state_dict(load_file(str(tmp_path / "net.safetensors")))
    direct = direct.eval().cuda()
    models = {"net": Model("net", build_net, tmp_path / "net.safetensors")}
    config = CacheConfig(capacity_bytes=128 * MiB, slab_bytes=4 * MiB, backend="cupy")
    x = torch.randn(32, 1024, device="cuda")
    async with LeasingCache(models, config) as cache:
        assert isinstance(cache.backend, CupyBackend)
        with await cache.ensure("net") as lease:
            module = lease.module
            assert module is not None
            start, end = cache.backend.address_range()
            for tensor in [*module.parameters(), *module.buffers()]:
                assert tensor.device.type == "cuda"
                assert start <= tensor.data_ptr()
                assert tensor.data_ptr() + tensor.nbytes <= end
            with torch.no_grad():
                torch.testing.assert_close(module(x), direct(x), rtol=1e-5, atol=1e-6)


@pytest.mark.asyncio
async def test_load_bandwidth_against_a_raw_pinned_copy():
    model = Model("wide", build_wide)
    config = CacheConfig(capacity_bytes=512 * MiB, slab_bytes=64 * MiB, backend="cupy")
    async with LeasingCache({"wide": model}, config) as cache:  # stages pinned host weights
        with await cache.ensure("wide"):
            pass
        stats = cache.stats
    assert stats.bytes_loaded == model.size_bytes
    cache_gbps = stats.h2d_bandwidth / 1e9

    host = torch.empty(model.size_bytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(model.size_bytes, dtype=torch.uint8, device="cuda")
    device.copy_(host, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    raw_gbps = model.size_bytes / best / 1e9
    print(
        f"\ncache load of {model.size_bytes / MiB:.0f} MiB: {cache_gbps:.2f} GB/s; "
        f"raw pinned host-to-device copy of the same bytes: {raw_gbps:.2f} GB/s "
        f"({cache_gbps / raw_gbps:.0%} of raw)"
    )
    assert stats.load_seconds > 0
