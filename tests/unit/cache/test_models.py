"""ModelCache, driven by LeasingCache: real torch modules in the host arena, waits, sharing,
prefetch, emulation."""

from __future__ import annotations

import asyncio
import json
import resource
from pathlib import Path

import msgpack
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from compass._bench.leases import LeasingCache
from compass.cache import Model
from compass.cache.backend import HostBackend
from compass.config import CacheConfig
from compass.errors import CacheError, ConfigError, ModelTooLarge

KiB = 1024
SLAB = 4 * KiB
REPO = Path(__file__).resolve().parents[3]


def build_mlp() -> nn.Module:
    # 32x64 float32 weight = 8 KiB: larger than a slab, so it needs a 2-slab run
    return nn.Sequential(
        nn.Linear(32, 64),
        nn.ReLU(),
        nn.Linear(64, 16),
        nn.BatchNorm1d(16),
        nn.Linear(16, 4),
    )


def seeded_mlp() -> nn.Module:
    torch.manual_seed(1234)
    return build_mlp()


def save_weights(path: Path, seed: int) -> nn.Module:
    """A trained-looking MLP (random weights, non-trivial batch-norm state) saved to ``path``."""
    torch.manual_seed(seed)
    module = build_mlp()
    bn = module.get_submodule("3")
    assert isinstance(bn, nn.BatchNorm1d)
    bn.running_mean = torch.randn(16)
    bn.running_var = torch.rand(16) + 0.5
    save_file(module.state_dict(), str(path))
    return module


def direct(path: Path) -> nn.Module:
    module = build_mlp()
    module.load_state_dict(load_file(str(path)))
    return module.eval()


def host_config(capacity: int) -> CacheConfig:
    return CacheConfig(capacity_bytes=capacity, slab_bytes=SLAB, backend="host")


def mlp_footprint(tmp_path: Path) -> int:
    return Model("probe", build_mlp).layout(SLAB).footprint_bytes


@pytest.fixture
def two_mlps(tmp_path: Path) -> dict[str, Model]:
    save_weights(tmp_path / "a.safetensors", seed=1)
    save_weights(tmp_path / "b.safetensors", seed=2)
    return {
        "a": Model("a", build_mlp, tmp_path / "a.safetensors"),
        "b": Model("b", build_mlp, tmp_path / "b.safetensors"),
    }


def in_arena(module: nn.Module, cache: LeasingCache) -> bool:
    start, end = cache.backend.address_range()
    tensors = [*module.parameters(), *module.buffers()]
    return all(start <= t.data_ptr() and t.data_ptr() + t.nbytes <= end for t in tensors)


@pytest.mark.asyncio
async def test_real_module_through_the_cache_equals_the_direct_module(tmp_path, two_mlps):
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    async with LeasingCache(two_mlps, host_config(64 * KiB)) as cache:
        assert isinstance(cache.backend, HostBackend)
        lease = await cache.ensure("a")
        assert not lease.hit
        module = lease.module
        assert module is not None
        with torch.no_grad():
            assert torch.equal(module(x), direct(tmp_path / "a.safetensors")(x))
        assert in_arena(module, cache), "parameters must be views into the slab arena"
        assert not module.training
        lease.release()
        again = await cache.ensure("a")
        assert again.hit
        again.release()
        stats = cache.stats
        assert (stats.hits, stats.misses, stats.loads) == (1, 1, 1)
        assert stats.bytes_loaded == two_mlps["a"].size_bytes
        assert stats.h2d_bandwidth > 0


@pytest.mark.asyncio
async def test_size_is_measured_from_parameters_and_buffers():
    model = Model("m", build_mlp)
    module = build_mlp()
    tensors = [*module.parameters(), *module.buffers()]
    assert model.size_bytes == sum(t.numel() * t.element_size() for t in tensors)
    assert model.layout(SLAB).longest_run == 2


@pytest.mark.asyncio
async def test_builder_initialization_is_the_weights_when_no_file_is_given():
    x = torch.randn(3, 32)
    async with LeasingCache({"s": Model("s", seeded_mlp)}, host_config(64 * KiB)) as cache:
        with await cache.ensure("s") as lease:
            module = lease.module
            assert module is not None
            with torch.no_grad():
                assert torch.equal(module(x), seeded_mlp().eval()(x))


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight


@pytest.mark.asyncio
async def test_tied_weights_stay_tied_and_count_once():
    model = Model("tied", Tied)
    assert model.size_bytes == 10 * 8 * 4
    async with LeasingCache({"tied": model}, host_config(16 * KiB)) as cache:
        with await cache.ensure("tied") as lease:
            module = lease.module
            assert isinstance(module, Tied)
            assert module.head.weight is module.embed.weight
            assert in_arena(module, cache)


