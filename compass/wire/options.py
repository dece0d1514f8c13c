"""What one side of a channel brings to it, whichever transport carries it: :class:`ChannelOptions`,
given to :func:`compass.wire.tcp.serve` and :func:`compass.wire.tcp.connect` and to their
in-memory twins (:class:`compass.wire.memory.MemoryNetwork`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from compass.config import Limits, Timeouts

if TYPE_CHECKING:
    from ssl import SSLContext

__all__ = ["ChannelOptions"]


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    """Who this side says it is in the handshake (``name``, and the cluster's ``token``; None:
    no token), the :class:`~compass.config.Limits` and :class:`~compass.config.Timeouts` its
    channels keep, and its TLS context (``ssl``; None: plain TCP, and the only choice in
    memory). The token is left out of the repr."""

    name: str
    token: str | None = field(repr=False)
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    ssl: SSLContext | None = None
