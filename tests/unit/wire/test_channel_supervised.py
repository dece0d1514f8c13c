"""A channel's request handlers fail in no way unseen: one whose answer cannot be given (a bug)
is logged and its caller answered with an error, not left waiting; one that fails as it is
cancelled is logged where the channel waits for its handlers, not dropped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from compass.config import Timeouts
from compass.errors import CompassError
from compass.wire.memory import End, memory_pair
from compass.wire.transport import Channel

FAST = Timeouts(connect=5.0, handshake=2.0, request=10.0, close=0.5)


def errors(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    """The ERROR records, each with its traceback, that say ``text``."""
    return [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and text in r.getMessage() and r.exc_info
    ]


@pytest.mark.asyncio
async def test_a_handler_whose_answer_fails_is_logged_and_its_caller_told(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def handler(channel: Channel, op: str, body: Any) -> Any:
        await asyncio.sleep(0)
        return "done"

    def answer(request_id: int, op: str, result: Any) -> None:
        raise RuntimeError("injected: answering failed")

    near, far = await memory_pair(End("a"), End("b", handler=handler), timeouts=FAST)
    monkeypatch.setattr(far, "_answer", answer)
    try:
        with pytest.raises(CompassError, match="injected"):
            async with asyncio.timeout(5):  # answered, not left to the request timeout
                await near.request("slow", {})
        (record,) = errors(caplog, "answering 'slow'")
        assert record.exc_info is not None and "injected" in str(record.exc_info[1])
    finally:
        await near.aclose()
        await far.aclose()


@pytest.mark.asyncio
async def test_a_handler_that_fails_as_it_is_cancelled_is_logged_when_the_channel_waits(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def handler(channel: Channel, op: str, body: Any) -> Any:
        await asyncio.sleep(10)

    near, far = await memory_pair(End("a"), End("b", handler=handler), timeouts=FAST)
    request = asyncio.ensure_future(near.request("slow", {}))
    try:
        async with asyncio.timeout(5):
            while not far.in_flight:  # noqa: ASYNC110
                await asyncio.sleep(0.001)

            def send_error(*args: Any) -> None:
                raise RuntimeError("injected: the cancellation could not be sent")

            monkeypatch.setattr(far._conn, "send_error", send_error)
            await far.finish_handlers(0.01)  # past it, the handler is cancelled
        (record,) = errors(caplog, "a request handler")
        assert record.exc_info is not None and "injected" in str(record.exc_info[1])
    finally:
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
        await near.aclose()
        await far.aclose()