@pytest.mark.asyncio
async def test_eviction_frees_the_slabs_for_the_next_model(tmp_path, two_mlps):
    footprint = mlp_footprint(tmp_path)
    x = torch.randn(2, 32)
    # room for one MLP only
    async with LeasingCache(two_mlps, host_config(footprint + SLAB)) as cache:
        lease_a = await cache.ensure("a")
        assert cache.free_bytes() == cache.capacity_bytes() - footprint
        module_a = lease_a.module
        assert module_a is not None
        a_ptrs = {p.data_ptr() for p in module_a.parameters()}
        lease_a.release()
        with pytest.raises(CacheError, match="released"):
            _ = lease_a.module
        lease_b = await cache.ensure("b", upcoming=["a"])
        assert cache.resident() == {"b"}
        assert cache.stats.evictions == 1
        assert cache.free_bytes() == cache.capacity_bytes() - footprint
        module_b = lease_b.module
        assert module_b is not None
        # b really reuses the memory a gave back
        assert a_ptrs & {p.data_ptr() for p in module_b.parameters()}
        with torch.no_grad():
            assert torch.equal(module_b(x), direct(tmp_path / "b.safetensors")(x))
        lease_b.release()
        cache.core.evict("b")
        assert cache.free_bytes() == cache.capacity_bytes()


@pytest.mark.asyncio
async def test_load_that_needs_pinned_slabs_waits_until_unpin(tmp_path, two_mlps):
    footprint = mlp_footprint(tmp_path)
    x = torch.randn(4, 32)
    expected_a = direct(tmp_path / "a.safetensors")(x).detach()
    async with LeasingCache(two_mlps, host_config(footprint + SLAB)) as cache:
        lease_a = await cache.ensure("a")
        waiter = asyncio.create_task(cache.ensure("b"))
        for _ in range(20):  # give the waiter every chance to (wrongly) proceed
            await asyncio.sleep(0)
        assert not waiter.done()
        assert cache.stats.waits == 1
        assert cache.resident() == {"a"}
        assert cache.loading() == frozenset()
        module_a = lease_a.module
        assert module_a is not None
        with torch.no_grad():
            assert torch.equal(module_a(x), expected_a), "a was corrupted while pinned"
        lease_a.release()
        lease_b = await asyncio.wait_for(waiter, timeout=30)
        assert cache.resident() == {"b"}
        module_b = lease_b.module
        assert module_b is not None
        with torch.no_grad():
            assert torch.equal(module_b(x), direct(tmp_path / "b.safetensors")(x))
        lease_b.release()
        cache.core.validate()


@pytest.mark.asyncio
async def test_concurrent_requests_share_one_load_and_count_pins(two_mlps):
    async with LeasingCache(two_mlps, host_config(64 * KiB)) as cache:
        first, second = await asyncio.gather(cache.ensure("a"), cache.ensure("a"))
        assert cache.stats.loads == 1
        assert first.module is second.module
        assert cache.core.pins("a") == 2
        first.release()
        first.release()  # idempotent
        assert cache.core.pins("a") == 1
        second.release()
        assert cache.core.pins("a") == 0


@pytest.mark.asyncio
async def test_model_larger_than_the_cache_fails_clearly(two_mlps):
    async with LeasingCache(two_mlps, host_config(2 * SLAB)) as cache:
        with pytest.raises(ModelTooLarge, match=r"'a'.*8192 B"):
            await cache.ensure("a")
        assert cache.free_bytes() == cache.capacity_bytes()
        cache.core.validate()


@pytest.mark.asyncio
async def test_bad_weights_fail_the_load_and_leave_the_cache_clean(tmp_path):
    save_file({"nonsense": torch.zeros(3)}, str(tmp_path / "bad.safetensors"))
    models = {"bad": Model("bad", build_mlp, tmp_path / "bad.safetensors")}
    cache = LeasingCache(models, host_config(64 * KiB))
    with pytest.raises(CacheError, match="do not fit model 'bad'"):
        await cache.ensure("bad")
    assert cache.resident() == frozenset()
    assert cache.loading() == frozenset()
    assert cache.free_bytes() == cache.capacity_bytes()
    assert cache.core.pins("bad") == 0
    assert cache.stats.aborted_loads == 1
    cache.core.validate()
    await cache.aclose()


