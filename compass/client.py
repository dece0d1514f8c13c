"""The async client an application embeds: connect to any worker, submit jobs, await results.

::

    async with compass.Client("127.0.0.1:7341", token=token) as client:
        caption = await client.submit("img_to_text", image=pixels)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from compass.config import Limits, Timeouts
from compass.errors import ConfigError, ConnectFailed, ConnectionClosed
from compass.wire.transport import Channel, connect

__all__ = ["Client"]

_DEFAULT: Any = object()


class Client:
    """A connection to one worker at a time: the ingress of every job this client submits.

    Any worker can be the ingress, so ``address`` may list several: when the connection is
    lost, the next call connects to the next one that answers (failover), and a client that was
    never connected connects on its first call. A call in flight when the connection breaks
    raises :class:`~compass.errors.ConnectionLost`; its job may be lost with the worker, and
    resubmitting it is the caller's decision. After :meth:`aclose` calls fail until
    :meth:`connect`.

    ``timeouts.request`` bounds each call, job submissions included, unless a call passes its own
    ``timeout`` (``None`` waits as long as the job takes).
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        token: str | None = None,
        name: str = "client",
        timeouts: Timeouts | None = None,
        limits: Limits | None = None,
    ) -> None:
        addresses = (address,) if isinstance(address, str) else tuple(address)
        if not addresses or not all(isinstance(a, str) and a for a in addresses):
            raise ConfigError(f"Client needs one or more worker addresses, got {address!r}")
        self.addresses = addresses
        #: the worker this client talks to now (or will try first)
        self.address = addresses[0]
        self._token = token
        self._name = name
        self.timeouts = timeouts or Timeouts()
        self.limits = limits or Limits()
        self._channel: Channel | None = None
        self._closed = False  # by aclose(): no reconnecting behind the caller's back
        self._connecting = asyncio.Lock()  # one reconnection at a time

    async def connect(self) -> Client:
        """Connect (to the first address that answers) unless connected already."""
        self._closed = False
        if self._channel is None or self._channel.closed:
            await self._connect_any()
        return self

    async def _connect_any(self) -> None:
        async with self._connecting:
            if self._channel is not None and not self._channel.closed:
                return  # another call reconnected while this one waited
            n = len(self.addresses)
            first = self.addresses.index(self.address)
            if self._channel is not None:
                first += 1  # the current worker was lost: try the others first
            problems: list[str] = []
            for k in range(n):
                address = self.addresses[(first + k) % n]
                try:
                    self._channel = await connect(
                        address,
                        token=self._token,
                        name=self._name,
                        role="client",
                        limits=self.limits,
                        timeouts=self.timeouts,
                    )
                except ConnectFailed as exc:
                    problems.append(str(exc))
                    continue
                self.address = address
                return
            if n == 1:
                raise ConnectFailed(problems[0])
            raise ConnectFailed(f"no worker answered ({n} tried): " + "; ".join(problems))

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
        channel = self._channel
        if channel is None or channel.closed:
            if self._closed:
                raise ConnectionClosed(f"client for {self.address} was closed")
            await self._connect_any()
        return await self.channel.request(op, body, timeout=timeout)

    async def aclose(self) -> None:
        self._closed = True
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
