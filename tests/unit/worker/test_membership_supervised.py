"""Nothing the membership runs in the background fails unseen (compass/supervisor.py): a retry,
a dial, the idle-channel sweeper or a channel's close that raises what nobody foresaw is logged
at ERROR with its task's name and traceback; the sweeper starts again, a lost peer is retried
on, and what a close gathers is logged, not dropped."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from compass.membership.table import Member
from compass.wire.memory import MemoryNetwork
from compass.worker.membership import Backoff

from .test_members import until
from .test_membership import _serve, listening, membership
from .test_peer_channels import Node


def failures(caplog: pytest.LogCaptureFixture, task: str) -> list[logging.LogRecord]:
    """The ERROR records that say ``task`` failed, each with its traceback."""
    return [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and f"{task} failed" in r.getMessage() and r.exc_info
    ]


@pytest.mark.asyncio
async def test_a_sweeper_that_fails_is_logged_and_started_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await Node(MemoryNetwork(), "a", idle_s=0.2).start()
    rounds: list[int] = []

    def trim(keep: Any = None) -> None:
        rounds.append(1)
        if len(rounds) == 1:
            raise RuntimeError("injected: trimming failed")

    monkeypatch.setattr(node.membership.channels, "_trim", trim)
    try:
        await until(lambda: len(rounds) >= 3, "the sweeper sweeps again after failing")
        assert len(failures(caplog, "a-idle-channels")) == 1
    finally:
        await node.aclose()


@pytest.mark.asyncio
async def test_a_retry_that_fails_is_logged_and_the_peer_retried_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    backoff = Backoff(0.01, 0.05)
    a, router_a = membership("a", time.monotonic, [], backoff)
    b, router_b = membership("b", time.monotonic, [], backoff)
    async with listening(a, router_a):
        server_b = await _serve(b, router_b)
        async with server_b:
            await a.join([b.table.address])
        real = a.table.lost
        tries: list[str] = []

        def lost(name: str) -> Member | None:
            tries.append(name)
            if len(tries) == 1:
                raise RuntimeError("injected: the table failed")
            return real(name)

        monkeypatch.setattr(a.table, "lost", lost)
        retrying = asyncio.ensure_future(a.run())
        try:
            await b.aclose()  # b crashes: a loses it and retries it
            await until(lambda: len(tries) >= 3, "a tries b again after the failed try")
            assert len(failures(caplog, "a-rejoin-b")) == 1
            assert a.table.members["b"].failures >= 2  # the failed try counted: it backs off
        finally:
            retrying.cancel()
            await asyncio.gather(retrying, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_dial_that_fails_unexpectedly_is_logged_and_what_waited_dropped(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    network = MemoryNetwork()
    a, b = [await Node(network, name, idle_s=0).start() for name in "ab"]
    try:
        await b.membership.join([a.membership.table.address])
        await until(lambda: "b" in a.membership.channels.peers, "a knows b")
        channel = a.membership.channels.channel("b")
        assert channel is not None
        # closed by choice: a dials b for the next note
        a.membership.channels._retire(channel, "now")
        await until(lambda: a.membership.channels.channel("b") is None, "a has no channel to b")

        async def reach(name: str, address: str) -> Any:
            raise RuntimeError("injected: dialing failed")

        monkeypatch.setattr(a.membership.channels, "_reach", reach)
        assert a.membership.channels.send("b", "note", "lost")
        await until(lambda: bool(failures(caplog, "a-reach-b")), "the failed dial is logged")
        assert not a.membership.channels._queued.get("b") and b.notes == []
    finally:
        for node in (a, b):
            await node.aclose()


@pytest.mark.asyncio
async def test_a_channel_whose_close_fails_is_logged_when_retired_and_at_close(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    network = MemoryNetwork()
    a, b, c = [await Node(network, name, idle_s=0).start() for name in "abc"]
    try:
        for node in (b, c):
            await node.membership.join([a.membership.table.address])
        await until(lambda: len(a.membership.channels.peers) == 2, "a knows b and c")
        for name in "bc":
            channel = a.membership.channels.channel(name)
            assert channel is not None
            real = channel.aclose

            async def aclose(real: Any = real, name: str = name) -> None:
                await real()
                raise RuntimeError(f"injected: closing the channel to {name} failed")

            monkeypatch.setattr(channel, "aclose", aclose)
        channel_b = a.membership.channels.channel("b")
        assert channel_b is not None
        a.membership.channels._retire(channel_b, "now")  # closed by choice, in the background
        await until(lambda: bool(failures(caplog, "a-close-b")), "the failed close is logged")
        await a.membership.aclose()  # the channel to c is closed with the membership
        closing = [r for r in caplog.records if r.levelno == logging.ERROR
                   and "closing the channels to peers" in r.getMessage()]  # fmt: skip
        assert len(closing) == 1 and "to c failed" in str(closing[0].exc_info[1])  # type: ignore[index]
    finally:
        for node in (a, b, c):
            await node.aclose()
