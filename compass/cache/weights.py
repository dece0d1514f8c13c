"""Model declarations and their bytes: what a model is, measured, staged and assembled.

A :class:`Model` is a name, a builder returning a ``torch.nn.Module`` and optional weights (a
safetensors file, or any checkpoint through a loader); or, for emulated mode, just a name and a
size. Its tensors are measured once on the meta device (:meth:`Model.tensor_specs`, no memory
allocated) and packed into slabs (:meth:`Model.layout`); :meth:`Model.stage` copies its weights
into one host buffer laid out as those slabs, and :meth:`Model.assemble` builds a module whose
parameters and buffers are views into slab memory. Every dtype and dense layout is kept byte for
byte; a narrower safetensors checkpoint dtype (bf16 in an fp32 module) is kept, not cast up.

The model cache (:class:`~compass.cache.models.ModelCache`) moves those bytes; this module
knows what they are. torch is imported only when a real model needs it: an emulated worker
never imports it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compass.cache.slab import SlabLayout
from compass.errors import CacheError, ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["KeyMap", "Model", "TensorSpec"]

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

    def stage(self, layout: SlabLayout, buffer_for: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """Build on the CPU, load the weights, and copy every tensor into one host buffer of
        ``buffer_for(layout.staging_bytes)``, laid out as the slabs will be
        (:meth:`SlabLayout.staging`): a load is then one copy per slab group. The model cache
        stages each real model once, in host memory."""
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

    def assemble(self, views: Mapping[str, torch.Tensor]) -> nn.Module:
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
