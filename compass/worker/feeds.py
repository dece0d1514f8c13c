"""The streams a task reads: a streamed edge's partial outputs, handed to the task's thread.

The worker core says what each stream gets (:class:`~compass.core.events.Feed`: a chunk, its
end, or its break; :mod:`compass.core.edges`); :class:`Feeds` keeps, per task here, a
:class:`FeedReader` per streamed input, from the stream's first chunk (which comes before the
task can start) until the task's outcome is reported. The task gets the reader as the
argument of that input and reads it in its own thread.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterable
from typing import Any

from compass.core.events import Feed
from compass.core.queue import QueuedTask
from compass.errors import CompassError

__all__ = ["FeedReader", "Feeds"]

#: a task's key: job, attempt, task
Key = tuple[str, int, str]


class _End:
    """The stream ended (the predecessor's final output is not an item of it)."""


_END = _End()


class FeedReader:
    """A streamed input, as its task reads it: an iterator, sync (``for``) and async
    (``async for``) alike, of the predecessor's partial outputs in order; it ends when the
    predecessor ends, and raises the job's error when the stream breaks (its job ended or
    failed elsewhere). A read waits in the task's thread (an async generator's too: its loop
    is the thread's own); the worker's loop only puts."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: the stream ended or broke (set on the worker's loop)
        self.ended = False
        self._finished: _End | CompassError | None = None

    def __repr__(self) -> str:
        return f"FeedReader({self.source!r})"

    def put(self, value: Any) -> None:
        self._items.put(value)

    def end(self, error: CompassError | None = None) -> None:
        if not self.ended:
            self.ended = True
            self._items.put(_END if error is None else error)

    def __iter__(self) -> FeedReader:
        return self

    def __next__(self) -> Any:
        if self._finished is not None:  # read past its end: the same end again
            item: Any = self._finished
        else:
            item = self._items.get()
        if isinstance(item, _End):
            self._finished = item
            raise StopIteration
        if isinstance(item, CompassError):
            self._finished = item
            raise item
        return item

    def __aiter__(self) -> FeedReader:
        return self

    async def __anext__(self) -> Any:
        try:
            return self.__next__()
        except StopIteration:
            raise StopAsyncIteration from None


class Feeds:
    """The readers of the streams into tasks here, by task; see the module docstring. Used on
    the worker's loop only."""

    def __init__(self) -> None:
        self._readers: dict[Key, dict[str, FeedReader]] = {}
        #: tasks waiting for their streams to end (an emulated task's end): what to call then
        self._waiting: dict[Key, Callable[[], None]] = {}

    def __len__(self) -> int:
        return len(self._readers)

    def apply(self, feed: Feed) -> None:
        """Carry out the core's :class:`Feed`."""
        key = (feed.job_id, feed.attempt, feed.task)
        if feed.error is not None:
            for reader in self._readers.pop(key, {}).values():
                reader.end(feed.error)
            self._ended(key)
            return
        readers = self._readers.setdefault(key, {})
        reader = readers.get(feed.source) or readers.setdefault(
            feed.source, FeedReader(feed.source)
        )
        if feed.last:
            reader.end()
            self._ended(key)
        else:
            reader.put(feed.value)

    def readers(self, entry: QueuedTask, sources: Iterable[str]) -> dict[str, FeedReader]:
        """The readers of ``entry``'s streamed inputs ``sources``, by source."""
        readers = self._readers.setdefault((entry.job_id, entry.attempt, entry.task), {})
        for source in sources:
            if source not in readers:
                readers[source] = FeedReader(source)
        return {source: readers[source] for source in sources}

    def when_ended(self, entry: QueuedTask, then: Callable[[], None]) -> bool:
        """Call ``then`` once every stream into ``entry`` ended or broke; False (and no call)
        when they have already."""
        key = (entry.job_id, entry.attempt, entry.task)
        readers = self._readers.get(key, {})
        if all(reader.ended for reader in readers.values()):
            return False
        self._waiting[key] = then
        return True

    def discard(self, entry: QueuedTask) -> None:
        """``entry``'s outcome is reported: its readers go."""
        key = (entry.job_id, entry.attempt, entry.task)
        self._readers.pop(key, None)
        self._waiting.pop(key, None)

    def _ended(self, key: Key) -> None:
        then = self._waiting.get(key)
        if then is not None and all(r.ended for r in self._readers.get(key, {}).values()):
            del self._waiting[key]
            then()
