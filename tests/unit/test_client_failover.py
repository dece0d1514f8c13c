"""The client fails a job over to the next worker only when its ingress goes away: a job the
ingress answered itself (its workers were lost too often, :class:`WorkersLost`) is not
submitted again elsewhere, where it would run a second time under the same key.

Two stand-in workers on loopback TCP answer ``submit`` as a test says; each records the keys
it was asked for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from compass import Client
from compass.errors import CompassError, WorkersLost, WorkerUnavailable
from compass.wire import tcp
from compass.wire.options import ChannelOptions
from compass.wire.rpc import Router
from compass.wire.transport import Channel

TOKEN = "t" * 32


class StandIn:
    """A worker that answers each ``submit`` with ``answer(key)`` (raised if an error)."""

    def __init__(self, name: str, answer: Callable[[str], Any]) -> None:
        self.name = name
        self.keys: list[str] = []
        self.router = Router()
        self.server: tcp.Server | None = None

        @self.router.request("submit")
        async def submit(channel: Channel, body: Any) -> Any:
            self.keys.append(body["key"])
            outcome = answer(body["key"])
            if isinstance(outcome, CompassError):
                raise outcome
            return outcome

    async def start(self) -> str:
        options = ChannelOptions(name=self.name, token=TOKEN)
        self.server = await tcp.serve("127.0.0.1", 0, options, handler=self.router.handle_request)
        host, port = self.server.address
        return f"{host}:{port}"


@pytest_asyncio.fixture
async def pair() -> AsyncIterator[Callable[[Callable[[str], Any]], Any]]:
    """Start two stand-ins: the first answers as the test says, the second with "ran"."""
    started: list[StandIn] = []

    async def start(first: Callable[[str], Any]) -> tuple[StandIn, StandIn, Client]:
        one, two = StandIn("w1", first), StandIn("w2", lambda key: "ran")
        addresses = [await one.start(), await two.start()]
        started.extend((one, two))
        return one, two, Client(addresses, token=TOKEN)

    yield start
    for stand_in in started:
        if stand_in.server is not None:
            await stand_in.server.aclose()


@pytest.mark.asyncio
async def test_a_job_refused_by_an_ingress_going_away_goes_to_the_next_worker(pair: Any) -> None:
    one, two, client = await pair(lambda key: WorkerUnavailable("worker w1 is shutting down"))
    async with client:
        assert await client.submit("flow", x=1) == "ran"
    assert one.keys == two.keys and len(one.keys) == 1  # the same key, run once: at w2


@pytest.mark.asyncio
async def test_a_job_its_ingress_answered_workers_lost_is_not_submitted_again(pair: Any) -> None:
    # the job ran, in part, at w1's workers: a second submission would run it twice
    lost = WorkersLost("task 'a' of workflow 'flow' failed on w3: no connection to w4")
    one, two, client = await pair(lambda key: lost)
    async with client:
        with pytest.raises(WorkersLost, match="no connection to w4") as raised:
            await client.submit("flow", x=1)
        assert isinstance(raised.value, WorkerUnavailable)  # what callers catch already
        # and the client stays with w1: it is not going away
        with pytest.raises(WorkersLost):
            await client.submit("flow", x=2)
    assert len(one.keys) == 2 and two.keys == []


@pytest.mark.asyncio
async def test_every_job_has_a_key_of_its_own_across_clients(pair: Any) -> None:
    one, _, client = await pair(lambda key: "ran")
    other = Client(client.addresses, token=TOKEN)
    async with client, other:
        for i in range(3):
            await client.submit("flow", x=i)
            await other.submit("flow", x=i)
    assert len(one.keys) == len(set(one.keys)) == 6
    assert all(0 < len(key) <= 128 for key in one.keys)  # the workers' limit (MAX_KEY_CHARS)
