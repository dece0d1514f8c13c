"""``compass submit``'s inputs, each ``-i`` made into the value its task gets.

- ``NAME=VALUE``: VALUE as JSON if it parses (``41``, ``[1, 2]``, ``'"text"'``), else the string;
- ``NAME=@PATH``: a tensor or array from a file: ``.npy`` a numpy array, ``.pt`` a torch tensor
  (loaded with ``weights_only``: no pickled code runs), ``.safetensors`` a torch tensor (the
  file's only one, or the one named NAME);
- ``NAME:DTYPE=VALUE``: a JSON number or list as a torch tensor of DTYPE (``float32``,
  ``int64``, ``bfloat16``, ...), or with ``numpy.DTYPE`` a numpy array: what a task written
  ``model(x.float())`` needs, and a list is not.

Anything wrong is a :class:`~compass.errors.ConfigError` that names the ``-i`` it is about, a
usage mistake the command reports in one line. torch is imported only for an input that is a
torch tensor.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from compass.errors import ConfigError
from compass.wire.codec import WIRE_DTYPES

__all__ = ["FILE_SUFFIXES", "parse_input"]

#: the files ``NAME=@PATH`` reads, by suffix
FILE_SUFFIXES = (".npy", ".pt", ".safetensors")
#: DTYPE's prefix for a numpy array (no prefix, or ``torch.``: a torch tensor)
_NUMPY_PREFIXES = ("numpy", "np")


def parse_input(item: str) -> tuple[str, Any]:
    """``(name, value)`` of one ``-i`` argument (see the module docstring)."""
    key, sep, text = item.partition("=")
    name, typed, dtype = key.partition(":")
    if not sep or not name:
        raise ConfigError(f"--input {item!r}: expected NAME=VALUE, NAME=@FILE or NAME:DTYPE=VALUE")
    if text.startswith("@"):
        if typed:
            raise ConfigError(
                f"--input {item!r}: a file's tensor keeps the dtype it was saved with; "
                f"give {name}=@FILE without :{dtype}"
            )
        return name, _from_file(item, name, Path(text[1:]))
    if typed:
        return name, _typed(item, dtype, text)
    try:
        return name, json.loads(text)
    except json.JSONDecodeError:
        return name, text


def _typed(item: str, dtype: str, text: str) -> Any:
    """A JSON number or list as a tensor (or a numpy array) of ``dtype``."""
    prefix, _, short = dtype.rpartition(".")
    if prefix not in ("", "torch", *_NUMPY_PREFIXES) or short not in WIRE_DTYPES:
        known = ", ".join(WIRE_DTYPES)
        raise ConfigError(
            f"--input {item!r}: unknown dtype {dtype!r}; known: {known} (a torch tensor; "
            "numpy.DTYPE for a numpy array)"
        )
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, (int, float, list)):
        raise ConfigError(
            f"--input {item!r}: a typed input is a JSON number or list of numbers, got {text!r}"
        )
    numpy = prefix in _NUMPY_PREFIXES
    if numpy and short == "bfloat16":
        raise ConfigError(f"--input {item!r}: numpy has no bfloat16; give bfloat16 (a tensor)")
    try:
        if numpy:
            return np.asarray(data, dtype=WIRE_DTYPES[short])
        import torch

        return torch.tensor(data, dtype=getattr(torch, short))
    except (ValueError, TypeError, OverflowError, RuntimeError) as exc:
        raise ConfigError(f"--input {item!r}: not a {dtype} tensor: {exc}") from None


def _from_file(item: str, name: str, path: Path) -> Any:
    """The array or tensor in ``path``, by its suffix."""
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(
            f"--input {item!r}: cannot read a {suffix or 'suffix-less'} file as a tensor; "
            f"give one of {', '.join(FILE_SUFFIXES)}"
        )
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        import torch

        if suffix == ".pt":
            loaded = torch.load(path, map_location="cpu", weights_only=True)
            found = loaded if isinstance(loaded, torch.Tensor) else _one_of(item, name, loaded)
        else:
            from safetensors.torch import load_file

            found = _one_of(item, name, load_file(path))
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"--input {item!r}: cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, RuntimeError, pickle.UnpicklingError) as exc:
        # not a tensor file, or (weights_only) pickled objects in it
        raise ConfigError(f"--input {item!r}: {path} holds no tensor it can read: {exc}") from None
    if not isinstance(found, torch.Tensor):
        raise ConfigError(f"--input {item!r}: {path} holds {type(found).__name__!r}, not a tensor")
    return found


def _one_of(item: str, name: str, tensors: object) -> Any:
    """The tensor named ``name`` in a file of several, or its only one."""
    if not isinstance(tensors, Mapping):
        return tensors
    if name in tensors:
        return tensors[name]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    raise ConfigError(
        f"--input {item!r}: the file holds {len(tensors)} tensors and none named {name!r}: "
        f"{', '.join(map(str, tensors))}"
    )
