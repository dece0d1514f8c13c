"""How many bytes a value takes on the wire: the size of a payload, a concept of the worker core
(what its estimates and kept answers count) and of the wire alike, so it lives below both."""

from __future__ import annotations

from typing import Any

__all__ = ["payload_bytes"]


#: exact types that take no more than a scalar's 16 bytes, and have no ``nbytes`` (a builtin
#: type takes no attributes): the common case, answered first
_SCALAR_TYPES = frozenset((int, float, bool, complex, type(None)))
_BYTES_LIKE = (bytes, bytearray, memoryview, str)
_SEQUENCE_TYPES = (list, tuple)


def payload_bytes(value: Any) -> int:
    """Approximate bytes ``value`` takes on the wire (arrays and tensors exactly)."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return 16
    if kind is str or kind is bytes:
        return len(value)
    if kind is dict:  # a job's inputs: before the look-up of nbytes, which a dict lacks
        return sum(map(payload_bytes, value.values())) + 8 * len(value)
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, _BYTES_LIKE):
        return len(value)
    if isinstance(value, dict):
        return sum(map(payload_bytes, value.values())) + 8 * len(value)
    if isinstance(value, _SEQUENCE_TYPES):
        return sum(map(payload_bytes, value)) + 8 * len(value)
    element = getattr(value, "element_size", None)
    numel = getattr(value, "numel", None)
    if callable(element) and callable(numel):  # a torch tensor
        return int(element()) * int(numel())
    return 16
