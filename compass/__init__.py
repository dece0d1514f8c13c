"""compass: decentralized scheduling of latency-sensitive ML workflows across GPU workers."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
