"""The async client an application embeds: connect to any worker, submit jobs, await results.

::

    async with compass.Client("127.0.0.1:7341", token=token) as client:
        caption = await client.submit("img_to_text", image=pixels)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from compass.config import Limits, Timeouts
from compass.errors import ConnectionClosed
from compass.wire.transport import Channel, connect

__all__ = ["Client"]

_DEFAULT: Any = object()


class Client:
    """One connection to one worker (the ingress of every job this client submits).

    ``timeouts.request`` bounds each call, job submissions included, unless a call passes its own
    ``timeout`` (``None`` waits as long as the job takes).
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        name: str = "client",
        timeouts: Timeouts | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.address = address
        self._token = token
        self._name = name
        self.timeouts = timeouts or Timeouts()
        self.limits = limits or Limits()
        self._channel: Channel | None = None

    async def connect(self) -> Client:
        if self._channel is None or self._channel.closed:
            self._channel = await connect(
                self.address,
                token=self._token,
                name=self._name,
                role="client",
                limits=self.limits,
                timeouts=self.timeouts,
            )
        return self

    @property
    def channel(self) -> Channel:
        if self._channel is None:
            raise ConnectionClosed(
                f"client for {self.address} is not connected: use 'async with Client(...)' "
                "or 'await client.connect()'"
            )
        return self._channel

    async def ping(self, *, timeout: float | None = _DEFAULT) -> float:
        """Round-trip time to the worker, in seconds."""
        t0 = time.perf_counter()
        await self._request("ping", None, timeout)
        return time.perf_counter() - t0

    async def status(self, *, timeout: float | None = _DEFAULT) -> dict[str, Any]:
        """The worker's status: name, address, version, uptime, peers, queue, cache, counters."""
        result = await self._request("status", None, timeout)
        assert isinstance(result, dict)
        return result

    async def submit(
        self, workflow: str, /, *, timeout: float | None = _DEFAULT, **inputs: Any
    ) -> Any:
        """Run one job of ``workflow`` with ``inputs`` and return its final output.

        Raises :class:`~compass.errors.JobFailed` when a task raised (with the task's name and
        remote traceback), :class:`~compass.errors.UnknownWorkflow` or
        :class:`~compass.errors.InvalidInputs` for a bad request.
        """
        return await self._request("submit", {"workflow": workflow, "inputs": inputs}, timeout)

    async def submit_many(
        self,
        workflow: str,
        inputs: Iterable[Mapping[str, Any]],
        *,
        concurrency: int = 64,
        timeout: float | None = _DEFAULT,
    ) -> list[Any]:
        """Run one job per inputs mapping, at most ``concurrency`` at once; results in order."""
        limit = asyncio.Semaphore(concurrency)

        async def one(kwargs: Mapping[str, Any]) -> Any:
            async with limit:
                return await self.submit(workflow, timeout=timeout, **kwargs)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(kwargs)) for kwargs in inputs]
        return [task.result() for task in tasks]

    async def _request(self, op: str, body: Any, timeout: float | None) -> Any:
        if timeout is _DEFAULT:
            timeout = self.timeouts.request
        return await self.channel.request(op, body, timeout=timeout)

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.aclose()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
