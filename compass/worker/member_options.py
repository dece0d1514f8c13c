"""How a worker's membership service (:class:`~compass.worker.membership.Membership`) reaches
its peers and decides about them: :class:`MembershipOptions`, and
:meth:`MembershipOptions.of_worker`, which builds them from the worker's configuration (its
one source: ``compass worker start``'s flags and :class:`~compass.config.WorkerConfig`'s
defaults).
"""

from __future__ import annotations

import math
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from compass.config import WorkerConfig
from compass.errors import ConfigError
from compass.membership.swim import Probing
from compass.membership.table import FORGET_AFTER_S, Backoff
from compass.wire.tcp import Dialer
from compass.wire.transport import ChannelOptions, connect
from compass.worker.peer_channels import MAX_PEER_CHANNELS, MAX_QUEUED, PEER_IDLE_S

__all__ = ["MembershipOptions"]


@dataclass(frozen=True, slots=True)
class MembershipOptions:
    """How one worker's :class:`Membership` reaches its peers and decides about them.

    ``channels``: what it dials its peers with: its name (this worker's), the cluster's token,
    limits, timeouts, and TLS to peers when the cluster uses it. ``instance``: this process's
    id (None: a random one). ``backoff`` spaces the retries of a lost peer;
    ``forget_after_s``: one lost this long is forgotten; ``probing`` times the failure
    detector. ``dial`` opens the channels (:func:`compass.wire.tcp.connect`, or an in-memory
    network's ``connect``). ``clock`` is read for every time the table keeps (join, last
    heartbeat, ages, probes, suspicions, retries): seconds that only move forward,
    :func:`time.monotonic` by default. ``rng`` draws the retries' jitter and the probe order
    (None: a fresh ``random.Random``).

    Channels to peers are opened on demand: ``idle_s`` closes one that carried nothing either
    way that long (0: never), ``max_channels`` caps those open at once (the least recently
    used idle one is closed first; 0: no cap), ``max_queued`` bounds the notifies waiting for
    one peer while it is dialed.
    """

    channels: ChannelOptions
    instance: str | None = None
    backoff: Backoff = field(default_factory=Backoff)
    forget_after_s: float = FORGET_AFTER_S
    probing: Probing = field(default_factory=Probing)
    dial: Dialer = connect
    clock: Callable[[], float] = time.monotonic
    rng: random.Random | None = None
    idle_s: float = PEER_IDLE_S
    max_channels: int = MAX_PEER_CHANNELS
    max_queued: int = MAX_QUEUED

    def __post_init__(self) -> None:
        if not 0 <= self.idle_s < math.inf:
            raise ConfigError(
                f"MembershipOptions.idle_s must be seconds >= 0 (0: never), got {self.idle_s!r}"
            )
        for what, value in (("max_channels", self.max_channels), ("max_queued", self.max_queued)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"MembershipOptions.{what} must be an integer >= 0, got "
                                  f"{value!r}")  # fmt: skip

    @classmethod
    def of_worker(
        cls, config: WorkerConfig, name: str, instance: str, tls: ssl.SSLContext | None
    ) -> MembershipOptions:
        """The options of worker ``name`` (process ``instance``) run with ``config``; ``tls``:
        its client context to peers, if the cluster uses TLS."""
        return cls(
            ChannelOptions(
                name=name,
                token=config.token,
                limits=config.limits,
                timeouts=config.timeouts,
                ssl=tls,
            ),
            instance=instance,
            probing=Probing(
                period_s=config.swim.probe_period_ms / 1000.0,
                timeout_s=config.swim.probe_timeout_ms / 1000.0,
                indirect=config.swim.indirect_probes,
                suspicion_mult=config.swim.suspicion_mult,
                suspicion_max_s=config.sched.peer_timeout_ms / 1000.0,
            ),
            idle_s=config.peer_idle_s,
            max_channels=config.max_peer_channels,
        )
