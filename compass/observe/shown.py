"""What observability reads of a worker, as protocols: who it is (:class:`Identity`), what it
holds (:class:`Holdings`), what it records (:class:`Records`), the peers it can reach
(:class:`Peers`) and the view it holds of them (:class:`ViewHeld`, its gossip's
:class:`Gossiping` port). The worker
(:class:`compass.worker.server.Worker`) is each of them; the dashboard, the metrics and
``compass status`` read it through these, so nothing here imports the adapter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from compass.cache.models import ModelCache
    from compass.config import WorkerConfig
    from compass.core.lanes import Lanes
    from compass.core.stats import WorkerStats
    from compass.elastic.rule import Decision
    from compass.observe.streams import StreamsInFlight
    from compass.observe.timeline import Timeline
    from compass.observe.tracing import Tracer
    from compass.sched import Policy
    from compass.sched.view import ClusterView
    from compass.wire.transport import Channel

__all__ = [
    "Gossiping",
    "Holdings",
    "Identity",
    "Measured",
    "Peer",
    "PeerLinks",
    "Peers",
    "Records",
    "Seeded",
    "ViewHeld",
    "queue_status",
]


class Identity(Protocol):
    """Who a worker is and how it runs."""

    @property
    def name(self) -> str: ...

    @property
    def instance(self) -> str: ...

    @property
    def address(self) -> str: ...

    @property
    def started_at(self) -> float:
        """``time.monotonic()`` when it was made."""

    @property
    def policy(self) -> Policy: ...

    @property
    def config(self) -> WorkerConfig: ...


class Holdings(Protocol):
    """What a worker holds now: its queues and lanes, its cache and its jobs; and its clock,
    which ages them."""

    @property
    def lanes(self) -> Lanes: ...

    @property
    def cache(self) -> ModelCache: ...

    @property
    def jobs_in_flight(self) -> int: ...

    @property
    def tasks_waiting_inputs(self) -> int: ...

    @property
    def draining(self) -> bool: ...

    def clock(self) -> float: ...


class Records(Protocol):
    """What a worker counts and keeps of what it did: counters, traces, metrics."""

    @property
    def stats(self) -> WorkerStats: ...

    @property
    def tracer(self) -> Tracer: ...

    @property
    def metrics(self) -> Measured: ...


class Measured(Protocol):
    """What is read of a worker's metrics (:class:`compass.observe.metrics.WorkerMetrics`)."""

    @property
    def timeline(self) -> Timeline: ...

    @property
    def streams(self) -> StreamsInFlight: ...

    @property
    def address(self) -> str: ...

    @property
    def http_address(self) -> str:
        """Where the worker's HTTP front door serves ("" where it serves none)."""

    def is_ready(self) -> tuple[bool, str]: ...

    def slo_summary(self) -> dict[str, dict[str, dict[str, float]]]: ...

    def batch_sizes(self) -> dict[str, dict[str, int]]: ...

    def streamed(self, workflow: str, first_output_s: float) -> None: ...

    def desired_workers(self) -> Decision:
        """The cluster's desired size as this worker sees it (:mod:`compass.elastic.live`)."""


class Peer(Protocol):
    """A live peer as observability names it."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...


class PeerLinks(Protocol):
    """The live peers a worker reaches, and a channel to each on demand."""

    @property
    def peers(self) -> Mapping[str, Peer]: ...

    async def open_channel(self, name: str) -> Channel | None: ...


class Seeded(Protocol):
    """What a worker's member table says of how it joined."""

    @property
    def seeds(self) -> Sequence[str]:
        """The addresses it was told to join (``--join``)."""


class Peers(Protocol):
    """A worker's membership service: the peers it reaches (:attr:`channels`), its table,
    and those it lost."""

    @property
    def channels(self) -> PeerLinks: ...

    @property
    def table(self) -> Seeded: ...

    def describe_lost(self) -> list[dict[str, Any]]: ...


class ViewHeld(Protocol):
    """The view a worker holds of its peers: ``rule`` is None for the mesh (every worker,
    heartbeated every few ms), a candidate rule for the bounded view."""

    @property
    def rule(self) -> object | None: ...

    @property
    def view(self) -> ClusterView: ...


class Gossiping(Protocol):
    """A worker's gossip, whose port is the view it holds."""

    @property
    def port(self) -> ViewHeld: ...


def queue_status(worker: Holdings) -> dict[str, Any]:
    """The worker's queues and lanes as ``compass status`` and the dashboard show them."""
    lanes = worker.lanes
    return {
        "ready": len(lanes.queue),
        "waiting_inputs": worker.tasks_waiting_inputs,
        "running": lanes.busy,
        "lanes": lanes.lanes,
        "wait_ms": round(lanes.wait_s(worker.clock()) * 1000, 3),
        "host_ready": len(lanes.host_queue),
        "host_running": lanes.host_busy,
        "host_lanes": lanes.host_lanes,
        "stuck": lanes.stuck,
        "max_stuck": lanes.max_stuck,
        "degraded": lanes.degraded,
        # scheduling at step boundaries (``--preempt``) and the suspensions it made
        "preempt": lanes.preempt,
        "suspensions": lanes.suspensions,
    }
