"""Slab memory: where the bytes of cached models live.

Four backends behind one interface, all one arena carved into slabs by
:class:`~compass.cache.pool.SlabPool`:

- :class:`CupyBackend`: one device allocation made with CuPy (imported lazily), exposed to
  torch through DLPack. Each load copies from one exact-size pinned host buffer per model on a
  stream of its own (high priority for a load a task waits for), timed with CUDA events.
- :class:`HostBackend`: one 256-byte-aligned host arena (numpy), exposed to torch with
  ``torch.from_numpy``; the default without a GPU.
- :class:`StrictBackend`: the host arena with the GPU's rules checked, for tests: every offset
  and ``data_ptr`` 256-byte aligned; copies that become visible only at their explicit
  :meth:`CopyJob.wait` (the slabs read poison bytes until then); and slabs with readers in flight
  from a task's start until its compute fence, so a copy into a slab a task may still be reading
  raises instead of corrupting it.
- :class:`CapacityBackend`: emulated mode. It accounts slabs and holds no bytes, so several
  emulated workers with 14 GB caches fit in a small machine.

**Streams and fences.** A copy is queued by :meth:`SlabBackend.copy_in` and is complete (and its
bytes visible) once :meth:`CopyJob.wait` returns. A task's kernels run on its thread's compute
stream (:meth:`SlabBackend.compute_stream`); they may still be reading the model's slabs after
the task's function has returned, until :meth:`SlabBackend.synchronize_compute` (the compute
fence). The model cache opens a model's reads when it hands the module to a task
(:meth:`SlabBackend.open_reads`) and closes them after the fence (:meth:`SlabBackend.close_reads`);
only then may the model be unpinned, evicted and its slabs overwritten.

torch is imported only when a backend that holds bytes needs it, so an emulated worker never
pays for it.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from compass.cache.slab import TENSOR_ALIGN
from compass.config import CacheConfig, DeviceMemory
from compass.errors import CacheError, ConfigError

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "POISON",
    "CapacityBackend",
    "CopyJob",
    "CupyBackend",
    "HostBackend",
    "SlabBackend",
    "StrictBackend",
    "aligned_host_bytes",
    "cuda_available",
    "cuda_problem",
    "host_memory_bytes",
    "make_backend",
    "probe_memory",
    "resolve_cache",
]

log = logging.getLogger(__name__)

#: the byte the strict backend fills slabs with while a copy into them is not yet synchronized
#: (0xFF: NaN in every floating-point format, -1 in signed integers)
POISON = 0xFF


class CopyJob(ABC):
    """Copies queued by :meth:`SlabBackend.copy_in`."""

    @abstractmethod
    def wait(self) -> float:
        """Block until every copy is complete and its bytes are visible in the arena; return
        the seconds the copies took (device time, where the device can tell). Calling it again
        returns the same seconds."""


class _DoneCopy(CopyJob):
    """Copies that were complete when queued (host memory)."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def wait(self) -> float:
        return self._seconds


