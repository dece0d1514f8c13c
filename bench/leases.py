"""The model cache driven on its own, without a worker core: pinned leases, for benchmarks and
tests.

On a worker the core decides every load (:class:`~compass.core.lanes.Lanes` asks
:meth:`CacheCore.acquire <compass.cache.policy.CacheCore.acquire>` and begins the load) and
:meth:`ModelCache.fetch <compass.cache.models.ModelCache.fetch>` carries it out.
:class:`LeasingCache` plays the core's part for code that has no worker: ``compass bench gpu``
and the cache's tests ask it for a model (:meth:`LeasingCache.ensure`) and get it resident and
pinned, by the same ``acquire`` rule, loaded by the same ``fetch``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from compass.cache.backend import SlabBackend
from compass.cache.models import ModelCache
from compass.cache.policy import READY, WAIT, LoadPlan
from compass.cache.weights import Model
from compass.config import CacheConfig
from compass.errors import CacheError, CompassError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Lease", "LeasingCache"]

log = logging.getLogger(__name__)


class Lease:
    """A pinned model, handed out by :meth:`LeasingCache.ensure`.

    The model cannot be evicted until :meth:`release` (idempotent; also on leaving a ``with``
    block). ``module`` raises once released: its tensors may then belong to another model.
    """

    __slots__ = ("_module", "_release", "_released", "hit", "name")

    def __init__(
        self, name: str, hit: bool, module: nn.Module | None, release: Callable[[], None]
    ) -> None:
        self.name = name
        #: whether the model was resident when it was asked for
        self.hit = hit
        self._module = module
        self._release = release
        self._released = False

    @property
    def module(self) -> nn.Module | None:
        """The torch module (None for an emulated model)."""
        if self._released:
            raise CacheError(f"lease on model {self.name!r} was released; ensure it again")
        return self._module

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released

    def release(self) -> None:
        """Unpin the model. Calling it again does nothing."""
        if not self._released:
            self._released = True
            self._module = None
            self._release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"Lease({self.name!r}, hit={self.hit}, {state})"


class LeasingCache(ModelCache):
    """A :class:`ModelCache` that hands out pinned models itself (see the module docstring).

    A load under way (a prefetch, another caller's) is shared; a load that needs slabs held by
    pinned or loading models waits until they are released. At most one speculative load
    (:meth:`prefetch`, :meth:`warm`) runs at a time. Closing it wakes every waiter, which
    raises :class:`CacheError`.
    """

    def __init__(
        self,
        models: Mapping[str, Model],
        config: CacheConfig,
        *,
        emulated_h2d_bytes_per_s: float | None = None,
        time_scale: float = 1.0,
        backend: SlabBackend | None = None,
    ) -> None:
        super().__init__(
            models,
            config,
            emulated_h2d_bytes_per_s=emulated_h2d_bytes_per_s,
            time_scale=time_scale,
            backend=backend,
        )
        self._prefetch_depth = config.prefetch_depth
        #: each load under way, done when its copy ends (with the load's error if it failed)
        self._loads: dict[str, asyncio.Future[None]] = {}
        self._speculative: asyncio.Future[None] | None = None
        self._changed = asyncio.Event()
        self._closing = False
        #: called whenever a load starts or ends (what resident() / loading() report changed)
        self.on_change: Callable[[], None] | None = None

    async def ensure(self, name: str, upcoming: Sequence[str] = ()) -> Lease:
        """Make ``name`` resident and return it pinned.

        ``upcoming`` lists the models the local queue needs after this task, in order; it
        steers eviction. Raises :class:`ModelTooLarge` when the model can never fit.
        """
        self._refuse_if_closed()
        core = self.core
        hit = core.record_request(name)
        waited = False
        while True:
            self._refuse_if_closed()
            step = core.acquire(name, upcoming)
            if step == READY:
                return self._lease(name, hit)
            if step == WAIT:
                if not waited:
                    core.record_wait()
                    waited = True
                await self._changed.wait()
                continue
            if isinstance(step, LoadPlan):
                self._start_load(name, step, prefetch=False)
                core.pin(name)
            try:
                await asyncio.shield(self._loads[name])
            except BaseException:
                self._unpin(name)
                raise
            return self._lease(name, hit)

    def prefetch(self, upcoming: Sequence[str]) -> None:
        """Start loading the best prefetch candidate of the queue ``upcoming``, if any: never
        a model whose load would evict one needed sooner. Needs a running event loop."""
        if self._closing or (self._speculative is not None and not self._speculative.done()):
            return
        candidate = self.core.prefetch_candidate(upcoming, self._prefetch_depth)
        if candidate is not None:
            name, plan = candidate
            self._speculative = self._start_load(name, plan, prefetch=True)

    def warm(self, wanted: Sequence[str]) -> None:
        """Load the first model of ``wanted`` that fits in free slabs (never evicts anything),
        as an idle worker fills unused cache with models the cluster is short of."""
        if self._closing or (self._speculative is not None and not self._speculative.done()):
            return
        candidate = self.core.warm_candidate(wanted)
        if candidate is not None:
            name, plan = candidate
            self._speculative = self._start_load(name, plan, prefetch=True)

    async def aclose(self) -> None:
        """Refuse new requests, wake waiters (they raise), finish loads under way, free memory."""
        self._closing = True
        self._notify()
        await super().aclose()

    def _refuse_if_closed(self) -> None:
        if self._closing:
            raise CacheError("the model cache is closed")

    def _start_load(self, name: str, plan: LoadPlan, *, prefetch: bool) -> asyncio.Future[None]:
        self.core.begin_load(name, plan, prefetch=prefetch)
        load = asyncio.get_running_loop().create_future()
        load.add_done_callback(_unwaited if prefetch else _retrieve)
        self._loads[name] = load
        self.fetch(name, plan.evict, self._fetched)
        if self.on_change is not None:
            self.on_change()
        return load

    def _fetched(self, name: str, outcome: float | CompassError) -> None:
        load = self._loads.pop(name)
        if isinstance(outcome, CompassError):
            self.core.abort_load(name)
            load.set_exception(outcome)
        else:
            self.core.finish_load(name, outcome)
            load.set_result(None)
        self._notify()

    def _lease(self, name: str, hit: bool) -> Lease:
        module = self.module(name)
        if module is None:
            return Lease(name, hit, None, lambda: self._unpin(name))
        backend = self.backend

        def release() -> None:
            # the lease holder's kernels may still read the slabs: fence before the unpin
            backend.synchronize_compute()
            backend.close_reads(name)
            self._unpin(name)

        return Lease(name, hit, module, release)

    def _unpin(self, name: str) -> None:
        if self.core.unpin(name) == 0:
            self._notify()

    def _notify(self) -> None:
        # wake every waiter; each re-checks, and a fresh event catches later changes
        self._changed.set()
        self._changed = asyncio.Event()
        if self.on_change is not None:
            self.on_change()


def _retrieve(load: asyncio.Future[None]) -> None:
    """A failed load's error, retrieved (its waiters raise it; without one it is not lost)."""
    if not load.cancelled():
        load.exception()


def _unwaited(load: asyncio.Future[None]) -> None:
    """A speculative load's error is logged: nobody may be waiting for it."""
    if not load.cancelled() and load.exception() is not None:
        log.warning("prefetch failed: %s", load.exception())
