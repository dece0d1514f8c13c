"""Models and the worker's model cache: weights loaded into slabs, leased to tasks, prefetched.

A :class:`Model` is a name, a builder returning a ``torch.nn.Module`` and optional safetensors
weights; or, for emulated mode, just a name and a size. :class:`ModelCache` is the async layer
over :class:`~compass.cache.policy.CacheCore`: it keeps every model's weights in host memory
(one exact-size buffer per model, laid out as its slabs, page-locked when the arena is on a
GPU), copies them into slabs in a worker thread, and builds a module whose parameters and
buffers are views into those slabs.

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
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from compass.cache.backend import SlabBackend, make_backend
from compass.cache.policy import READY, WAIT, CacheCore, CacheStats, LoadPlan
from compass.cache.pool import SlabPool
from compass.cache.slab import SlabHandle, SlabLayout
from compass.config import CacheConfig
from compass.errors import CacheError, CompassError, ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["Lease", "Model", "ModelCache", "TensorSpec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One parameter or buffer of a model, under its first name in ``named_modules`` order.

    ``stride`` is kept for a dense layout other than the contiguous one (channels_last, a
    transposed weight); ``None`` means contiguous.
    """

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    stride: tuple[int, ...] | None = None


def _dense_stride(shape: Sequence[int], stride: Sequence[int]) -> tuple[int, ...] | None:
    """``stride`` if it lays ``shape`` out densely (every element once, no gaps) and is not the
    contiguous layout; ``None`` (contiguous) otherwise."""
    contiguous: list[int] = []
    step = 1
    for size in reversed(shape):
        contiguous.append(step)
        step *= max(size, 1)
    if tuple(stride) == tuple(reversed(contiguous)):
        return None
    expected = 1
    for size, step in sorted(
        ((size, step) for size, step in zip(shape, stride, strict=True) if size != 1),
        key=lambda pair: (pair[1], pair[0]),
    ):
        if step != expected:
            return None  # overlapping or with gaps: staged contiguous
        expected *= size
    return tuple(stride)


#: safetensors header dtype names -> torch dtype names (getattr(torch, name))
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "C64": "complex64",
}  # fmt: skip


def _safetensors_dtypes(path: Path) -> dict[str, str]:
    """Each tensor's dtype name in a safetensors file, read from its header alone."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= 100 * 2**20:
            raise ValueError(f"header of {size} B")
        header = json.loads(f.read(size))
    return {
        key: _SAFETENSORS_DTYPES.get(entry.get("dtype", ""), "")
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict)
    }


@dataclass(frozen=True, slots=True)
class _Binding:
    """Where a tensor goes when a module is assembled: ``module_path``'s ``leaf`` slot."""

    module_path: str
    leaf: str
    is_parameter: bool
    key: str