class SlabBackend(ABC):
    """One arena of ``capacity_bytes`` (rounded down to whole slabs)."""

    #: the ``CacheConfig.backend`` name
    kind: ClassVar[str]
    #: False for the capacity backend: nothing is stored, loads only take time
    holds_bytes: ClassVar[bool] = True
    #: whether host staging buffers are page-locked (fast, asynchronous DMA)
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
        #: why ``auto`` chose this backend when a GPU seemed present (None: no fallback)
        self.fallback: str | None = None

    @property
    def device(self) -> str:
        """The torch device of tensors in this arena (``"cpu"``, ``"cuda:0"``, ...)."""
        return "cpu"

    @abstractmethod
    def arena(self) -> torch.Tensor:
        """The whole arena as a one-dimensional ``uint8`` torch tensor (no copy)."""

    def tensor_view(
        self,
        offset: int,
        dtype: torch.dtype,
        shape: Sequence[int],
        nbytes: int,
        stride: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """A tensor of ``dtype``, ``shape`` (and ``stride``, when given: a dense layout such as
        channels_last) whose storage is ``nbytes`` of the arena at ``offset``. ``offset`` must
        be aligned to the dtype (layouts align to 256 bytes). A zero-byte tensor is an empty
        view at ``offset``: it lives in the arena like any other."""
        self._check_range(offset, nbytes)
        flat = self.arena()[offset : offset + nbytes].view(dtype)
        if stride is None:
            return flat.reshape(tuple(shape))
        return flat.as_strided(tuple(shape), tuple(stride))

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """A 256-byte-aligned ``uint8`` host buffer of exactly ``nbytes`` to stage weights in
        (page-locked on a GPU backend)."""
        import torch

        return torch.from_numpy(aligned_host_bytes(nbytes))

    def copy_in(
        self, writes: Sequence[tuple[int, torch.Tensor]], *, urgent: bool = False
    ) -> CopyJob:
        """Queue a copy of each contiguous host tensor's bytes into the arena at its offset.

        The bytes are in the arena once the returned job's :meth:`~CopyJob.wait` returns.
        ``urgent``: a task waits for this load (a GPU backend gives it a high-priority stream).
        """
        arena = self.arena()
        started = time.perf_counter()
        for offset, source in writes:
            data = _bytes_of(source)
            self._check_range(offset, data.numel())
            arena[offset : offset + data.numel()].copy_(data)
        return _DoneCopy(time.perf_counter() - started)

    # -- compute streams and fences ------------------------------------------------------------

    @contextlib.contextmanager
    def compute_stream(self) -> Iterator[None]:
        """Run what the block launches on this thread's compute stream (nothing on the host)."""
        yield

    def synchronize_compute(self) -> None:
        """The compute fence: wait until what this thread's compute stream queued is done."""
        return None

    def open_reads(self, key: str, ranges: Sequence[tuple[int, int]]) -> None:
        """A task starts that may read ``ranges`` (``(offset, nbytes)``) until its compute
        fence; ``key`` names the model. Only the strict backend checks copies against it."""
        return None

    def close_reads(self, key: str) -> None:
        """One task that opened reads under ``key`` is past its compute fence."""
        return None

    def reads_in_flight(self) -> dict[str, int]:
        """Open reads per key (the strict backend tracks them; others report none)."""
        return {}

    # -- the arena -----------------------------------------------------------------------------

    def address_range(self) -> tuple[int, int]:
        """``(first address, one past the last)`` of the arena, for checking where tensors live."""
        start = int(self.arena().data_ptr())
        return start, start + self.capacity_bytes

    def close(self) -> None:
        """Drop this backend's reference to the arena (tensors viewing it keep it alive)."""
        self._closed = True

    def describe(self) -> dict[str, Any]:
        """What ``compass status`` shows of this backend."""
        info: dict[str, Any] = {"backend": self.kind, "device": self.device}
        if self.fallback is not None:
            info["fallback"] = self.fallback
        return info

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.capacity_bytes:
            raise CacheError(
                f"arena access of {nbytes} B at offset {offset} is outside the "
                f"{self.capacity_bytes} B arena"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise CacheError(f"the {self.kind} slab backend is closed")


def _bytes_of(source: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat ``uint8`` tensor (no copy)."""
    import torch

    if not source.is_contiguous():
        raise CacheError("copy_in takes contiguous host tensors (stage weights into a buffer)")
    return source.reshape(-1).view(torch.uint8)


def aligned_host_bytes(nbytes: int, align: int = TENSOR_ALIGN) -> np.ndarray[Any, Any]:
    """A numpy ``uint8`` array of ``nbytes`` whose first byte is ``align``-aligned (numpy
    guarantees only 16 or 64), so host arenas and staging buffers keep the GPU's alignment."""
    import numpy

    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    raw = numpy.empty(nbytes + align, dtype=numpy.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + nbytes]


class HostBackend(SlabBackend):
    """One 256-byte-aligned numpy arena in host memory; torch tensors view it via
    ``torch.from_numpy``.

    The arena is reserved, not touched: pages are faulted in as models are loaded.
    """

    kind = "host"

    def __init__(self, capacity_bytes: int, slab_bytes: int) -> None:
        super().__init__(capacity_bytes, slab_bytes)
        self._array: np.ndarray[Any, np.dtype[np.uint8]] | None = aligned_host_bytes(
            self.capacity_bytes
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


class _StrictCopy(CopyJob):
    """Copies the strict backend holds back until :meth:`wait`."""

    def __init__(
        self, backend: StrictBackend, pending: list[tuple[int, torch.Tensor]], urgent: bool
    ) -> None:
        self._backend = backend
        self._pending = pending
        self.urgent = urgent
        self._seconds: float | None = None

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """``(offset, nbytes)`` of each copy not yet made visible."""
        return [(offset, data.numel()) for offset, data in self._pending]

    def wait(self) -> float:
        if self._seconds is None:
            self._seconds = self._backend._complete(self)
            self._pending = []
        return self._seconds


class StrictBackend(HostBackend):
    """The host arena with the GPU's rules enforced; see the module docstring.

    Breaking a rule raises :class:`~compass.errors.CacheError` at once, where the GPU would
    corrupt memory silently or later: an offset or address not 256-byte aligned, a copy into
    bytes a task may still read (no compute fence since its start) or into bytes another copy
    has not finished writing, and a task starting on bytes still being copied. Until a copy is
    waited for, its destination reads :data:`POISON` bytes.
    """

    kind = "strict"

    def __init__(self, capacity_bytes: int, slab_bytes: int) -> None:
        super().__init__(capacity_bytes, slab_bytes)
        self._lock = threading.Lock()
        #: model -> the ranges of each task that opened reads and is not past its fence
        self._reads: dict[str, list[tuple[tuple[int, int], ...]]] = {}
        self._copies: list[_StrictCopy] = []
        #: copies made visible, and how many were urgent (tests read them)
        self.copies_completed = 0
        self.urgent_copies = 0
        #: compute fences passed (synchronize_compute calls)
        self.fences = 0
        start = int(self.arena().data_ptr())
        if start % TENSOR_ALIGN:
            raise CacheError(f"strict arena starts at {start:#x}, not {TENSOR_ALIGN}-aligned")

    def tensor_view(
        self,
        offset: int,
        dtype: torch.dtype,
        shape: Sequence[int],
        nbytes: int,
        stride: Sequence[int] | None = None,
    ) -> torch.Tensor:
        self._check_aligned(offset, "tensor view")
        view = super().tensor_view(offset, dtype, shape, nbytes, stride)
        if view.data_ptr() % TENSOR_ALIGN:
            raise CacheError(
                f"tensor view at offset {offset} has data_ptr {view.data_ptr():#x}, "
                f"not {TENSOR_ALIGN}-aligned"
            )
        return view

    def copy_in(
        self, writes: Sequence[tuple[int, torch.Tensor]], *, urgent: bool = False
    ) -> CopyJob:
        arena = self.arena()
        pending: list[tuple[int, torch.Tensor]] = []
        for offset, source in writes:
            self._check_aligned(offset, "copy")
            if source.data_ptr() % TENSOR_ALIGN:
                raise CacheError(
                    f"copy source at {source.data_ptr():#x} is not {TENSOR_ALIGN}-aligned "
                    "(stage weights in host_buffer memory)"
                )
            data = _bytes_of(source)
            self._check_range(offset, data.numel())
            pending.append((offset, data))
        job = _StrictCopy(self, pending, urgent)
        with self._lock:
            for offset, nbytes in job.ranges:
                self._check_no_readers(offset, nbytes)
                for other in self._copies:
                    if any(_overlap(offset, nbytes, o, n) for o, n in other.ranges):
                        raise CacheError(
                            f"copy into arena bytes {offset}..{offset + nbytes} overlaps a copy "
                            "not yet synchronized"
                        )
            self._copies.append(job)
            for offset, nbytes in job.ranges:
                arena[offset : offset + nbytes].fill_(POISON)
        return job

    def _complete(self, job: _StrictCopy) -> float:
        arena = self.arena()
        started = time.perf_counter()
        with self._lock:
            for offset, data in job._pending:
                arena[offset : offset + data.numel()].copy_(data)
            self._copies.remove(job)
            self.copies_completed += 1
            self.urgent_copies += job.urgent
        return time.perf_counter() - started

    def synchronize_compute(self) -> None:
        with self._lock:
            self.fences += 1

    def open_reads(self, key: str, ranges: Sequence[tuple[int, int]]) -> None:
        with self._lock:
            for offset, nbytes in ranges:
                for copy in self._copies:
                    if any(_overlap(offset, nbytes, o, n) for o, n in copy.ranges):
                        raise CacheError(
                            f"a task on model {key!r} starts while a copy into its slabs is "
                            "not yet synchronized"
                        )
            self._reads.setdefault(key, []).append(tuple(ranges))

    def close_reads(self, key: str) -> None:
        with self._lock:
            open_ = self._reads.get(key)
            if not open_:
                raise CacheError(f"no reads of model {key!r} are open to close")
            open_.pop()
            if not open_:
                del self._reads[key]

    def reads_in_flight(self) -> dict[str, int]:
        with self._lock:
            return {key: len(ranges) for key, ranges in self._reads.items()}

    def _check_no_readers(self, offset: int, nbytes: int) -> None:
        for key, tasks in self._reads.items():
            for ranges in tasks:
                if any(_overlap(offset, nbytes, o, n) for o, n in ranges):
                    raise CacheError(
                        f"copy into arena bytes {offset}..{offset + nbytes} while a task on "
                        f"model {key!r} may still be reading them (no compute fence since it "
                        "started)"
                    )

    def _check_aligned(self, offset: int, what: str) -> None:
        if offset % TENSOR_ALIGN:
            raise CacheError(f"{what} at arena offset {offset} is not {TENSOR_ALIGN}-aligned")


def _overlap(a: int, an: int, b: int, bn: int) -> bool:
    return an > 0 and bn > 0 and a < b + bn and b < a + an


class CapacityBackend(SlabBackend):
    """Emulated mode: slabs are counted by the pool, no bytes are held anywhere."""

    kind = "capacity"
    holds_bytes = False

    def arena(self) -> torch.Tensor:
        raise CacheError(
            "the capacity backend holds no bytes (emulated mode): there are no tensors to view"
        )

    def copy_in(
        self, writes: Sequence[tuple[int, torch.Tensor]], *, urgent: bool = False
    ) -> CopyJob:
        raise CacheError("the capacity backend holds no bytes (emulated mode): nothing to copy")

    def address_range(self) -> tuple[int, int]:
        return 0, 0

    def describe(self) -> dict[str, Any]:
        return {"backend": self.kind, "device": "none"}


class _CudaCopy(CopyJob):
    """Copies queued on a stream of their own, between two timing events."""

    def __init__(self, stream: Any, start: Any, end: Any) -> None:
        self._stream = stream  # kept alive until the copies are done
        self._start = start
        self._end = end
        self._seconds: float | None = None

    def wait(self) -> float:
        if self._seconds is None:
            self._end.synchronize()
            self._seconds = float(self._start.elapsed_time(self._end)) / 1000.0
            self._stream = None
        return self._seconds


class CupyBackend(SlabBackend):
    """One CUDA allocation made with CuPy, shared with torch through DLPack.

    The allocation bypasses CuPy's memory pool (``cupy.cuda.Memory``) so the arena is exactly
    one ``cudaMalloc`` that nothing else can carve up. Each load runs on a stream of its own
    from torch's pool (high priority when a task waits for it), so a demand load is not queued
    behind a prefetch, and is timed with CUDA events on that stream. Each task thread launches
    on a compute stream of its own; its compute fence synchronizes that stream.
    """

    kind = "cupy"
    pin_host_memory = True
    #: a speculative load's copies are queued in pieces of at most this many bytes
    PREFETCH_CHUNK: ClassVar[int] = 64 << 20
    #: and at most this many pieces ahead of the copy engine
    PREFETCH_AHEAD: ClassVar[int] = 2

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
        count = torch.cuda.device_count()
        if not 0 <= device_id < count:
            raise ConfigError(
                f"CUDA device {device_id} does not exist here ({count} visible; "
                "CUDA_VISIBLE_DEVICES renumbers them from 0)"
            )
        self.device_id = device_id
        try:
            with cupy.cuda.Device(device_id):
                memory = cupy.cuda.Memory(self.capacity_bytes)
                pointer = cupy.cuda.MemoryPointer(memory, 0)
                self._array: Any = cupy.ndarray(
                    (self.capacity_bytes,), dtype=cupy.uint8, memptr=pointer
                )
        except cupy.cuda.memory.OutOfMemoryError as exc:
            free = _free_gpu_bytes(device_id)
            seen = "" if free is None else f", {free / 2**20:.0f} MiB free"
            raise ConfigError(
                f"cannot allocate a {self.capacity_bytes / 2**20:.0f} MiB model cache on "
                f"cuda:{device_id} (out of memory{seen}): give a smaller --cache-mb, or another "
                "--device"
            ) from exc
        from torch.utils.dlpack import from_dlpack

        self._tensor: torch.Tensor | None = from_dlpack(self._array)
        self._local = threading.local()
        self._urgent_lock = threading.Lock()
        self._urgent: list[Any] = []

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

    def host_buffer(self, nbytes: int) -> torch.Tensor:
        """Exactly ``nbytes`` of page-locked host memory (``cudaHostAlloc``, not torch's
        caching allocator, which rounds up to a power of two and keeps what it rounded)."""
        import cupy
        import numpy
        import torch

        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        with cupy.cuda.Device(self.device_id):
            memory = cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(nbytes), 0)
        # the numpy array holds the pointer, the tensor holds the array: freed with the tensor
        return torch.from_numpy(numpy.frombuffer(memory, dtype=numpy.uint8, count=nbytes))

    def copy_in(
        self, writes: Sequence[tuple[int, torch.Tensor]], *, urgent: bool = False
    ) -> CopyJob:
        """Queue the copies on a new stream and return at once when ``urgent``. A speculative
        load (not urgent) is queued from this thread in pieces of at most
        :attr:`PREFETCH_CHUNK`, at most :attr:`PREFETCH_AHEAD` of them ahead of the copy engine,
        and waits for every urgent load's copies before queueing the next piece: copy engines
        serve streams in the order copies were queued (stream priorities order kernels, not
        copies), so this is what keeps a demand load from waiting behind a whole prefetch."""
        import torch

        arena = self.arena()
        pieces: list[tuple[int, torch.Tensor]] = []
        for offset, source in writes:
            data = _bytes_of(source)
            self._check_range(offset, data.numel())
            step = data.numel() if urgent else self.PREFETCH_CHUNK
            for at in range(0, data.numel(), max(step, 1)):
                pieces.append((offset + at, data[at : at + step]))
        # lower is more urgent; torch clamps to the device's range
        stream = torch.cuda.Stream(  # type: ignore[no-untyped-call]
            device=self.device_id, priority=-1 if urgent else 0
        )
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        ahead: list[Any] = []
        with torch.cuda.device(self.device_id), torch.cuda.stream(stream):
            start.record(stream)
            for offset, data in pieces:
                if not urgent:
                    while len(ahead) >= self.PREFETCH_AHEAD:
                        ahead.pop(0).synchronize()
                    for event in self._urgent_in_flight():
                        event.synchronize()
                arena[offset : offset + data.numel()].copy_(data, non_blocking=True)
                if not urgent:
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(stream)
                    ahead.append(event)
            end.record(stream)
        if urgent:
            with self._urgent_lock:
                self._urgent.append(end)
        return _CudaCopy(stream, start, end)

    def _urgent_in_flight(self) -> list[Any]:
        """The end events of urgent loads whose copies are not done yet."""
        with self._urgent_lock:
            self._urgent = [event for event in self._urgent if not event.query()]
            return list(self._urgent)

    @contextlib.contextmanager
    def compute_stream(self) -> Iterator[None]:
        import torch

        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = torch.cuda.Stream(device=self.device_id)  # type: ignore[no-untyped-call]
            self._local.stream = stream
        with torch.cuda.device(self.device_id), torch.cuda.stream(stream):
            yield

    def synchronize_compute(self) -> None:
        import torch

        torch.cuda.current_stream(self.device_id).synchronize()

    def close(self) -> None:
        super().close()
        self._tensor = None
        self._array = None


def cuda_problem() -> str | None:
    """Why the cupy backend cannot run here, or ``None`` when CuPy and torch share a device."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return f"CuPy does not import ({type(exc).__name__}: {exc}); install compass[gpu]"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # CUDARuntimeError when there is no driver
        return f"CuPy sees no CUDA device ({type(exc).__name__}: {exc})"
    import torch

    if not torch.cuda.is_available():
        return "torch is not a CUDA build, or sees no CUDA device"
    return None


def cuda_available() -> bool:
    """Whether CuPy imports, sees a CUDA device, and torch can share it (a CUDA build)."""
    return cuda_problem() is None


def _torch_sees_cuda() -> bool:
    """Whether torch sees a CUDA device. Importing torch takes seconds, so a host with no GPU
    device node (NVIDIA's, or ROCm's) is answered without it: a worker without a GPU starts
    that much sooner."""
    if "torch" not in sys.modules and not gpu_device_nodes():
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken torch install is not ours to diagnose here
        return False


def gpu_device_nodes() -> list[str]:
    """The GPU device nodes here: NVIDIA's (``/dev/nvidia0``...), ROCm's (``/dev/kfd``) and
    WSL's (``/dev/dxg``); torch can see a device only where one exists."""
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    return nodes + [node for node in ("/dev/kfd", "/dev/dxg") if os.path.exists(node)]


def resolve_cache(config: CacheConfig) -> CacheConfig:
    """``config`` with its capacity chosen: as given, else the default share of the memory
    :func:`probe_memory` measures here for its backend and device
    (:meth:`CacheConfig.resolved <compass.config.CacheConfig.resolved>`)."""
    if config.capacity_bytes is not None:
        return config
    return config.resolved(memory=probe_memory(config.backend, device_id=config.device))


def probe_memory(backend: str = "auto", *, device_id: int = 0) -> DeviceMemory:
    """The memory a cache on ``backend`` could take here: free GPU memory for CuPy (what
    ``"auto"`` picks on a GPU), the machine's memory for the host backends."""
    kind = backend
    if kind == "auto":
        kind = "cupy" if cuda_available() else "host"
    if kind == "cupy":
        return DeviceMemory(kind, free_gpu_bytes=_free_gpu_bytes(device_id))
    if kind in ("host", "strict"):
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


def make_backend(config: CacheConfig, *, device_id: int | None = None) -> SlabBackend:
    """The backend ``config.backend`` names, on ``device_id`` (default ``config.device``).

    ``"auto"`` is CuPy on a GPU, host memory elsewhere. Where torch sees CUDA but the cupy
    backend cannot run (CuPy missing or broken), ``auto`` still falls back to host memory, but
    says so: a warning in the log, and the reason in :attr:`SlabBackend.fallback` (status).
    """
    device = config.device if device_id is None else device_id
    kind = config.backend
    fallback: str | None = None
    if kind == "auto":
        problem = cuda_problem()
        if problem is None:
            kind = "cupy"
        else:
            kind = "host"
            if _torch_sees_cuda():
                fallback = f"torch sees CUDA but {problem}: the model cache is in host memory"
                log.warning("--backend auto: %s", fallback)
    if kind == "cupy":
        return CupyBackend(config.capacity, config.slab_bytes, device_id=device)
    backend: SlabBackend
    if kind == "host":
        backend = HostBackend(config.capacity, config.slab_bytes)
    elif kind == "strict":
        backend = StrictBackend(config.capacity, config.slab_bytes)
    elif kind == "capacity":
        backend = CapacityBackend(config.capacity, config.slab_bytes)
    else:
        raise ConfigError(f"unknown cache backend {kind!r}")
    backend.fallback = fallback
    return backend
