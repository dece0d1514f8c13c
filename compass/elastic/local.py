"""``compass up --autoscale MIN:MAX``: a local cluster that follows its desired worker count.

The asyncio adapter of the rule for worker processes on this host: every ``period_s`` it asks
the first running worker for ``compass status``'s ``desired_workers`` (the rule of
:mod:`compass.elastic.live`, computed there from its view), keeps it within ``MIN:MAX``, and
starts workers (joined to the first) or stops the newest ones with SIGTERM, which drains them:
their queued and planned tasks run and their jobs are answered before they leave. A worker that
fails to start is reported in one line and the cluster keeps serving; the next step tries
again. The first worker is never stopped (it is the others' seed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from compass.client import Client
from compass.cluster import LocalCluster, WorkerProcess
from compass.errors import CompassError, ConfigError

__all__ = ["LocalAutoscaler"]


class LocalAutoscaler:
    """Sizes ``cluster`` to its desired worker count within ``minimum:maximum``; see the module
    docstring. ``extra``: flags for the workers it starts only; ``say``: one line per change."""

    def __init__(
        self,
        cluster: LocalCluster,
        minimum: int,
        maximum: int,
        *,
        period_s: float = 5.0,
        extra: Sequence[str] = (),
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        if not 1 <= minimum <= maximum:
            raise ConfigError(f"autoscale MIN ({minimum}) is above MAX ({maximum})")
        if not period_s > 0:
            raise ConfigError(f"the autoscaling period must be > 0 s, got {period_s!r}")
        self.cluster = cluster
        self.minimum = minimum
        self.maximum = maximum
        self.period_s = period_s
        self.extra = list(extra)
        self.say = say
        self._next = len(cluster.workers)
        #: workers that failed to start, and workers drained away
        self.failed = 0
        self.drained = 0

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.cluster.workers if w.running]

    async def desired(self) -> int:
        """The first running worker's desired count, within the bounds."""
        live = self.live()
        async with Client(live[0].address, token=self.cluster.token, tls=self.cluster.tls) as c:
            status = await c.status()
        wanted = int(status.desired_workers["desired"])
        return min(max(wanted, self.minimum), self.maximum)

    async def step(self) -> int:
        """One decision and its action; returns the running workers after it."""
        live = self.live()
        if not live:
            raise CompassError("no worker of the cluster is running")
        want = await self.desired()
        if want > len(live):
            seed = live[0].address
            for _ in range(want - len(live)):
                name = f"w{self._next}"
                self._next += 1
                try:
                    await self.cluster.spawn(name, join=seed, extra=self.extra)
                except (CompassError, OSError) as exc:
                    self.failed += 1
                    self.say(f"autoscale: {name} failed to start ({exc}); serving with "
                             f"{len(self.live())} workers, trying again next step")  # fmt: skip
                    break
                self.say(f"autoscale: started {name} ({len(self.live())} of {want} wanted)")
        elif want < len(live):
            for worker in reversed(live[1:][-(len(live) - want) :]):
                code = await worker.stop()  # SIGTERM: the worker drains, then leaves
                self.drained += 1
                self.say(f"autoscale: drained {worker.name} (exit {code})")
        return len(self.live())

    async def run(self, stop: asyncio.Event) -> None:
        """Step every ``period_s`` until ``stop`` is set; a failed step is reported and the
        next one tries again."""
        while not stop.is_set():
            try:
                await self.step()
            except (CompassError, OSError) as exc:
                self.say(f"autoscale: step failed ({exc}); trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period_s)
