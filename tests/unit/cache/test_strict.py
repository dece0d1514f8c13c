"""The strict CPU stand-in for the GPU backend: alignment, copies visible only after a sync,
and slabs with readers in flight until a compute fence."""

from __future__ import annotations

import pytest
import torch

from compass.cache.backend import (
    POISON,
    HostBackend,
    StrictBackend,
    aligned_host_bytes,
    make_backend,
)
from compass.config import CacheConfig
from compass.errors import CacheError, ConfigError

KiB = 1024


def staged(values: torch.Tensor) -> torch.Tensor:
    """``values``'s bytes in an aligned host buffer, as a staging buffer would hold them."""
    buffer = torch.from_numpy(aligned_host_bytes(values.nbytes))
    buffer.view(values.dtype).copy_(values.reshape(-1))
    return buffer


@pytest.mark.parametrize("nbytes", [1, 255, 4 * KiB, 3 * 2**20 + 17])
def test_host_buffers_and_arenas_are_256_aligned(nbytes):
    assert aligned_host_bytes(nbytes).ctypes.data % 256 == 0
    assert len(aligned_host_bytes(nbytes)) == nbytes
    host = HostBackend(max(nbytes, 4 * KiB) // (4 * KiB) * 4 * KiB + 4 * KiB, 4 * KiB)
    assert host.address_range()[0] % 256 == 0


def test_strict_backend_is_chosen_by_name():
    backend = make_backend(CacheConfig(64 * KiB, 4 * KiB, "strict"))
    assert isinstance(backend, StrictBackend)
    assert backend.describe() == {"backend": "strict", "device": "cpu"}
    with pytest.raises(ConfigError, match="strict"):
        CacheConfig(64 * KiB, 4 * KiB, "stricter")


def test_copies_are_visible_only_after_wait():
    backend = StrictBackend(64 * KiB, 4 * KiB)
    values = torch.arange(256, dtype=torch.float32)
    view = backend.tensor_view(4 * KiB, torch.float32, (256,), values.nbytes)
    job = backend.copy_in([(4 * KiB, staged(values))], urgent=True)
    # queued, not done: the slab reads poison (NaN for floats), as a GPU view would read junk
    assert torch.isnan(view).all()
    assert (backend.arena()[4 * KiB : 5 * KiB] == POISON).all()
    job.wait()
    assert torch.equal(view, values)
    assert job.wait() >= 0.0  # idempotent
    assert backend.copies_completed == 1
    assert backend.urgent_copies == 1


def test_every_offset_and_address_is_checked_for_alignment():
    backend = StrictBackend(64 * KiB, 4 * KiB)
    with pytest.raises(CacheError, match="not 256-aligned"):
        backend.tensor_view(4 * KiB + 4, torch.float32, (4,), 16)
    with pytest.raises(CacheError, match="not 256-aligned"):
        backend.copy_in([(100, staged(torch.zeros(4)))])
    source = torch.from_numpy(aligned_host_bytes(512))[4:260]  # a misaligned source address
    with pytest.raises(CacheError, match=r"source .* not 256-aligned"):
        backend.copy_in([(0, source)])
    view = backend.tensor_view(512, torch.int64, (), 8)  # a 0-dim tensor, aligned
    assert view.data_ptr() % 256 == 0


def test_a_copy_into_slabs_a_task_may_still_read_raises_until_its_fence():
    backend = StrictBackend(64 * KiB, 4 * KiB)
    backend.open_reads("a", [(0, 8 * KiB)])
    backend.open_reads("a", [(0, 8 * KiB)])  # a second task on the same model
    assert backend.reads_in_flight() == {"a": 2}
    with pytest.raises(CacheError, match="model 'a' may still be reading"):
        backend.copy_in([(4 * KiB, staged(torch.ones(16)))])
    backend.copy_in([(8 * KiB, staged(torch.ones(16)))]).wait()  # other slabs are fine
    backend.synchronize_compute()
    backend.close_reads("a")
    with pytest.raises(CacheError, match="may still be reading"):
        backend.copy_in([(0, staged(torch.ones(16)))])  # one task is still unfenced
    backend.close_reads("a")
    assert backend.reads_in_flight() == {}
    backend.copy_in([(0, staged(torch.ones(16)))]).wait()
    assert backend.fences == 1
    with pytest.raises(CacheError, match="no reads of model 'a'"):
        backend.close_reads("a")


def test_a_task_cannot_start_on_slabs_still_being_copied():
    backend = StrictBackend(64 * KiB, 4 * KiB)
    job = backend.copy_in([(0, staged(torch.ones(16)))])
    with pytest.raises(CacheError, match="not yet synchronized"):
        backend.open_reads("a", [(0, 4 * KiB)])
    with pytest.raises(CacheError, match="overlaps a copy not yet synchronized"):
        backend.copy_in([(0, staged(torch.zeros(16)))])
    job.wait()
    backend.open_reads("a", [(0, 4 * KiB)])
    assert backend.reads_in_flight() == {"a": 1}


def test_zero_byte_views_live_in_the_arena():
    for backend in (HostBackend(64 * KiB, 4 * KiB), StrictBackend(64 * KiB, 4 * KiB)):
        empty = backend.tensor_view(8 * KiB, torch.float16, (0, 5), 0)
        assert empty.shape == (0, 5)
        # torch says data_ptr() == 0 for any empty tensor; its storage is the arena's
        start, _ = backend.address_range()
        assert empty.untyped_storage().data_ptr() == start
        assert empty.storage_offset() * empty.element_size() == 8 * KiB


def test_strided_views_keep_their_layout():
    backend = StrictBackend(64 * KiB, 4 * KiB)
    image = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    raw = torch.from_numpy(aligned_host_bytes(image.nbytes))
    raw.view(torch.float32).as_strided(image.shape, image.stride()).copy_(image)
    backend.copy_in([(0, raw)]).wait()
    view = backend.tensor_view(0, torch.float32, image.shape, image.nbytes, image.stride())
    assert view.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(view, image)


@pytest.mark.asyncio
async def test_demand_loads_are_urgent_and_prefetches_are_not():
    from torch import nn

    from compass._bench.leases import LeasingCache
    from compass.cache import Model

    models = {name: Model(name, lambda: nn.Linear(8, 8)) for name in ("a", "b")}
    config = CacheConfig(capacity_bytes=64 * KiB, slab_bytes=4 * KiB, backend="strict")
    async with LeasingCache(models, config) as cache:
        backend = cache.backend
        assert isinstance(backend, StrictBackend)
        with await cache.ensure("a"):  # a task waits for it: a high-priority stream on a GPU
            pass
        assert (backend.copies_completed, backend.urgent_copies) == (1, 1)
        cache.prefetch(["b"])  # nobody waits: an ordinary stream
        with await cache.ensure("b"):
            pass
        assert (backend.copies_completed, backend.urgent_copies) == (2, 1)
        assert backend.reads_in_flight() == {}  # both leases fenced on release
        # one copy per slab group, from one staging buffer per model
        assert (
            cache.staged_bytes()
            == 2 * Model("x", lambda: nn.Linear(8, 8)).layout(4 * KiB).staging_bytes
        )
