"""Streamed jobs, the caller's side: what :meth:`Client.stream <compass.Client.stream>`
yields, and how it reads a worker's stream.

A streamed job's step-wise sinks report each step's output as it is made; the worker that
took the job hands them on over the connection's stream (credit-windowed: a reader that falls
behind holds the worker's sending, not its memory), then the job's final output. Each comes
as an :class:`Output`; the last has ``final`` set. Leaving the loop early (``break`` in an
``async for`` closes the iterator) or cancelling the task that reads cancels the job
everywhere: its step-wise tasks stop at their next step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compass.errors import ProtocolError

if TYPE_CHECKING:
    from compass.wire.channel import Channel

__all__ = ["Output", "read_stream"]


@dataclass(frozen=True, slots=True)
class Output:
    """One item of a streamed job: a partial output of sink ``task`` (its step ``seq``, from
    0), or, last, the job's final output (``final``; ``task`` is None)."""

    value: Any
    task: str | None = None
    seq: int = -1
    final: bool = False


async def read_stream(
    channel: Callable[[], Awaitable[Channel]], body: dict[str, Any], window: int
) -> AsyncIterator[Output]:
    """Open the ``stream`` of job ``body`` on the channel ``channel()`` gives; its partial
    outputs, then its final output."""
    opened = await channel()
    async with opened.stream("stream", body, window=window) as items:
        async for item in items:
            if not (isinstance(item, dict) and isinstance(item.get("task"), str)):
                raise ProtocolError(f"a streamed job's partial output came as {item!r:.80}")
            yield Output(item.get("value"), item["task"], int(item.get("seq", -1)))
        final = items.result
    yield Output(final, final=True)
