"""Where a task's tensors live: its inputs on its model's device, its outputs on the host."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Mapping
from typing import Any

from compass.workflow.choices import Decision

__all__ = ["device_of", "moved", "to_host"]


def to_host(value: Any) -> Any:
    """``value`` with every torch tensor in it on the CPU (nothing to do without torch)."""
    torch = sys.modules.get("torch")
    return value if torch is None else moved(value, torch.device("cpu"))


def device_of(module: Any) -> Any:
    """The device of a torch module's first parameter or buffer (None: no module, no tensors)."""
    if module is None:  # a model-less task: nothing to ask torch (which it may never import)
        return None
    from torch import nn

    if not isinstance(module, nn.Module):
        return None
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    return None if first is None else first.device


def moved(value: Any, device: Any) -> Any:
    """``value`` with every torch tensor in it (in dicts, lists and tuples too) on ``device``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return {key: moved(item, device) for key, item in value.items()}
    if isinstance(value, list):
        return [moved(item, device) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):  # not a namedtuple
        return tuple(moved(item, device) for item in value)
    if isinstance(value, Decision):  # a run-time choice: its output and items move
        items = None if value.items is None else moved(value.items, device)
        return dataclasses.replace(value, value=moved(value.value, device), items=items)
    return value
