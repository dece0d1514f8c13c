"""The GPU model cache: a slab pool, eviction policy, memory backends and the async cache.

Backends: CuPy on a GPU, host memory elsewhere, ``strict`` (host memory that enforces the GPU's
rules, for tests) and ``capacity`` (slab accounting only, for emulated workers).

The sans-IO modules (``slab``, ``pool``, ``policy``: :class:`SlabPool`, :class:`CacheCore`, ...)
import neither asyncio nor torch, so the simulator reuses them unchanged. The async layer and
the backends are loaded on first use (``from compass.cache import ModelCache``), and import
torch only when a real model needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from compass.cache.policy import CacheCore, CacheStats, LoadPlan
from compass.cache.pool import SlabPool
from compass.cache.slab import TENSOR_ALIGN, SlabHandle, SlabLayout, TensorSlot

if TYPE_CHECKING:
    from compass.cache.backend import (
        CapacityBackend,
        CopyJob,
        CupyBackend,
        HostBackend,
        SlabBackend,
        StrictBackend,
        cuda_available,
        make_backend,
    )
    from compass.cache.models import ModelCache
    from compass.cache.weights import Model, TensorSpec

__all__ = [
    "TENSOR_ALIGN",
    "CacheCore",
    "CacheStats",
    "CapacityBackend",
    "CopyJob",
    "CupyBackend",
    "HostBackend",
    "LoadPlan",
    "Model",
    "ModelCache",
    "SlabBackend",
    "SlabHandle",
    "SlabLayout",
    "SlabPool",
    "StrictBackend",
    "TensorSlot",
    "TensorSpec",
    "cuda_available",
    "make_backend",
]

_LAZY = {
    "CapacityBackend": "compass.cache.backend",
    "CopyJob": "compass.cache.backend",
    "CupyBackend": "compass.cache.backend",
    "HostBackend": "compass.cache.backend",
    "SlabBackend": "compass.cache.backend",
    "StrictBackend": "compass.cache.backend",
    "cuda_available": "compass.cache.backend",
    "make_backend": "compass.cache.backend",
    "Model": "compass.cache.weights",
    "ModelCache": "compass.cache.models",
    "TensorSpec": "compass.cache.weights",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'compass.cache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
