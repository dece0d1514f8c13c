"""An event loop running in a daemon thread, that coroutines are handed to and waited for:
what :class:`~compass.client.SyncClient` runs its :class:`~compass.client.Client` on."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from compass.errors import ConfigError, ConnectionClosed
from compass.wire.transport import new_event_loop

__all__ = ["LoopThread"]

log = logging.getLogger("compass.client")

_T = TypeVar("_T")


class LoopThread:
    """An event loop running in a daemon thread; coroutines are handed to it and awaited."""

    def __init__(self, name: str, on_stop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.loop = new_event_loop()
        self._on_stop = on_stop
        # guards handing work to the loop, so that nothing is handed over once it has stopped
        self._lock = threading.Lock()
        self._running = True
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            with self._lock:
                self._running = False
            try:
                loop.run_until_complete(self._on_stop())
            except Exception:  # nobody waits for this thread: say why, then end cleanly
                log.exception("closing the client on %s failed", self.thread.name)
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise ConfigError(
                "a SyncClient method was called from its own event loop thread, where it "
                "would wait for itself forever: use the async Client there"
            )
        with self._lock:
            if not self._running:
                coro.close()
                raise ConnectionClosed("the client was closed (by another thread)")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._running:
                raise
            raise ConnectionClosed("the client was closed while this call waited") from None
        except BaseException:
            future.cancel()  # an interrupted caller (Ctrl-C) cancels the call, job included
            raise

    def stop_soon(self) -> None:
        """Ask the loop to close the client and end; does not wait."""
        with contextlib.suppress(RuntimeError):  # the loop has closed already
            self.loop.call_soon_threadsafe(self.loop.stop)

    def stop(self) -> None:
        self.stop_soon()
        self.thread.join()
