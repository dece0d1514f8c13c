"""Where a task's tensors live: its inputs on its model's device, its outputs on the host."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import sys
import threading
from collections.abc import Mapping
from typing import Any

from compass.workflow.choices import Decision

__all__ = ["device_of", "import_torch_soon", "moved", "to_host"]

log = logging.getLogger(__name__)


def import_torch_soon() -> threading.Thread | None:
    """Import torch in a thread of its own, unless it is imported already (None then).

    Importing torch takes seconds. A worker whose app does not import it serves as soon as it
    listens, and its first task does not pay the import: the task's own ``import torch`` waits
    for this one to finish rather than starting another."""
    if "torch" in sys.modules:
        return None
    thread = threading.Thread(target=_import_torch, name="compass-import-torch", daemon=True)
    thread.start()
    return thread


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except Exception:  # a broken install: each task that needs torch fails with the cause
        if not sys.is_finalizing():
            log.exception("importing torch failed; tasks that use it will fail")


def to_host(value: Any) -> Any:
    """``value`` with every torch tensor in it on the CPU (nothing to do without torch)."""
    torch = sys.modules.get("torch")
    return value if torch is None else moved(value, torch.device("cpu"))


def device_of(module: Any) -> Any:
    """The device of a torch module's first parameter or buffer (None: no module, no tensors)."""
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
