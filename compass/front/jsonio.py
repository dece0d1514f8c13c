"""JSON in and out of the front door at the least cost the standard library's public API
allows: on a no-op request, ``json.loads`` and ``json.dumps`` as usually called were a fifth
of the front door's own time.

``json.loads`` of bytes first guesses their encoding (UTF-8, -16 or -32, in Python), but
HTTP's JSON is UTF-8 (RFC 8259): :func:`loads` decodes the bytes as that (a body that is not
raises ``UnicodeDecodeError``) and hands the text to one decoder made once. ``json.dumps``
with any option, compact separators here, builds an encoder per call: :func:`dumps` uses one.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps", "loads"]

_DECODE = json.JSONDecoder().decode
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def loads(raw: bytes | bytearray | memoryview) -> Any:
    """The JSON document ``raw`` holds; ``UnicodeDecodeError`` where it is not UTF-8,
    ``json.JSONDecodeError`` where it is not JSON."""
    return _DECODE(str(raw, "utf-8"))  # decoded from the buffer itself, whatever holds it


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON (ASCII, as ``json.dumps`` writes it by default)."""
    return _ENCODE(value).encode()
