"""Slab memory: where the bytes of cached models live.

Three backends behind one interface, all one arena carved into slabs by
:class:`~compass.cache.pool.SlabPool`:

- :class:`CupyBackend`: one device allocation made with CuPy (imported lazily), exposed to
  torch through DLPack; loads copy from pinned host memory on a side CUDA stream.
- :class:`HostBackend`: one host arena (numpy), exposed to torch with ``torch.from_numpy``;
  the default without a GPU, and what the tests run on.
- :class:`CapacityBackend`: emulated mode. It accounts slabs and holds no bytes, so several
  emulated workers with 14 GB caches fit in a small machine.

torch is imported only when a backend that holds bytes needs it, so an emulated worker never
pays for it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from compass.cache.slab import TENSOR_ALIGN
from compass.config import CacheConfig, DeviceMemory
from compass.errors import CacheError, ConfigError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "CapacityBackend",
    "CupyBackend",
    "HostBackend",
    "SlabBackend",
    "cuda_available",
    "host_memory_bytes",
    "make_backend",
    "probe_memory",
]


class SlabBackend(ABC):
    """One arena of ``capacity_bytes`` (rounded down to whole slabs)."""

    #: the ``CacheConfig.backend`` name
    kind: ClassVar[str]
    #: False for the capacity backend: nothing is stored, loads only take time
    holds_bytes: ClassVar[bool] = True
    #: whether host copies of weights should be page-locked (fast, asynchronous DMA)
    pin_host_memory: ClassVar[bool] = False

    def __init__(self, capacity_bytes: int, slab_bytes: int) -> None:
        if slab_bytes <= 0 or slab_bytes % TENSOR_ALIGN:
            raise ConfigError(
                f"slab size must be a positive multiple of {TENSOR_ALIGN} B, got {slab_bytes}"
            )
        if capacity_bytes < slab_bytes:
            raise ConfigError(
                f"cache capacity {capacity_bytes} B is smaller than one slab ({slab_bytes} B)"
            )
        self.slab_bytes = slab_bytes
        self.capacity_bytes = capacity_bytes // slab_bytes * slab_bytes
        self._closed = False

    @property
    def device(self) -> str:
        """The torch device of tensors in this arena (``"cpu"``, ``"cuda:0"``, ...)."""
        return "cpu"

    @abstractmethod
    def arena(self) -> torch.Tensor:
        """The whole arena as a one-dimensional ``uint8`` torch tensor (no copy)."""

    def tensor_view(
        self, offset: int, dtype: torch.dtype, shape: Sequence[int], nbytes: int
    ) -> torch.Tensor:
        """A tensor of ``dtype`` and ``shape`` whose storage is ``nbytes`` of the arena at
        ``offset``. ``offset`` must be aligned to the dtype (layouts align to 256 bytes)."""
        import torch

        if nbytes == 0:
            return torch.empty(tuple(shape), dtype=dtype, device=self.device)
        self._check_range(offset, nbytes)
        return self.arena()[offset : offset + nbytes].view(dtype).reshape(tuple(shape))

    def copy_in(self, writes: Sequence[tuple[int, torch.Tensor]]) -> None:
        """Copy each contiguous host tensor's bytes into the arena at its offset; returns when
        every copy is complete."""
        arena = self.arena()
        for offset, source in writes:
            data = source.reshape(-1).view(_uint8())
            self._check_range(offset, data.numel())
            arena[offset : offset + data.numel()].copy_(data)

    def address_range(self) -> tuple[int, int]:
        """``(first address, one past the last)`` of the arena, for checking where tensors live."""
        start = int(self.arena().data_ptr())
        return start, start + self.capacity_bytes

    def close(self) -> None:
        """Drop this backend's reference to the arena (tensors viewing it keep it alive)."""
        self._closed = True

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.capacity_bytes:
            raise CacheError(
                f"arena access of {nbytes} B at offset {offset} is outside the "
                f"{self.capacity_bytes} B arena"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise CacheError(f"the {self.kind} slab backend is closed")


def _uint8() -> torch.dtype:
    import torch

    return torch.uint8


class HostBackend(SlabBackend):
    """One numpy arena in host memory; torch tensors view it via ``torch.from_numpy``.

    The arena is reserved, not touched: pages are faulted in as models are loaded.
    """

    kind = "host"

    def __init__(self, capacity_bytes: int, slab_bytes: int) -> None:
        super().__init__(capacity_bytes, slab_bytes)
        import numpy

        self._array: np.ndarray[Any, np.dtype[np.uint8]] | None = numpy.empty(
            self.capacity_bytes, dtype=numpy.uint8
        )
        self._tensor: torch.Tensor | None = None

    @property
    def array(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The arena as a numpy array."""
        self._check_open()
        assert self._array is not None
        return self._array

    def arena(self) -> torch.Tensor:
        self._check_open()
        if self._tensor is None:
            import torch

            self._tensor = torch.from_numpy(self.array)
        return self._tensor

    def close(self) -> None:
        super().close()
        self._array = None
        self._tensor = None


class CapacityBackend(SlabBackend):
    """Emulated mode: slabs are counted by the pool, no bytes are held anywhere."""

    kind = "capacity"
    holds_bytes = False

    def arena(self) -> torch.Tensor:
        raise CacheError(
            "the capacity backend holds no bytes (emulated mode): there are no tensors to view"
        )

    def copy_in(self, writes: Sequence[tuple[int, torch.Tensor]]) -> None:
        raise CacheError("the capacity backend holds no bytes (emulated mode): nothing to copy")

    def address_range(self) -> tuple[int, int]:
        return 0, 0


class CupyBackend(SlabBackend):
    """One CUDA allocation made with CuPy, shared with torch through DLPack.

    The allocation bypasses CuPy's memory pool (``cupy.cuda.Memory``) so the arena is exactly
    one ``cudaMalloc`` that nothing else can carve up. Loads run on a dedicated stream so they
    overlap compute on the default stream.
    """

    kind = "cupy"
    pin_host_memory = True

    def __init__(self, capacity_bytes: int, slab_bytes: int, *, device_id: int = 0) -> None:
        super().__init__(capacity_bytes, slab_bytes)
        try:
            import cupy
        except ImportError as exc:
            raise ConfigError(
                "the cupy backend needs CuPy: install compass[gpu] (cupy-cuda12x)"
            ) from exc
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("the cupy backend needs a CUDA build of torch and a CUDA device")
        self.device_id = device_id
        with cupy.cuda.Device(device_id):
            memory = cupy.cuda.Memory(self.capacity_bytes)
            pointer = cupy.cuda.MemoryPointer(memory, 0)
            self._array: Any = cupy.ndarray(
                (self.capacity_bytes,), dtype=cupy.uint8, memptr=pointer
            )
        from torch.utils.dlpack import from_dlpack

        self._tensor: torch.Tensor | None = from_dlpack(self._array)
        self._stream: Any = torch.cuda.Stream(device=device_id)  # type: ignore[no-untyped-call]

    @property
    def device(self) -> str:
        return f"cuda:{self.device_id}"

    @property
    def array(self) -> Any:
        """The arena as a CuPy array."""
        self._check_open()
        return self._array

    def arena(self) -> torch.Tensor:
        self._check_open()
        assert self._tensor is not None
        return self._tensor

    def copy_in(self, writes: Sequence[tuple[int, torch.Tensor]]) -> None:
        import torch

        arena = self.arena()
        # pinned sources make these true asynchronous DMA copies; one synchronize at the end
        with torch.cuda.device(self.device_id), torch.cuda.stream(self._stream):
            for offset, source in writes:
                data = source.reshape(-1).view(torch.uint8)
                self._check_range(offset, data.numel())
                arena[offset : offset + data.numel()].copy_(data, non_blocking=True)
        self._stream.synchronize()

    def close(self) -> None:
        super().close()
        self._tensor = None
        self._array = None


def cuda_available() -> bool:
    """Whether CuPy imports, sees a CUDA device, and torch can share it (a CUDA build)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
    except Exception:  # ImportError, or CUDARuntimeError when there is no driver
        return False
    import torch

    return bool(torch.cuda.is_available())


def probe_memory(backend: str = "auto", *, device_id: int = 0) -> DeviceMemory:
    """The memory a cache on ``backend`` could take here: free GPU memory for CuPy (what
    ``"auto"`` picks on a GPU), the machine's memory for the host backend."""
    kind = backend
    if kind == "auto":
        kind = "cupy" if cuda_available() else "host"
    if kind == "cupy":
        return DeviceMemory(kind, free_gpu_bytes=_free_gpu_bytes(device_id))
    if kind == "host":
        return DeviceMemory(kind, host_bytes=host_memory_bytes())
    return DeviceMemory(kind)


def _free_gpu_bytes(device_id: int) -> int | None:
    try:
        import cupy

        with cupy.cuda.Device(device_id):
            free, _total = cupy.cuda.runtime.memGetInfo()
        return int(free)
    except Exception:  # no CuPy, no driver: the caller falls back to a fixed default
        return None


def host_memory_bytes() -> int | None:
    """Physical memory, or the container's memory limit where that is lower; ``None`` if
    unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not POSIX
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                limit = int(f.read().strip())
        except (OSError, ValueError):  # absent, or "max": no limit
            continue
        if 0 < limit < total:
            total = limit
    return total if total > 0 else None


def make_backend(config: CacheConfig, *, device_id: int = 0) -> SlabBackend:
    """The backend ``config.backend`` names; ``"auto"`` is CuPy on a GPU, host memory elsewhere."""
    kind = config.backend
    if kind == "auto":
        kind = "cupy" if cuda_available() else "host"
    if kind == "cupy":
        return CupyBackend(config.capacity, config.slab_bytes, device_id=device_id)
    if kind == "host":
        return HostBackend(config.capacity, config.slab_bytes)
    if kind == "capacity":
        return CapacityBackend(config.capacity, config.slab_bytes)
    raise ConfigError(f"unknown cache backend {kind!r}")
