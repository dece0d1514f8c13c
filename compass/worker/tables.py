"""The sizes of a worker's tables keyed by jobs, peers or time (:func:`table_sizes`), for
``compass status`` and ``compass bench soak``: every table must stay within its bound or expire
its entries (docs/RESULTS.md, "Soak"). Reading them changes nothing. The process's own usage
(memory, descriptors, threads) is :func:`compass.observe.usage.process_usage`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sized
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from compass.core.state import WorkerCore
    from compass.observe.metrics import WorkerMetrics
    from compass.observe.tracing import Tracer
    from compass.supervisor import Supervisor
    from compass.wire.channel import Channel
    from compass.wire.tcp import Server
    from compass.worker.gossip import Gossip
    from compass.worker.membership import Membership
    from compass.worker.outbox import Outbox
    from compass.worker.windows import StreamedSteps

__all__ = ["Tabled", "table_sizes"]


class Tabled(Protocol):
    """What is read of a worker (:class:`compass.worker.server.Worker`): its core, services and
    the adapter's own tables, private ones included (this module is the adapter's)."""

    @property
    def core(self) -> WorkerCore: ...

    @property
    def metrics(self) -> WorkerMetrics: ...

    @property
    def supervisor(self) -> Supervisor: ...

    @property
    def trace(self) -> deque[dict[str, Any]]: ...

    @property
    def tracer(self) -> Tracer: ...

    @property
    def streamed(self) -> StreamedSteps: ...

    @property
    def gossip(self) -> Gossip: ...

    @property
    def membership(self) -> Membership | None: ...

    @property
    def outbox(self) -> Outbox: ...

    @property
    def _answers(self) -> Sized: ...

    @property
    def _planned(self) -> Sized: ...

    @property
    def _server(self) -> Server | None: ...


def table_sizes(worker: Tabled) -> dict[str, float]:
    """Entries in each of ``worker``'s tables keyed by jobs, peers or time, by name: its
    core's (ingress jobs, the inbox, finished jobs, job keys and the answers kept of them,
    links), the adapter's (clients' futures, tasks, held messages, traces, timeline),
    membership's and the view's. Read-only; private tables are read where they live."""
    core = worker.core
    links = core.links
    timeline = worker.metrics.timeline
    sizes = {
        # the core: jobs and what it remembers of answered ones
        "jobs": len(core.ingress.jobs),
        "inbox": len(core.inbox),
        "finished": len(core._finished),
        "keys": len(core.ingress.keys),
        "answered_keys": len(core.ingress.answered),
        "answered_values": core.ingress.answered.values,
        "answered_mb": round(core.ingress.answered.bytes / (1 << 20), 3),
        "attached": len(core.ingress.attached),
        "links_sent": len(links),
        "links_jobs": len(links._peers),
        "links_orphans": links.orphaned,
        "stimuli": len(core.log),  # its stimulus log: a ring, at most keep_stimuli
        # the adapter
        "answers": len(worker._answers),
        "tasks": len(worker.supervisor),  # its background tasks, the loops among them
        "held": _total(worker.outbox.held.values()),
        "dialing": len(worker.outbox.dialing),
        "planned": len(worker._planned),
        "trace": len(worker.trace),
        "tracer_jobs": len(worker.tracer.jobs),
        "tracer_kept": len(worker.tracer.kept),
        "timeline_spans": len(timeline.spans),
        "timeline_jobs": len(timeline.jobs),
        "timeline_loads": len(timeline.loads),
        "slo": len(worker.metrics.slo),
        "streams": len(worker.metrics.streams),  # streamed jobs being read here
        "step_windows": len(worker.streamed),  # streamed sinks running here
        # the view of the peers
        "view": len(worker.gossip.port.view),
        "view_pending": _total(worker.gossip.port.view._pending.values()),
        "early_states": len(worker.gossip._early),
        "watchers": len(worker.gossip.port.watchers),
    }
    channels: list[Channel] = []
    if worker._server is not None:
        sizes["client_channels"] = len(worker._server.channels)
        channels += worker._server.channels
    membership = worker.membership
    if membership is not None:
        table, held = membership.table, membership.channels.sizes()
        sizes.update(
            members=len(table.members),
            peers=held["peers"],
            lost=len(table._retrying),
            suspicions=len(table.detector.suspicions),
            member_stimuli=len(table.log),
            peer_channels=held["peer_channels"],
            queued_notifies=held["queued_notifies"],
            retries=len(membership._retries),
        )
        channels += membership.channels.open_list()
    sizes["handler_tasks"] = sum(len(c._handler_tasks) for c in channels)
    sizes["request_waiters"] = sum(len(c._waiters) for c in channels)
    return sizes


def _total(groups: Iterable[Sized]) -> int:
    return sum(len(group) for group in groups)
