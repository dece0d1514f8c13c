"""The worker's model cache: weights staged in host memory, copied into slabs, fenced.

:class:`ModelCache` is the async layer over :class:`~compass.cache.policy.CacheCore`: the
worker core decides every load (:meth:`CacheCore.begin_load` allocates its slabs) and
:meth:`ModelCache.fetch` carries it out: it keeps every real model's weights in host memory (one
exact-size buffer per model, laid out as its slabs, page-locked when the arena is on a GPU,
:meth:`~compass.cache.weights.Model.stage`), copies them into the slabs in a worker thread, and
builds a module whose parameters and buffers are views into those slabs
(:meth:`~compass.cache.weights.Model.assemble`). What a model is and how its bytes are laid out
lives in :mod:`compass.cache.weights`.

**Fences.** A module handed to a task (:meth:`ModelCache.module`) may have kernels reading its
slabs after the task's function returns; the task's thread runs in :meth:`ModelCache.compute`,
which synchronizes the thread's compute stream on the way out (the compute fence) before the
model can be unpinned, evicted and its slabs overwritten by the next load. A task that launches
work on streams of its own must synchronize them before it returns.

torch is imported only when a real model needs it: an emulated worker never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from compass.cache.backend import SlabBackend, make_backend
from compass.cache.policy import CacheCore, CacheStats
from compass.cache.pool import SlabPool
from compass.cache.slab import SlabHandle
from compass.cache.weights import Model
from compass.config import CacheConfig
from compass.errors import CacheError, CompassError, ConfigError
from compass.supervisor import log_failures

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["ModelCache"]

log = logging.getLogger(__name__)


class ModelCache:
    """The worker's model cache: an async layer over :class:`CacheCore` and a slab backend.

    Emulated models, and every model on the ``capacity`` backend, hold no bytes: a load waits
    ``size / emulated_h2d_bytes_per_s * time_scale`` seconds (no wait when no bandwidth is
    given). Real models are copied from host memory into slabs in a worker thread. Use it as
    ``async with ModelCache(...) as cache`` (stages every model's host weights first) or call
    :meth:`aclose` when done.
    """

    def __init__(
        self,
        models: Mapping[str, Model],
        config: CacheConfig,
        *,
        emulated_h2d_bytes_per_s: float | None = None,
        time_scale: float = 1.0,
        backend: SlabBackend | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ConfigError(f"time_scale must be > 0, got {time_scale}")
        if emulated_h2d_bytes_per_s is not None and emulated_h2d_bytes_per_s <= 0:
            raise ConfigError("emulated_h2d_bytes_per_s must be > 0")
        self._config = config
        self._backend = backend if backend is not None else make_backend(config)
        if self._backend.slab_bytes != config.slab_bytes:
            raise ConfigError(
                f"backend slabs are {self._backend.slab_bytes} B, config says {config.slab_bytes} B"
            )
        self._h2d = emulated_h2d_bytes_per_s
        self._time_scale = time_scale
        self._models = dict(models)
        for key, model in self._models.items():
            if key != model.name:
                raise ConfigError(f"model registered as {key!r} is named {model.name!r}")
        self._real = {
            name
            for name, model in self._models.items()
            if not model.is_emulated and self._backend.holds_bytes
        }
        pool = SlabPool(self._backend.capacity_bytes, config.slab_bytes)
        self._core = CacheCore(
            pool,
            {
                name: model.size_bytes if model.is_emulated else model.layout(config.slab_bytes)
                for name, model in self._models.items()
            },
        )
        #: each real model's weights in one host buffer laid out as its slabs
        self._host: dict[str, torch.Tensor] = {}
        self._stage_lock = threading.Lock()
        self._modules: dict[str, nn.Module] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- views ------------------------------------------------------------------------------

    @property
    def core(self) -> CacheCore:
        """The sans-IO core (read it; change the cache through this class)."""
        return self._core

    @property
    def backend(self) -> SlabBackend:
        """Where the slabs live."""
        return self._backend

    @property
    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        return self._core.stats

    def resident(self) -> frozenset[str]:
        """Models loaded and usable."""
        return self._core.resident()

    def loading(self) -> frozenset[str]:
        """Models being loaded."""
        return self._core.loading()

    def free_bytes(self) -> int:
        """Bytes in free slabs."""
        return self._core.free_bytes()

    def capacity_bytes(self) -> int:
        """Bytes the cache holds (whole slabs)."""
        return self._core.capacity_bytes()

    def size_bytes(self, name: str) -> int:
        """Bytes a load of ``name`` copies."""
        return self._core.size_bytes(name)

    def staged_bytes(self) -> int:
        """Host bytes holding staged weights (page-locked on a GPU backend)."""
        return sum(buffer.numel() for buffer in list(self._host.values()))

    def snapshot(self) -> dict[str, Any]:
        """A msgpack-able picture: backend and device (and why ``auto`` fell back to host
        memory, if it did), resident and loading models, pins, bytes, counters."""
        return {
            **self._backend.describe(),
            "staged_bytes": self.staged_bytes(),
            "resident": sorted(self._core.resident()),
            "loading": sorted(self._core.loading()),
            "pinned": {
                name: self._core.pins(name)
                for name in sorted(self._core.resident())
                if self._core.pins(name)
            },
            "free_bytes": self.free_bytes(),
            "capacity_bytes": self.capacity_bytes(),
            "slab_bytes": self._config.slab_bytes,
            "stats": self._core.stats.to_dict(),
        }

    # -- lifecycle --------------------------------------------------------------------------

    async def prepare(self) -> dict[str, str]:
        """Stage every real model's weights in host memory (in a thread); returns each model's
        weights digest (:meth:`digest`), which peers compare to tell versions apart."""
        self._check_open()
        for name in sorted(self._real):
            await asyncio.to_thread(self._staged, name)
        return {name: await asyncio.to_thread(self.digest, name) for name in sorted(self._models)}

    def digest(self, name: str) -> str:
        """SHA-256 of model ``name``'s staged weights, tensor by tensor with their keys (the
        bytes a task runs with, from its weights file or loader; the padding between tensors
        is left out). A model whose builder makes its weights (no file, no loader) is hashed by
        its builder and its tensors' keys, shapes and types: a random initialization differs in
        every process, so workers of one app would never agree (seed it where it matters). One
        that holds no bytes (emulated, or on a capacity-only backend): by its size."""
        hasher = hashlib.sha256()
        model = self._models[name]
        if name not in self._real:
            hasher.update(f"{name}: {self._core.size_bytes(name)} bytes, not held".encode())
            return hasher.hexdigest()
        if model.weights is None and model.loader is None:
            build = model.build
            where = f"{getattr(build, '__module__', '')}.{getattr(build, '__qualname__', '')}"
            specs = [(s.key, str(s.dtype), s.shape) for s in model.tensor_specs()]
            hasher.update(f"{name} built by {where}: {specs}".encode())
            return hasher.hexdigest()
        host, layout = self._staged(name), self._core.layout(name)
        starts = layout.staging()
        for slot in sorted(layout.slots, key=lambda slot: slot.key):
            hasher.update(slot.key.encode() + b"\0")
            if slot.nbytes:
                at = starts[slot.group][0] + slot.offset
                hasher.update(host[at : at + slot.nbytes].numpy().data)
        return hasher.hexdigest()

    async def __aenter__(self) -> Self:
        await self.prepare()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Refuse new loads, finish those under way, free memory."""
        self._closed = True
        while self._tasks:
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
            log_failures(results, log, "a model load at close")
        self._modules.clear()
        self._host.clear()
        self._backend.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CacheError("the model cache is closed")

    async def _copy(self, name: str, handle: SlabHandle) -> float:
        """Fill ``name``'s slabs: copy a real model's weights in a thread and build its module,
        or wait the emulated load time. Returns the seconds the copy took."""
        if name not in self._real:
            seconds = self._core.size_bytes(name) / self._h2d if self._h2d else 0.0
            await asyncio.sleep(seconds * self._time_scale)
            return seconds
        work = asyncio.ensure_future(asyncio.to_thread(self._copy_and_build, name, handle))
        try:
            seconds, module = await asyncio.shield(work)
        except asyncio.CancelledError:
            # the copy thread cannot be interrupted: its slabs are free only once it stops
            work.add_done_callback(_retrieve)
            raise
        self._modules[name] = module
        return seconds

    def _loaded(self, name: str, seconds: float) -> None:
        size = self._core.size_bytes(name)
        log.info("loaded model %s: %d bytes in %.3f s", name, size, seconds,
                 extra={"model": name, "bytes": size, "seconds": seconds})  # fmt: skip

    # -- loads ---------------------------------------------------------------------------------

    def fetch(
        self,
        name: str,
        evicted: Sequence[str],
        done: Callable[[str, float | CompassError], None],
    ) -> None:
        """Carry out a load the worker core began on :attr:`core` (its slabs allocated,
        ``evicted`` gone to make room): copy the weights, then ``done(name, seconds)`` on the
        loop, or ``done(name, error)`` when the load failed (the core frees the slabs)."""
        self._check_open()
        self._drop_modules(evicted, name)
        handle = self._core.handle(name)
        if handle is None:
            raise CacheError(f"model {name!r} has no load under way to carry out")
        task = asyncio.get_running_loop().create_task(
            self._fetch(name, handle, done), name=f"compass-cache-load-{name}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fetch(
        self, name: str, handle: SlabHandle, done: Callable[[str, float | CompassError], None]
    ) -> None:
        try:
            seconds = await self._copy(name, handle)
        except asyncio.CancelledError:
            raise  # the worker is stopping: nobody waits for this load
        except Exception as exc:
            self._modules.pop(name, None)
            log.warning("loading model %s failed: %s", name, exc)
            done(name, _load_error(name, exc))
            return
        self._loaded(name, seconds)
        done(name, seconds)

    def module(self, name: str) -> nn.Module | None:
        """The module of a resident real model for a task that starts now (None for an
        emulated one). Its slabs count as read by that task until its compute fence: run the
        task in :meth:`compute`, which passes the fence on the way out."""
        module = self._modules.get(name)
        if module is not None:
            self._backend.open_reads(name, self._ranges(name))
        return module

    @contextlib.contextmanager
    def compute(self, name: str | None) -> Iterator[None]:
        """In a task's thread, around its code: its kernels go on the thread's compute stream,
        and on the way out (raised or not) the stream is synchronized, the compute fence, and
        the reads the task's :meth:`module` opened are closed. Only then may the model be
        unpinned: a load may then overwrite its slabs. The time spent inside is the task's
        time on the device, not only the time to launch its kernels."""
        backend = self._backend
        with backend.compute_stream():
            try:
                yield
            finally:
                backend.synchronize_compute()
                # reads were opened when the task took the module (none for an emulated model,
                # nor once the cache closed under a task still running)
                if name is not None and backend.reads_in_flight().get(name):
                    backend.close_reads(name)

    def _ranges(self, name: str) -> list[tuple[int, int]]:
        """``(offset, nbytes)`` of each slab run ``name`` holds."""
        handle = self._core.handle(name)
        if handle is None:
            return []
        slab = self._config.slab_bytes
        return [(first * slab, length * slab) for first, length in handle.runs]

    def _drop_modules(self, evicted: Sequence[str], loading: str) -> None:
        """Evicted models' modules go: their slabs now belong to ``loading``."""
        for victim in evicted:
            self._modules.pop(victim, None)
            size = self._core.size_bytes(victim)
            log.info("evicted model %s (%d bytes) to load %s", victim, size, loading,
                     extra={"model": victim, "bytes": size})  # fmt: skip

    def _staged(self, name: str) -> torch.Tensor:
        with self._stage_lock:
            host = self._host.get(name)
            if host is None:
                layout = self._core.layout(name)
                host = self._models[name].stage(layout, self._backend.host_buffer)
                self._host[name] = host
            return host

    def _copy_and_build(self, name: str, handle: SlabHandle) -> tuple[float, nn.Module]:
        """In a worker thread: copy the staged weights into the slabs (one copy per slab
        group), wait for the copies, build the module on views of the slabs."""
        model = self._models[name]
        host = self._staged(name)
        layout = self._core.layout(name)
        slab_bytes = self._config.slab_bytes
        writes = [
            (handle.runs[group][0] * slab_bytes, host[start : start + extent])
            for group, (start, extent) in enumerate(layout.staging())
        ]
        job = self._backend.copy_in(writes, urgent=not self._core.is_prefetch(name))
        seconds = job.wait()  # the bytes are in the slabs only now
        slots = {slot.key: slot for slot in layout.slots}
        # a zero-byte tensor is an empty view at the model's first slab (or the arena's start)
        empty_at = handle.runs[0][0] * slab_bytes if handle.runs else 0
        views: dict[str, torch.Tensor] = {}
        for spec in model.tensor_specs():
            slot = slots[spec.key]
            offset = handle.byte_offset(slot, slab_bytes) if slot.nbytes else empty_at
            views[spec.key] = self._backend.tensor_view(
                offset, spec.dtype, spec.shape, spec.nbytes, spec.stride
            )
        return seconds, model.assemble(views)


def _load_error(name: str, exc: Exception) -> CompassError:
    """A failed load as compass's error (a CompassError keeps its type)."""
    if isinstance(exc, CompassError):
        return exc
    return CacheError(f"loading model {name!r} failed: {exc!r}")


def _retrieve(done: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned copy's outcome, so asyncio does not report it as lost."""
    if not done.cancelled():
        done.exception()