def _collect(module: nn.Module) -> tuple[list[_Binding], dict[str, torch.Tensor]]:
    """Every parameter and buffer slot of ``module``; tied tensors share one key."""
    keys: dict[int, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    bindings: list[_Binding] = []
    for path, sub in module.named_modules(remove_duplicate=False):
        slots: list[tuple[str, torch.Tensor | None, bool]] = [
            *((leaf, p, True) for leaf, p in sub._parameters.items()),
            *((leaf, b, False) for leaf, b in sub._buffers.items()),
        ]
        for leaf, tensor, is_parameter in slots:
            if tensor is None:
                continue
            key = keys.get(id(tensor))
            if key is None:
                key = f"{path}.{leaf}" if path else leaf
                keys[id(tensor)] = key
                tensors[key] = tensor
            bindings.append(_Binding(path, leaf, is_parameter, key))
    return bindings, tensors


def _narrower_float(narrow: torch.dtype, wide: torch.dtype) -> bool:
    """Whether ``narrow`` is a floating dtype that ``wide``, a wider floating dtype, holds
    exactly (bf16, fp16 and fp8 in fp32)."""
    return (
        narrow.is_floating_point
        and wide.is_floating_point
        and narrow.itemsize < wide.itemsize
        and wide.itemsize >= 4
    )


def _typed(raw: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """``raw`` bytes as the tensor ``spec`` describes (its dtype, shape and dense layout)."""
    flat = raw.view(spec.dtype)
    if spec.stride is None:
        return flat.reshape(spec.shape)
    return flat.as_strided(spec.shape, spec.stride)


#: renames a checkpoint's keys to the module's: a mapping (unlisted keys pass unchanged) or a
#: function; ``None`` for a key drops it
KeyMap = Mapping[str, str | None] | Callable[[str], str | None]


class Model:
    """A model declaration.

    ``build`` returns the module (weights initialized by the builder itself unless ``weights``
    or ``loader`` give its state). ``weights`` is a path (a relative one resolves against
    ``root``, else the current directory, when the model is declared); by default it names a
    safetensors file. ``loader`` reads a checkpoint another way: it is called as
    ``loader(weights)`` (``loader()`` when no weights are given) and returns a state dict, or a
    module whose ``state_dict()`` is taken. ``keys`` renames or drops the checkpoint's keys
    before they are loaded. ``strict=False`` tolerates keys the module lacks (``position_ids`` of
    older checkpoints, a pooler left out) and tensors the checkpoint lacks (they keep what the
    builder made); both are logged at debug. ``size_bytes`` is measured from the module's
    parameters and buffers; give it only for an emulated model (no builder).

    A safetensors checkpoint whose floating-point tensors are narrower than the builder's (a
    bf16 checkpoint, an fp32 module) keeps its dtype in the slabs rather than being cast up to
    twice the bytes: the task casts its inputs to the model's dtype. Dense layouts the builder
    chose (channels_last, a transposed weight) are kept.
    """

    def __init__(
        self,
        name: str,
        build: Callable[[], nn.Module] | None = None,
        weights: str | Path | None = None,
        *,
        size_bytes: int | None = None,
        loader: Callable[..., Any] | None = None,
        keys: KeyMap | None = None,
        strict: bool = True,
        root: str | Path | None = None,
    ) -> None:
        if not name:
            raise ConfigError("a model needs a non-empty name")
        if build is None:
            if size_bytes is None or size_bytes < 0:
                raise ConfigError(f"emulated model {name!r} needs size_bytes >= 0")
            if weights is not None or loader is not None:
                raise ConfigError(f"model {name!r} has weights but no builder to load them into")
        elif size_bytes is not None:
            raise ConfigError(
                f"model {name!r}: size_bytes is measured from the builder's module; "
                "give it only for emulated models"
            )
        if loader is not None and not callable(loader):
            raise ConfigError(f"model {name!r}: loader must be callable, got {loader!r}")
        if keys is not None and not (isinstance(keys, Mapping) or callable(keys)):
            raise ConfigError(
                f"model {name!r}: keys must be a mapping or a function of a key, got {keys!r}"
            )
        if not isinstance(strict, bool):
            raise ConfigError(f"model {name!r}: strict must be True or False, got {strict!r}")
        self.name = name
        self.build = build
        self.weights: Path | None = None
        if weights is not None:
            if not isinstance(weights, str | Path) or not str(weights):
                raise ConfigError(f"model {name!r}: weights must be a path, got {weights!r}")
            path = Path(weights).expanduser()
            # resolved now: a worker's working directory is wherever it was started from
            self.weights = path if path.is_absolute() else Path(root or Path.cwd()) / path
        self.loader = loader
        self.keys = keys
        self.strict = strict
        self._size_bytes = size_bytes
        self._structure: tuple[list[_Binding], tuple[TensorSpec, ...]] | None = None
        self._meta_build = True

    @classmethod
    def emulated(cls, name: str, size_bytes: int) -> Model:
        """A model known only by name and size (emulated mode, workload specs)."""
        return cls(name, size_bytes=size_bytes)

    @property
    def is_emulated(self) -> bool:
        """True when there is no builder: loads only take time, no module exists."""
        return self.build is None

    @property
    def size_bytes(self) -> int:
        """Bytes of parameters and buffers (tied tensors counted once)."""
        if self._size_bytes is None:
            self._size_bytes = sum(spec.nbytes for spec in self.tensor_specs())
        return self._size_bytes

    def tensor_specs(self) -> tuple[TensorSpec, ...]:
        """The module's tensors, measured once on the meta device (no memory is allocated)."""
        return self._inspect()[1]

    def layout(self, slab_bytes: int) -> SlabLayout:
        """How this model packs into slabs of ``slab_bytes``."""
        if self.is_emulated:
            return SlabLayout.uniform(self.size_bytes, slab_bytes)
        return SlabLayout.pack(((s.key, s.nbytes) for s in self.tensor_specs()), slab_bytes)

    def _inspect(self) -> tuple[list[_Binding], tuple[TensorSpec, ...]]:
        if self._structure is None:
            import torch

            bindings, tensors = _collect(self._skeleton())
            stored = self._checkpoint_dtypes()
            specs: list[TensorSpec] = []
            narrowed: dict[str, str] = {}
            for key, t in tensors.items():
                dtype = t.dtype
                kept = stored.get(key)
                if kept is not None and kept != dtype and _narrower_float(kept, dtype):
                    # keep the checkpoint's precision: load_state_dict would cast a bf16
                    # checkpoint into fp32 slabs (twice the bytes); fp32 holds every bf16,
                    # fp16 and fp8 value exactly, so staging casts back without loss
                    narrowed[key] = f"{kept} (built as {dtype})"
                    dtype = kept
                size = torch.empty((), dtype=dtype).element_size()
                specs.append(
                    TensorSpec(
                        key, dtype, tuple(t.shape), t.numel() * size,
                        _dense_stride(tuple(t.shape), tuple(t.stride())),
                    )
                )  # fmt: skip
            if narrowed:
                log.info(
                    "model %s keeps its checkpoint's narrower dtype in %d tensor(s) (the task's "
                    "inputs must match): %s", self.name, len(narrowed), narrowed,
                )  # fmt: skip
            self._structure = (bindings, tuple(specs))
        return self._structure

    def _checkpoint_dtypes(self) -> dict[str, torch.dtype]:
        """The dtype of each tensor in a safetensors weights file, under the module's keys
        (empty for a loader, or a file whose header cannot be read: it fails later, clearly)."""
        import torch

        if self.weights is None or self.loader is not None:
            return {}
        try:
            names = _safetensors_dtypes(self.weights)
        except (OSError, ValueError):
            return {}
        dtypes: dict[str, torch.dtype] = {}
        for key, name in names.items():
            target = self._target_key(key)
            if target is not None and name:
                dtypes[target] = getattr(torch, name)
        return dtypes

    def _target_key(self, key: str) -> str | None:
        """The module key a checkpoint key maps to (``keys``), or None when dropped."""
        if self.keys is None:
            return key
        if isinstance(self.keys, Mapping):
            return self.keys.get(key, key)
        return self.keys(key)

    def _skeleton(self) -> nn.Module:
        """A fresh module whose tensors will be replaced: built on the meta device when the
        builder allows it, so a load allocates no memory besides the slabs."""
        import torch

        if self.build is None:
            raise CacheError(f"model {self.name!r} is emulated and has no module")
        if self._meta_build:
            try:
                with torch.device("meta"):
                    return self.build()
            except Exception:  # a builder that insists on real tensors; fall back to the CPU
                self._meta_build = False
        return self.build()

    def _stage(self, layout: SlabLayout, buffer_for: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """Build on the CPU, load the weights, and copy every tensor into one host buffer of
        ``buffer_for(layout.staging_bytes)``, laid out as the slabs will be
        (:meth:`SlabLayout.staging`): a load is then one copy per slab group."""
        if self.build is None:
            raise CacheError(f"model {self.name!r} is emulated and has no weights")
        module = self.build()
        if self.weights is not None or self.loader is not None:
            self._load_state(module)
        _, tensors = _collect(module)
        del module
        expected = {spec.key: spec for spec in self.tensor_specs()}
        if tensors.keys() != expected.keys():
            raise CacheError(f"model {self.name!r}: the builder's tensors changed between builds")
        starts = layout.staging()
        buffer = buffer_for(layout.staging_bytes)
        for slot in layout.slots:
            tensor = tensors.pop(slot.key)
            spec = expected[slot.key]
            if spec.shape != tuple(tensor.shape) or not (
                spec.dtype == tensor.dtype or _narrower_float(spec.dtype, tensor.dtype)
            ):
                raise CacheError(
                    f"model {self.name!r}: the builder made a different module on the CPU than "
                    f"on the meta device (tensor {slot.key!r}); builders must be deterministic"
                )
            if slot.nbytes:
                at = starts[slot.group][0] + slot.offset
                target = _typed(buffer[at : at + slot.nbytes], spec)
                target.copy_(tensor.detach())
            del tensor  # the staged bytes replace it: at most one tensor is held twice
        return buffer

    def _read_state(self) -> Mapping[str, Any]:
        """The checkpoint as a state dict: from ``loader`` or the safetensors file."""
        from torch import nn

        where = self.weights if self.weights is not None else "its loader"
        try:
            if self.loader is not None:
                got = self.loader() if self.weights is None else self.loader(self.weights)
            else:
                from safetensors.torch import load_file

                got = load_file(str(self.weights))
        except Exception as exc:  # safetensors and user loaders raise their own error types
            raise CacheError(
                f"cannot read weights of model {self.name!r} from {where}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(got, nn.Module):
            got = got.state_dict()
        if not isinstance(got, Mapping):
            raise CacheError(
                f"the loader of model {self.name!r} returned {type(got).__name__}, "
                "not a state dict or a torch module"
            )
        return got

    def _load_state(self, module: nn.Module) -> None:
        """Load the checkpoint into ``module``, its keys mapped by ``keys``, as strict as asked."""
        state: dict[str, Any] = {}
        for key, value in self._read_state().items():
            target = self._target_key(key)
            if target is None:
                continue
            if target in state:
                raise CacheError(
                    f"model {self.name!r}: keys maps two checkpoint keys to {target!r}"
                )
            state[target] = value
        where = self.weights if self.weights is not None else "its loader"
        self._warn_cast_up(module, state, where)
        try:
            result = module.load_state_dict(state, strict=self.strict)
        except RuntimeError as exc:
            detail = " ".join(str(exc).split())  # torch's message spans lines
            hint = "" if not self.strict else " (strict=False tolerates them; keys= renames them)"
            raise CacheError(
                f"weights from {where} do not fit model {self.name!r}: {detail}{hint}"
            ) from exc
        if result.missing_keys or result.unexpected_keys:
            log.debug(
                "model %s: weights from %s left out %d key(s) %s; the module lacks %d key(s) %s",
                self.name,
                where,
                len(result.missing_keys),
                result.missing_keys,
                len(result.unexpected_keys),
                result.unexpected_keys,
            )

    def _warn_cast_up(self, module: nn.Module, state: Mapping[str, Any], where: object) -> None:
        """Say so when checkpoint tensors narrower than the builder's will be cast up (a loader
        whose dtypes are not known before staging): the cache then holds more bytes."""
        import torch

        current = module.state_dict()
        specs = {spec.key: spec for spec in self.tensor_specs()}
        cast = sorted(
            key
            for key, value in state.items()
            if isinstance(value, torch.Tensor)
            and key in current
            and key in specs
            and specs[key].dtype != value.dtype
            and _narrower_float(value.dtype, current[key].dtype)
        )
        if cast:
            log.warning(
                "model %s: %d tensor(s) from %s are narrower than the builder's and are cast up "
                "(more bytes in the cache), e.g. %s %s -> %s; build the module in the "
                "checkpoint's dtype, or give a safetensors file (its dtypes are kept)",
                self.name, len(cast), where, cast[0], state[cast[0]].dtype, current[cast[0]].dtype,
            )  # fmt: skip

    def _assemble(self, views: Mapping[str, torch.Tensor]) -> nn.Module:
        """A module in eval mode whose parameters and buffers are ``views`` (no copies)."""
        from torch import nn

        bindings, _ = self._inspect()
        module = self._skeleton()
        parameters: dict[str, nn.Parameter] = {}
        for binding in bindings:
            owner = module.get_submodule(binding.module_path)
            view = views[binding.key]
            if binding.is_parameter:
                parameter = parameters.get(binding.key)
                if parameter is None:
                    parameter = parameters[binding.key] = nn.Parameter(view, requires_grad=False)
                owner._parameters[binding.leaf] = parameter
            else:
                owner._buffers[binding.leaf] = view
        return module.eval()

    def __repr__(self) -> str:
        kind = "emulated" if self.is_emulated else "real"
        return f"Model({self.name!r}, {kind})"


class Lease:
    """A pinned model, handed out by :meth:`ModelCache.ensure`.

    The model cannot be evicted until :meth:`release` (idempotent; also on leaving a ``with``
    block). ``module`` raises once released: its tensors may then belong to another model.
    """

    __slots__ = ("_module", "_release", "_released", "hit", "name")

    def __init__(
        self, name: str, hit: bool, module: nn.Module | None, release: Callable[[], None]
    ) -> None:
        self.name = name
        #: whether the model was resident when it was asked for
        self.hit = hit
        self._module = module
        self._release = release
        self._released = False

    @property
    def module(self) -> nn.Module | None:
        """The torch module (None for an emulated model)."""
        if self._released:
            raise CacheError(f"lease on model {self.name!r} was released; ensure it again")
        return self._module

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released

    def release(self) -> None:
        """Unpin the model. Calling it again does nothing."""
        if not self._released:
            self._released = True
            self._module = None
            self._release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"Lease({self.name!r}, hit={self.hit}, {state})"


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
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._prefetch: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._closed = False
        #: called whenever a load starts or ends (what resident() / loading() report changed)
        self.on_change: Callable[[], None] | None = None

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

    async def prepare(self) -> None:
        """Stage every real model's weights in host memory (in a thread)."""
        self._check_open()
        for name in sorted(self._real):
            await asyncio.to_thread(self._staged, name)

    async def __aenter__(self) -> ModelCache:
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
        """Refuse new requests, wake waiters (they raise), finish loads under way, free memory."""
        self._closed = True
        self._notify()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._modules.clear()
        self._host.clear()
        self._backend.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CacheError("the model cache is closed")

    # -- requests ---------------------------------------------------------------------------

    async def ensure(self, name: str, upcoming: Sequence[str] = ()) -> Lease:
        """Make ``name`` resident and return it pinned.

        ``upcoming`` lists the models the local queue needs after this task, in order; it
        steers eviction. A load already under way (a prefetch, another lane) is shared. When
        pinned or loading models hold the slabs it needs, this waits until they are released.
        Raises ModelTooLarge when the model can never fit.
        """
        self._check_open()
        hit = self._core.record_request(name)
        waited = False
        while True:
            self._check_open()
            step = self._core.acquire(name, upcoming)
            if step == READY:
                return self._lease(name, hit)
            if step == WAIT:
                if not waited:
                    self._core.record_wait()
                    waited = True
                await self._changed.wait()
                continue
            if isinstance(step, LoadPlan):
                self._start_load(name, step, prefetch=False)
                self._core.pin(name)
            try:
                await asyncio.shield(self._inflight[name])
            except BaseException:
                self._unpin(name)
                raise
            return self._lease(name, hit)

    def prefetch(self, upcoming: Sequence[str]) -> None:
        """Start loading the best prefetch candidate of the queue ``upcoming``, if any.

        At most one prefetch runs at a time; it never evicts a model needed sooner than the
        one it loads. Needs a running event loop.
        """
        if self._closed or (self._prefetch is not None and not self._prefetch.done()):
            return
        candidate = self._core.prefetch_candidate(upcoming, self._config.prefetch_depth)
        if candidate is not None:
            name, plan = candidate
            self._prefetch = self._start_load(name, plan, prefetch=True)

    def warm(self, wanted: Sequence[str]) -> None:
        """Load the first model of ``wanted`` that fits in free slabs (never evicts anything).

        For an idle worker: it fills unused cache with models the cluster is short of. Shares
        the single prefetch slot, so it never competes with a prefetch for bandwidth.
        """
        if self._closed or (self._prefetch is not None and not self._prefetch.done()):
            return
        candidate = self._core.warm_candidate(wanted)
        if candidate is not None:
            name, plan = candidate
            self._prefetch = self._start_load(name, plan, prefetch=True)

    def _lease(self, name: str, hit: bool) -> Lease:
        module = self.module(name)
        if module is None:
            return Lease(name, hit, None, lambda: self._unpin(name))

        def release() -> None:
            # the lease holder's kernels may still read the slabs: fence before the unpin
            self._backend.synchronize_compute()
            self._backend.close_reads(name)
            self._unpin(name)

        return Lease(name, hit, module, release)

    def _unpin(self, name: str) -> None:
        if self._core.unpin(name) == 0:
            self._notify()

    def _notify(self) -> None:
        # wake every waiter; each re-checks, and a fresh event catches later changes
        self._changed.set()
        self._changed = asyncio.Event()
        if self.on_change is not None:
            self.on_change()

    # -- loading ----------------------------------------------------------------------------

    def _start_load(self, name: str, plan: LoadPlan, *, prefetch: bool) -> asyncio.Task[None]:
        handle = self._core.begin_load(name, plan, prefetch=prefetch)
        self._drop_modules(plan.evict, name)
        task = asyncio.get_running_loop().create_task(
            self._load(name, handle), name=f"compass-cache-load-{name}"
        )
        self._inflight[name] = task
        self._tasks.add(task)
        task.add_done_callback(self._load_done)
        if self.on_change is not None:
            self.on_change()
        return task

    def _load_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # retrieved here too, so a failed prefetch is never "lost"
        if error is not None and task is self._prefetch:
            log.warning("prefetch failed: %s", error)

    async def _load(self, name: str, handle: SlabHandle) -> None:
        try:
            seconds = await self._copy(name, handle, abandoned=lambda: self._abort(name))
        except asyncio.CancelledError:
            if name not in self._real:
                self._abort(name)  # a real copy is aborted once its thread is done
            raise
        except CompassError:
            self._abort(name)
            raise
        except Exception as exc:
            self._abort(name)
            raise _load_error(name, exc) from exc
        self._core.finish_load(name, seconds)
        self._loaded(name, seconds)
        del self._inflight[name]
        self._notify()

    async def _copy(
        self, name: str, handle: SlabHandle, abandoned: Callable[[], None] | None = None
    ) -> float:
        """Fill ``name``'s slabs: copy a real model's weights in a thread and build its module,
        or wait the emulated load time. Returns the seconds the copy took. Cancelled while a
        thread copies, ``abandoned`` is called once that thread is done with the slabs."""
        if name not in self._real:
            seconds = self._core.size_bytes(name) / self._h2d if self._h2d else 0.0
            await asyncio.sleep(seconds * self._time_scale)
            return seconds
        work = asyncio.ensure_future(asyncio.to_thread(self._copy_and_build, name, handle))
        try:
            seconds, module = await asyncio.shield(work)
        except asyncio.CancelledError:
            # the copy thread cannot be interrupted: its slabs are free only once it stops
            work.add_done_callback(lambda done: self._thread_done(done, abandoned))
            raise
        self._modules[name] = module
        return seconds

    def _loaded(self, name: str, seconds: float) -> None:
        size = self._core.size_bytes(name)
        log.info("loaded model %s: %d bytes in %.3f s", name, size, seconds,
                 extra={"model": name, "bytes": size, "seconds": seconds})  # fmt: skip

    # -- loads the worker core decides ------------------------------------------------------

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

    @staticmethod
    def _thread_done(done: asyncio.Future[Any], abandoned: Callable[[], None] | None) -> None:
        if not done.cancelled():
            done.exception()  # retrieved so asyncio does not report it as lost
        if abandoned is not None:
            abandoned()

    def _abort(self, name: str) -> None:
        self._core.abort_load(name)
        self._modules.pop(name, None)
        self._inflight.pop(name, None)
        self._notify()

    def _staged(self, name: str) -> torch.Tensor:
        with self._stage_lock:
            host = self._host.get(name)
            if host is None:
                layout = self._core.layout(name)
                host = self._models[name]._stage(layout, self._backend.host_buffer)
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
        return seconds, model._assemble(views)


def _load_error(name: str, exc: Exception) -> CompassError:
    """A failed load as compass's error (a CompassError keeps its type)."""
    if isinstance(exc, CompassError):
        return exc
    return CacheError(f"loading model {name!r} failed: {exc!r}")
