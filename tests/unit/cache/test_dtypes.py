"""Every dtype and layout through the model cache, on the strict backend: bytes identical to
the module built directly, views in the arena at aligned addresses, layouts kept, and a
narrower checkpoint dtype (bf16) kept instead of cast up into twice the bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from compass._bench.gpu import dtype_zoo
from compass._bench.leases import LeasingCache
from compass.cache import Model
from compass.cache.backend import StrictBackend
from compass.config import CacheConfig

KiB = 1024


build_zoo = dtype_zoo  # one tensor of each dtype and layout


def raw(tensor: torch.Tensor) -> bytes:
    """The tensor's values as bytes in logical (row-major) order."""
    return bytes(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def address(tensor: torch.Tensor) -> int:
    """Where the tensor's first element is (torch says data_ptr() == 0 when it is empty)."""
    return int(
        tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()
    )


async def load(model: Model) -> tuple[LeasingCache, nn.Module]:
    config = CacheConfig(capacity_bytes=64 * KiB, slab_bytes=4 * KiB, backend="strict")
    cache = LeasingCache({model.name: model}, config)
    await cache.prepare()
    lease = await cache.ensure(model.name)
    module = lease.module
    assert module is not None
    lease.release()
    return cache, module


@pytest.mark.asyncio
async def test_every_dtype_and_layout_arrives_byte_for_byte():
    cache, module = await load(Model("zoo", build_zoo))
    assert isinstance(cache.backend, StrictBackend)
    reference = dict(build_zoo().state_dict())
    start, end = cache.backend.address_range()
    got = dict(module.state_dict())
    assert got.keys() == reference.keys()
    for key, expected in reference.items():
        tensor = got[key]
        assert tensor.dtype == expected.dtype, key
        assert tensor.shape == expected.shape, key
        assert tensor.stride() == expected.stride(), key  # channels_last, transposed kept
        assert raw(tensor) == raw(expected), key
        assert start <= address(tensor) <= end, key  # the empty one too
        assert address(tensor) % 256 == 0, key
    assert got["conv.weight"].is_contiguous(memory_format=torch.channels_last)
    assert got["step"].dim() == 0 and int(got["step"]) == 7
    await cache.aclose()


@pytest.mark.asyncio
async def test_a_bf16_checkpoint_stays_bf16_in_the_slabs(tmp_path: Path):
    torch.manual_seed(9)
    weights = {"lin.weight": torch.randn(16, 8).bfloat16(), "lin.bias": torch.randn(16).bfloat16()}
    save_file(weights, str(tmp_path / "zoo.safetensors"))
    model = Model("zoo", build_zoo, tmp_path / "zoo.safetensors", strict=False)
    fp32 = Model("plain", build_zoo)
    specs = {spec.key: spec for spec in model.tensor_specs()}
    assert specs["lin.weight"].dtype == torch.bfloat16
    assert specs["lin.weight"].nbytes == 16 * 8 * 2  # not cast up to 4 bytes an element
    assert model.size_bytes == fp32.size_bytes - (16 * 8 + 16) * 2
    cache, module = await load(model)
    lin = module.get_submodule("lin")
    assert isinstance(lin, nn.Linear)
    assert lin.weight.dtype == torch.bfloat16
    assert raw(lin.weight) == raw(weights["lin.weight"])
    assert raw(lin.bias) == raw(weights["lin.bias"])
    # the staging buffer holds the payload and alignment padding, nothing more
    assert cache.staged_bytes() < model.size_bytes * 1.1 + 256 * len(specs)
    await cache.aclose()
    assert cache.staged_bytes() == 0


@pytest.mark.asyncio
async def test_a_loader_checkpoint_cast_up_is_said(caplog):
    # a loader's dtypes are known only once it runs: the cast is made, and logged
    def loader() -> dict[str, torch.Tensor]:
        torch.manual_seed(9)
        return {"lin.weight": torch.randn(16, 8).bfloat16(), "lin.bias": torch.randn(16).bfloat16()}

    model = Model("zoo", build_zoo, loader=loader, strict=False)
    with caplog.at_level("WARNING", logger="compass.cache.weights"):
        cache, module = await load(model)
    lin = module.get_submodule("lin")
    assert isinstance(lin, nn.Linear)
    assert lin.weight.dtype == torch.float32
    assert torch.equal(lin.weight, loader()["lin.weight"].float())
    assert any("cast up" in record.getMessage() for record in caplog.records)
    await cache.aclose()
