"""The event loop compass runs on: uvloop when it is installed, else asyncio's default."""

from __future__ import annotations

import asyncio

__all__ = ["install_event_loop_policy", "new_event_loop"]


def install_event_loop_policy() -> bool:
    """Make uvloop the event loop of this process if installed; returns whether it is."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop if uvloop is installed, else a new default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
