"""Slab layouts and handles: how a model's tensors are packed into fixed-size slabs.

Sans-IO: no asyncio, no torch, no CuPy. A :class:`SlabLayout` says how many slabs a model
needs and where each tensor sits inside them; a :class:`SlabHandle` names the slabs the pool
gave one allocation, with the generation that makes a stale handle detectable.

A layout is a list of *groups*. A group is one slab, or, for a tensor larger than a slab, a run
of contiguous slabs. Small tensors are packed first-fit-decreasing into single slabs and into
the unused tail of runs, each at an aligned offset, so a model wastes at most about one slab.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from compass.errors import ConfigError

__all__ = ["TENSOR_ALIGN", "SlabHandle", "SlabLayout", "TensorSlot"]

#: byte alignment of every tensor inside a slab: enough for any dtype and for coalesced GPU
#: access, and what CUDA allocators themselves guarantee
TENSOR_ALIGN = 256


def _align_up(value: int, align: int) -> int:
    return (value + align - 1) // align * align


@dataclass(frozen=True, slots=True)
class TensorSlot:
    """Where one tensor lives: ``offset`` bytes from the start of layout group ``group``.

    A zero-byte tensor has ``group == -1``: it needs no storage.
    """

    key: str
    group: int
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class SlabLayout:
    """A model's footprint: ``groups[i]`` contiguous slabs for group ``i``, plus tensor slots.

    Groups with more than one slab come first, largest first; the rest are single slabs.
    """

    slab_bytes: int
    groups: tuple[int, ...]
    slots: tuple[TensorSlot, ...] = ()

    def __post_init__(self) -> None:
        if self.slab_bytes <= 0:
            raise ConfigError(f"slab size must be > 0, got {self.slab_bytes}")
        if any(count < 1 for count in self.groups):
            raise ConfigError(f"every layout group needs at least one slab, got {self.groups}")

    @property
    def total_slabs(self) -> int:
        """Slabs the model occupies."""
        return sum(self.groups)

    @property
    def footprint_bytes(self) -> int:
        """Bytes of cache the model occupies (whole slabs)."""
        return self.total_slabs * self.slab_bytes

    @property
    def payload_bytes(self) -> int:
        """Bytes of tensor data (what a load copies)."""
        return sum(slot.nbytes for slot in self.slots)

    def staging(self) -> tuple[tuple[int, int], ...]:
        """Where each group's bytes sit in one host staging buffer: ``(start, extent)`` per
        group. A group's extent runs to the end of its last tensor, aligned; groups follow one
        another, so the buffer holds the payload and alignment padding, not whole slabs, and a
        load is one copy per group."""
        extents = [0] * len(self.groups)
        for slot in self.slots:
            if slot.group >= 0:
                extents[slot.group] = max(extents[slot.group], slot.offset + slot.nbytes)
        placed: list[tuple[int, int]] = []
        start = 0
        for extent in extents:
            extent = _align_up(extent, TENSOR_ALIGN)
            placed.append((start, extent))
            start += extent
        return tuple(placed)

    @property
    def staging_bytes(self) -> int:
        """Bytes of the host staging buffer :meth:`staging` lays out."""
        return sum(extent for _, extent in self.staging())

    @property
    def longest_run(self) -> int:
        """The most contiguous slabs one group needs (1 when no tensor exceeds a slab)."""
        return max(self.groups, default=0)

    @property
    def needs_runs(self) -> bool:
        """Whether placement must find contiguous free slabs, not just enough of them."""
        return self.longest_run > 1

    @classmethod
    def uniform(cls, size_bytes: int, slab_bytes: int) -> SlabLayout:
        """A model known only by its size (emulated mode): whole single slabs, no tensor slots."""
        if size_bytes < 0:
            raise ConfigError(f"model size must be >= 0, got {size_bytes}")
        count = -(-size_bytes // slab_bytes)
        return cls(slab_bytes, (1,) * count)

    @classmethod
    def pack(
        cls, tensors: Iterable[tuple[str, int]], slab_bytes: int, align: int = TENSOR_ALIGN
    ) -> SlabLayout:
        """Pack ``(key, nbytes)`` tensors into slabs.

        A tensor larger than a slab gets its own run of ``ceil(nbytes / slab_bytes)`` slabs;
        the others go first-fit-decreasing into free space (run tails included) at offsets
        aligned to ``align``.
        """
        if slab_bytes % align:
            raise ConfigError(
                f"slab size {slab_bytes} B is not a multiple of the {align} B tensor alignment"
            )
        items = sorted(tensors, key=lambda item: (-item[1], item[0]))
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            raise ConfigError("tensor keys in one layout must be unique")
        groups: list[int] = []
        # per group: bytes used so far (aligned start of the next tensor) and its capacity
        used: list[int] = []
        capacity: list[int] = []
        slots: list[TensorSlot] = []
        for key, nbytes in items:
            if nbytes < 0:
                raise ConfigError(f"tensor {key!r} has negative size {nbytes}")
            if nbytes == 0:
                slots.append(TensorSlot(key, -1, 0, 0))
                continue
            if nbytes > slab_bytes:
                count = -(-nbytes // slab_bytes)
                groups.append(count)
                used.append(_align_up(nbytes, align))
                capacity.append(count * slab_bytes)
                slots.append(TensorSlot(key, len(groups) - 1, 0, nbytes))
                continue
            for index, start in enumerate(used):
                if start + nbytes <= capacity[index]:
                    slots.append(TensorSlot(key, index, start, nbytes))
                    used[index] = _align_up(start + nbytes, align)
                    break
            else:
                groups.append(1)
                used.append(_align_up(nbytes, align))
                capacity.append(slab_bytes)
                slots.append(TensorSlot(key, len(groups) - 1, 0, nbytes))
        # items were sorted largest first, so runs already precede single slabs, largest first
        return cls(slab_bytes, tuple(groups), tuple(slots))


@dataclass(frozen=True, slots=True)
class SlabHandle:
    """One allocation: ``runs[i] = (first_slab, length)`` for layout group ``i``.

    ``generation`` is unique to this allocation; once its slabs are freed (and perhaps given
    to someone else) the pool recognises the handle as stale.
    """

    generation: int
    runs: tuple[tuple[int, int], ...]

    @property
    def slabs(self) -> tuple[int, ...]:
        """Every slab id of the allocation, group by group."""
        return tuple(slab for first, length in self.runs for slab in range(first, first + length))

    @property
    def num_slabs(self) -> int:
        """How many slabs the allocation holds."""
        return sum(length for _, length in self.runs)

    def byte_offset(self, slot: TensorSlot, slab_bytes: int) -> int:
        """Where ``slot`` starts, in bytes from the start of the arena."""
        if slot.group < 0:
            raise ValueError(f"tensor {slot.key!r} is empty and has no storage")
        first, _ = self.runs[slot.group]
        return first * slab_bytes + slot.offset
