"""The commands' running glue: logging set up for a worker, one client call on a loop of its
own (``compass status``, ``compass submit``), and a local cluster held until SIGINT or SIGTERM
(``compass up``). What is printed stays with the commands; these only run things.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from compass.config import Timeouts, TLSConfig

if TYPE_CHECKING:
    from compass.client import Client, JobResult
    from compass.cluster import LocalCluster
    from compass.reports import WorkerStatus
    from compass.streamed import Output
    from compass.submission import JobOptions
    from compass.trace import JobTrace

T = TypeVar("T")


def configure_logging(level: str, *, as_json: bool = False) -> None:
    """Log at ``level`` (``"warning"``, ...) on stderr: text lines, or one JSON object a line."""
    if as_json:
        from compass.observe.metrics import JsonLogFormatter

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLogFormatter())
        logging.basicConfig(level=level.upper(), handlers=[handler])
        logging.captureWarnings(True)  # a warning printed raw would break a JSON log pipeline
        return
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _ask(
    address: str,
    call: Callable[[Client], Awaitable[T]],
    *,
    token: str | None,
    tls: TLSConfig | None,
    timeouts: Timeouts | None = None,
) -> T:
    """``call`` on a client of the worker at ``address``, on a new event loop."""
    from compass.client import Client

    async def run() -> T:
        async with Client(address, token=token, timeouts=timeouts, tls=tls) as client:
            return await call(client)

    return asyncio.run(run())


def worker_status(
    address: str, *, token: str | None, tls: TLSConfig | None, timeout: float
) -> WorkerStatus:
    """The status of the worker at ``address``; ``timeout`` seconds for each step."""
    timeouts = Timeouts(connect=timeout, handshake=timeout, request=timeout)
    return _ask(address, lambda client: client.status(), token=token, tls=tls, timeouts=timeouts)


def kept_trace(
    address: str, job: str, *, token: str | None, tls: TLSConfig | None, timeout: float
) -> JobTrace:
    """The trace the worker at ``address`` kept of ``job``; ``timeout`` seconds for each step."""
    timeouts = Timeouts(connect=timeout, handshake=timeout, request=timeout)
    return _ask(address, lambda client: client.trace(job), token=token, tls=tls, timeouts=timeouts)


def worker_story(
    address: str, key: str, *, token: str | None, tls: TLSConfig | None, timeout: float
) -> dict[str, Any]:
    """What the worker at ``address`` logged about ``key``; ``timeout`` seconds for each step."""
    timeouts = Timeouts(connect=timeout, handshake=timeout, request=timeout)
    return _ask(address, lambda client: client.story(key), token=token, tls=tls, timeouts=timeouts)


def run_job(
    address: str,
    workflow: str,
    inputs: dict[str, Any],
    *,
    token: str | None,
    tls: TLSConfig | None,
    timeout: float,
    options: JobOptions,
) -> JobResult:
    """One job of ``workflow`` submitted to the worker at ``address`` with ``options``, and
    its result."""

    async def submit(client: Client) -> JobResult:
        return await client.submit_job(workflow, inputs, timeout=timeout, options=options)

    return _ask(address, submit, token=token, tls=tls)


def stream_job(
    address: str,
    workflow: str,
    inputs: dict[str, Any],
    show: Callable[[Output], None],
    *,
    token: str | None,
    tls: TLSConfig | None,
    timeout: float,
    options: JobOptions,
) -> Any:
    """One job of ``workflow`` streamed from the worker at ``address``: ``show`` each of its
    outputs as it comes; its final output (within ``timeout`` seconds in all). ``options``:
    its ``deadline_ms``, ``priority`` and ``on_miss`` (a streamed job is not traced)."""

    async def read(client: Client) -> Any:
        stream = client.stream(
            workflow,
            inputs,
            deadline_ms=options.deadline_ms,
            priority=options.priority,
            on_miss=options.on_miss,
        )
        async with asyncio.timeout(timeout):
            async for out in stream:
                show(out)
                if out.final:
                    return out.value
        return None

    return _ask(address, read, token=token, tls=tls)


def hold_cluster(
    cluster: LocalCluster,
    *,
    devices: list[int] | None,
    ready: Callable[[], None],
    stopping: Callable[[], None],
    during: Callable[[LocalCluster, asyncio.Event], Awaitable[None]] | None = None,
) -> None:
    """Start ``cluster`` (worker i on ``devices[i % n]`` when given), call ``ready``, and hold
    it until SIGINT or SIGTERM; then call ``stopping`` and stop every worker. ``during`` runs
    while it is held (``compass up --autoscale``) and is told to stop by the event."""
    from compass.wire.eventloop import new_event_loop

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with cluster if devices is None else _on_devices(cluster, devices):
            ready()
            if during is None:
                await stop.wait()
            else:
                await during(cluster, stop)
            stopping()

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


@contextlib.asynccontextmanager
async def _on_devices(cluster: LocalCluster, devices: list[int]) -> AsyncIterator[LocalCluster]:
    """Start ``cluster``'s workers one after another, worker i on ``devices[i % n]`` (so each
    sees the memory its predecessors on the same device left), and stop them on the way out."""
    try:
        first = await cluster.spawn("w0", extra=["--device", str(devices[0])])
        for i in range(1, cluster.size):
            device = ["--device", str(devices[i % len(devices)])]
            await cluster.spawn(f"w{i}", join=first.address, extra=device)
        await cluster.wait_joined()
        yield cluster
    finally:
        await cluster.aclose()
