"""A request answered from a future (:class:`~compass.wire.handlers.Later`), on every
transport: answered as soon as the future is set, with its value or its error, by no task of
its own; cancelled when its caller gives up or the channel closes, as a handler's task is."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compass.errors import (
    CompassTimeout,
    ConnectionClosed,
    ConnectionLost,
    InvalidInputs,
    WorkerUnavailable,
)
from compass.wire.channel import Channel
from compass.wire.handlers import Later

from .test_channel_conformance import PAIRS, Peer, opened, until


class LaterPeer(Peer):
    """A peer whose ``later`` op answers from a future the test holds, by the request's body."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.futures: dict[Any, asyncio.Future[Any]] = {}

        def later(channel: Channel, body: Any) -> Later:
            future = self.futures[body] = asyncio.get_running_loop().create_future()
            return Later(future)

        self.router.add_request("later", later)


async def _asked(near: Channel, b: LaterPeer, body: str) -> asyncio.Future[Any]:
    """``near`` asks ``b`` for ``later``, until the request reached b's handler."""
    asking = asyncio.ensure_future(near.request("later", body))
    await until(lambda: body in b.futures, "the request reached its handler")
    return asking


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_later_answer_is_the_future_s_value_or_error_with_no_task(kind: str) -> None:
    b = LaterPeer("b")
    async with opened(kind) as net:
        near, far = await net.pair(Peer("a"), b)
        tasks = len(asyncio.all_tasks())
        asking = await _asked(near, b, "one")
        # held as the request's future, no task started for it (the caller's own aside)
        assert list(far._handler_tasks.values()) == [b.futures["one"]]
        assert len(asyncio.all_tasks()) == tasks + 1
        b.futures["one"].set_result({"x": 1})
        assert await asking == {"x": 1}
        assert far._handler_tasks == {}

        asking = await _asked(near, b, "two")
        b.futures["two"].set_exception(InvalidInputs("no such input", detail={"job_id": "j2"}))
        with pytest.raises(InvalidInputs, match="no such input") as refused:
            await asking
        assert refused.value.detail == {"job_id": "j2"}
        assert await near.request("echo", 3) == 3  # the channel serves on


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", PAIRS)
async def test_a_later_answer_given_up_on_or_cut_off_cancels_its_future(kind: str) -> None:
    b = LaterPeer("b")
    async with opened(kind) as net:
        near, far = await net.pair(Peer("a"), b)
        with pytest.raises(CompassTimeout, match="'later'"):
            await near.request("later", "late", timeout=0.05)
        await until(lambda: b.futures["late"].cancelled(), "the caller's give-up cancels it")
        assert far._handler_tasks == {}

        asking = await _asked(near, b, "cut")
        await far.aclose()
        await until(lambda: b.futures["cut"].cancelled(), "the channel's close cancels it")
        with pytest.raises((ConnectionClosed, ConnectionLost, WorkerUnavailable)):
            await asking
