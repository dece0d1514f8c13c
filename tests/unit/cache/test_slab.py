"""SlabLayout packing and SlabHandle arithmetic (sans-IO, no event loop)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compass.cache.slab import TENSOR_ALIGN, SlabHandle, SlabLayout
from compass.errors import ConfigError

SLAB = 1024


def _check_packing(layout: SlabLayout, sizes: dict[str, int]) -> None:
    """Every tensor placed once, aligned, inside its group, and no two overlap."""
    assert {slot.key for slot in layout.slots} == set(sizes)
    by_group: dict[int, list[tuple[int, int]]] = {}
    for slot in layout.slots:
        assert slot.nbytes == sizes[slot.key]
        if slot.nbytes == 0:
            assert slot.group == -1
            continue
        assert slot.offset % TENSOR_ALIGN == 0
        assert slot.offset + slot.nbytes <= layout.groups[slot.group] * layout.slab_bytes
        by_group.setdefault(slot.group, []).append((slot.offset, slot.offset + slot.nbytes))
    for spans in by_group.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"overlapping tensors: {spans}"
    # runs come first, longest first; single slabs after
    runs = [count for count in layout.groups if count > 1]
    assert list(layout.groups[: len(runs)]) == sorted(runs, reverse=True)


def test_tensor_larger_than_a_slab_gets_a_run_and_its_tail_is_reused():
    sizes = {"big": 2100, "small": 500, "mid": 1000, "tiny": 4}
    layout = SlabLayout.pack(sizes.items(), SLAB)
    _check_packing(layout, sizes)
    slots = {slot.key: slot for slot in layout.slots}
    assert layout.groups[0] == 3  # ceil(2100 / 1024)
    assert slots["big"].group == 0
    # 2100 rounds up to 2304; the run's 768 B tail holds the 500 B tensor
    assert slots["small"].group == 0
    assert slots["small"].offset == 2304
    assert layout.total_slabs == 4
    assert layout.needs_runs
    assert layout.longest_run == 3
    assert layout.payload_bytes == sum(sizes.values())


def test_small_tensors_share_slabs():
    sizes = {f"t{i}": 200 for i in range(8)}  # 8 x 256 aligned = 2048 B = 2 slabs
    layout = SlabLayout.pack(sizes.items(), SLAB)
    _check_packing(layout, sizes)
    assert layout.groups == (1, 1)
    assert not layout.needs_runs


def test_empty_tensor_takes_no_space():
    layout = SlabLayout.pack([("empty", 0), ("x", 10)], SLAB)
    assert layout.total_slabs == 1
    assert {s.key: s.group for s in layout.slots}["empty"] == -1


def test_uniform_layout_rounds_up_to_whole_slabs():
    assert SlabLayout.uniform(0, SLAB).groups == ()
    assert SlabLayout.uniform(1, SLAB).groups == (1,)
    assert SlabLayout.uniform(3 * SLAB + 1, SLAB).groups == (1, 1, 1, 1)


def test_bad_layouts_are_refused():
    with pytest.raises(ConfigError, match="multiple"):
        SlabLayout.pack([("x", 10)], 1000)
    with pytest.raises(ConfigError, match="unique"):
        SlabLayout.pack([("x", 10), ("x", 20)], SLAB)
    with pytest.raises(ConfigError, match="negative"):
        SlabLayout.pack([("x", -1)], SLAB)
    with pytest.raises(ConfigError):
        SlabLayout(SLAB, (0,))


def test_handle_byte_offsets():
    layout = SlabLayout.pack([("big", 2100), ("small", 500), ("other", 900)], SLAB)
    handle = SlabHandle(generation=7, runs=((10, 3), (2, 1)))
    slots = {slot.key: slot for slot in layout.slots}
    assert handle.byte_offset(slots["big"], SLAB) == 10 * SLAB
    assert handle.byte_offset(slots["small"], SLAB) == 10 * SLAB + 2304
    assert handle.byte_offset(slots["other"], SLAB) == 2 * SLAB
    assert handle.slabs == (10, 11, 12, 2)
    assert handle.num_slabs == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5 * SLAB), min_size=1, max_size=30))
def test_packing_property(raw_sizes):
    sizes = {f"t{i}": n for i, n in enumerate(raw_sizes)}
    layout = SlabLayout.pack(sizes.items(), SLAB)
    _check_packing(layout, sizes)
    # runs are exactly the tensors over a slab; packing never needs more slabs than one slab
    # (or run) per tensor
    big = sorted((-(-n // SLAB) for n in raw_sizes if n > SLAB), reverse=True)
    assert [c for c in layout.groups if c > 1] == [c for c in big if c > 1]
    assert layout.total_slabs <= sum(-(-n // SLAB) for n in raw_sizes)


def test_staging_lays_groups_end_to_end_without_whole_slabs():
    layout = SlabLayout.pack([("big", 10_000), ("a", 300), ("b", 100), ("empty", 0)], 4096)
    staging = layout.staging()
    assert len(staging) == len(layout.groups)
    # each group's extent ends at its last tensor (aligned), and the next group follows it
    start = 0
    for (at, extent), group in zip(staging, range(len(layout.groups)), strict=True):
        assert at == start
        last = max(s.offset + s.nbytes for s in layout.slots if s.group == group)
        assert extent == -(-last // 256) * 256
        start += extent
    assert layout.staging_bytes == start
    assert layout.payload_bytes <= layout.staging_bytes < layout.footprint_bytes
    assert layout.staging_bytes - layout.payload_bytes < 256 * len(layout.slots)