@pytest.mark.asyncio
async def test_prefetch_loads_in_the_background_and_is_shared(two_mlps):
    async with LeasingCache(two_mlps, host_config(64 * KiB)) as cache:
        cache.prefetch(["a", "b"])
        assert cache.loading() == {"a"}
        cache.prefetch(["a", "b"])  # at most one prefetch at a time
        assert cache.loading() == {"a"}
        with await cache.ensure("a") as lease:
            assert lease.module is not None
        stats = cache.stats
        assert (stats.loads, stats.prefetches) == (1, 1)


@pytest.mark.asyncio
async def test_prefetch_never_evicts_a_model_needed_sooner():
    size = 10 * SLAB
    models = {name: Model.emulated(name, size) for name in "abc"}
    config = CacheConfig(capacity_bytes=2 * size, slab_bytes=SLAB, backend="capacity")
    async with LeasingCache(models, config) as cache:
        for name in "ab":
            (await cache.ensure(name)).release()
        # the queue needs a, then b, then c: making room for c would evict a model needed sooner
        cache.prefetch(["a", "b", "c"])
        assert cache.loading() == frozenset()
        # with b no longer queued, b may make room for c
        cache.prefetch(["a", "c"])
        assert cache.loading() == {"c"}
        with await cache.ensure("c") as lease:
            assert not lease.hit
        assert cache.resident() == {"a", "c"}


@pytest.mark.asyncio
async def test_emulated_paper_workload_takes_no_memory():
    spec = json.loads((REPO / "bench" / "workloads" / "paper.json").read_text())
    models = {
        name: Model.emulated(name, int(entry["size_mb"] * 10**6))
        for name, entry in spec["models"].items()
    }
    config = CacheConfig(capacity_bytes=14 * 10**9, slab_bytes=64 * 2**20, backend="capacity")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    caches = [
        LeasingCache(models, config, emulated_h2d_bytes_per_s=9.7e9, time_scale=1e-6)
        for _ in range(5)
    ]
    for cache in caches:
        for name in ("opt", "depth", "txt2speech", "mt5", "nli", "vit", "opt"):
            with await cache.ensure(name):
                pass
        assert sum(cache.size_bytes(m) for m in cache.resident()) <= 14 * 10**9
        assert cache.stats.evictions > 0
        assert cache.stats.h2d_bandwidth == pytest.approx(9.7e9)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert (rss_after - rss_before) * 1024 < 200 * 2**20, "five emulated 14 GB caches held bytes"
    for cache in caches:
        await cache.aclose()


@pytest.mark.asyncio
async def test_aclose_finishes_loads_and_wakes_waiters():
    size = 10 * SLAB
    models = {name: Model.emulated(name, size) for name in "ab"}
    config = CacheConfig(capacity_bytes=size, slab_bytes=SLAB, backend="capacity")
    cache = LeasingCache(models, config, emulated_h2d_bytes_per_s=size / 0.01)
    lease = await cache.ensure("a")
    waiter = asyncio.create_task(cache.ensure("b"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done()
    await cache.aclose()
    with pytest.raises(CacheError, match="closed"):
        await waiter
    with pytest.raises(CacheError, match="closed"):
        await cache.ensure("a")
    lease.release()  # still safe after close
    cache.prefetch(["b"])  # ignored once closed
    assert cache.loading() == frozenset()


@pytest.mark.asyncio
async def test_cancelled_waiter_leaves_no_pin(two_mlps):
    async with LeasingCache(two_mlps, host_config(64 * KiB)) as cache:
        task = asyncio.create_task(cache.ensure("a"))
        await asyncio.sleep(0)  # the load has begun and the waiter pinned it
        assert cache.loading() == {"a"}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cache.core.pins("a") == 0
        with await cache.ensure("a") as lease:  # the shared load went on
            assert lease.module is not None
        assert cache.stats.loads == 1


@pytest.mark.asyncio
async def test_snapshot_is_msgpack_able(two_mlps):
    async with LeasingCache(two_mlps, host_config(64 * KiB)) as cache:
        lease = await cache.ensure("a")
        snap = cache.snapshot()
        assert snap["resident"] == ["a"]
        assert snap["pinned"] == {"a": 1}
        assert snap["capacity_bytes"] == 64 * KiB
        assert msgpack.unpackb(msgpack.packb(snap)) == snap
        lease.release()


def test_model_declarations_are_checked():
    with pytest.raises(ConfigError, match="size_bytes"):
        Model("x")
    with pytest.raises(ConfigError, match="measured"):
        Model("x", build_mlp, size_bytes=10)
    with pytest.raises(ConfigError, match="no builder"):
        Model("x", None, "w.safetensors", size_bytes=10)
    with pytest.raises(ConfigError, match="named"):
        LeasingCache({"y": Model.emulated("x", 1)}, host_config(64 * KiB))
    assert Model.emulated("e", 123).size_bytes == 123
