"""Cluster membership: join through any known address, keep a channel to every peer, send
heartbeats, drop peers that fall silent or whose connection breaks, and take them back.

The mesh is full (every worker talks to every other); that suits the tens of workers compass
targets on a LAN. A peer is known by its name; two workers that connect to each other at once
end up with two channels, and the newer one is used.

Removal is not final (SWIM, as memberlist and Serf do it):

- Every worker ever seen is remembered (:class:`Member`: name, address, incarnation). A peer
  removed because it fell silent or its connection broke is retried from both sides, each on
  its own :class:`Backoff` (0.1 s doubling to 5 s, less up to half of it as jitter), until it
  answers; a peer lost for :attr:`Membership.forget_after_s` (a day, Serf's reconnect
  timeout) is forgotten.
- Each worker has an *incarnation*, 0 when it starts. Whoever declares a peer dead remembers
  the incarnation it died at, and says so at the next join handshake between the two (whichever
  side dials); the peer then takes the next incarnation. Heartbeats carry it: one of an older
  incarnation than the one recorded is stale and ignored, a newer one is adopted.
- Names are unique. Each worker process has a random *instance* id; a join under the name of a
  live peer of another instance is refused with :class:`~compass.errors.ConfigError` (the
  joiner exits, the cluster is not split). A name whose worker is lost may come back from a new
  instance (a restart): that is a rejoin.

The join handshake is the ``join`` request: ``{name, address, incarnation, instance, dead}``
one way, ``{name, address, incarnation, instance, dead, members, peers}`` back, where ``dead``
is the incarnation at which the sender declared the receiver dead (or ``None``), ``peers`` maps
the sender's live peers to their addresses and ``members`` lists those addresses (for workers
that predate ``peers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import random
import secrets
import socket
import ssl as _ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from compass.config import Limits, Timeouts, parse_address
from compass.errors import (
    CompassConnectionError,
    CompassError,
    CompassTimeout,
    ConfigError,
    ConnectFailed,
    ProtocolError,
    WorkerUnavailable,
)
from compass.wire.transport import Channel, Handler, NotifyHandler, connect

__all__ = [
    "Backoff",
    "Member",
    "Membership",
    "Peer",
    "advertised_address",
    "gossip_gap_s",
    "primary_address",
]

log = logging.getLogger("compass.worker")

#: a lost peer is forgotten after this long without answering (Serf's reconnect_timeout)
FORGET_AFTER_S = 24 * 3600.0

#: a peer that left on purpose is retried this long: it is most often restarting (a rolling
#: update, a new version), and a worker whose seed it was has no other way to find it again
FORGET_LEFT_AFTER_S = 3600.0

#: addresses that mean "every interface here": peers cannot connect to them
_WILDCARDS = ("0.0.0.0", "::", "")


def gossip_gap_s(min_gap_s: float, peers: int, max_rate: float) -> float:
    """The least seconds between two heartbeats of a worker with ``peers`` peers: at least
    ``min_gap_s``, and enough that it sends at most ``max_rate`` messages a second in all
    (a full mesh: one message per peer per heartbeat)."""
    return max(min_gap_s, peers / max_rate)


# -- where peers reach this worker ---------------------------------------------------------------
def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def primary_address(ipv6: bool = False) -> str:
    """This host's primary address: the source address of its route to the outside world (a
    UDP socket's ``connect`` to a documentation address picks the route and sends nothing),
    else what the host name resolves to, else loopback."""
    family, probe = (
        (socket.AF_INET6, ("2001:db8::1", 9)) if ipv6 else (socket.AF_INET, ("192.0.2.1", 9))
    )
    with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(probe)
        host = str(sock.getsockname()[0])
        if not _is_loopback(host) and host not in _WILDCARDS:
            return host
    if not ipv6:
        with contextlib.suppress(OSError):
            host = socket.gethostbyname(socket.gethostname())
            if not _is_loopback(host):
                return host
    return "::1" if ipv6 else "127.0.0.1"


def default_worker_name(port: int) -> str:
    """A worker started without ``--name`` is ``<host>-<port>``: unique wherever hosts are."""
    return f"{socket.gethostname().split('.')[0] or 'worker'}-{port}"


def advertised_address(bound_host: str, port: int, advertise: str = "") -> str:
    """The ``HOST:PORT`` this worker tells its peers to reach it at.

    ``advertise`` (``HOST`` or ``HOST:PORT``, the bound ``port`` when it has none) wins: a worker
    behind NAT or in a container knows better. Otherwise the bound host, unless it is a wildcard
    (``0.0.0.0``, ``::``), which no peer can connect to: then :func:`primary_address`. A worker
    never advertises a wildcard.
    """
    if advertise:
        host, given = parse_address(advertise, default_port=0)
        if host in _WILDCARDS:
            raise ConfigError(f"advertise address {advertise!r}: peers cannot reach a wildcard")
        return _join_host_port(host, given or port)
    if bound_host in _WILDCARDS:
        host = primary_address(ipv6=bound_host == "::")
        if _is_loopback(host):
            log.warning("bound to %s but found no address other hosts can reach (no route out, "
                        "the host name resolves to loopback); advertising %s: give "
                        "--advertise-address", bound_host, host)  # fmt: skip
        return _join_host_port(host, port)
    return _join_host_port(bound_host, port)


# -- retrying ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff with jitter: the n-th retry (n = 0, 1, ...) waits
    ``min(max_s, initial_s * factor**n)``, less up to ``jitter`` of it at random, so that
    workers that lost each other at the same moment do not retry in lockstep."""

    initial_s: float = 0.1
    max_s: float = 5.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ConfigError(
                f"Backoff needs 0 < initial_s <= max_s, got {self.initial_s!r}, {self.max_s!r}"
            )
        if not self.factor >= 1:
            raise ConfigError(f"Backoff.factor must be >= 1, got {self.factor!r}")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"Backoff.jitter must be in [0, 1), got {self.jitter!r}")

    def delay_s(self, failures: int, rand: float) -> float:
        """Seconds to wait after ``failures`` failed tries in a row; ``rand`` in [0, 1)."""
        try:
            base = min(self.max_s, self.initial_s * self.factor**failures)
        except OverflowError:
            base = self.max_s
        return base * (1.0 - self.jitter * rand)


#: the retries of a peer that left on purpose: soon and often, as it comes back within seconds
LEFT_BACKOFF = Backoff(initial_s=0.1, max_s=1.0)


# -- who is there --------------------------------------------------------------------------------
@dataclass(slots=True)
class Peer:
    """A live peer: the channel to it, and when it was last heard from."""

    name: str
    address: str
    channel: Channel
    last_seen: float
    joined_at: float


@dataclass(slots=True)
class Member:
    """What this worker remembers of a worker it has seen, live or lost."""

    name: str
    address: str
    #: its incarnation as this worker last heard it
    incarnation: int = 0
    #: its process's random id: another one under the same live name is a duplicate name
    instance: str = ""
    #: when it was last removed (this worker's clock); None while it is a peer
    lost_at: float | None = None
    #: the incarnation it was last declared dead at; it must come back with a higher one
    dead_incarnation: int | None = None
    #: failed reconnections since it was lost
    failures: int = 0
    #: when to try it next (lost members only)
    retry_at: float = math.inf
    #: it said it left (a planned stop): retried often, forgotten sooner
    left: bool = False

    @property
    def declared_dead(self) -> bool:
        """This worker declared it dead and has not heard of a newer incarnation since."""
        return self.dead_incarnation is not None and self.incarnation <= self.dead_incarnation


class Membership:
    """Who is in the cluster, as seen from one worker.

    ``clock`` is read for every time it keeps (join, last heartbeat, ages, expiry, retries):
    seconds that only move forward, :func:`time.monotonic` by default. ``backoff`` spaces the
    retries of a lost peer; ``rng`` draws their jitter.
    """

    def __init__(
        self,
        *,
        name: str,
        address: str,
        token: str | None,
        limits: Limits,
        timeouts: Timeouts,
        handler: Handler,
        notify_handler: NotifyHandler,
        on_join: Callable[[Peer], None],
        on_leave: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
        backoff: Backoff = Backoff(),
        rng: random.Random | None = None,
        forget_after_s: float = FORGET_AFTER_S,
        ssl: _ssl.SSLContext | None = None,
        instance: str | None = None,
    ) -> None:
        self.name = name
        self._ssl = ssl  # mutual TLS to peers, when the cluster uses it
        self.address = address
        self._token = token
        self._limits = limits
        self._timeouts = timeouts
        self._handler = handler
        self._notify_handler = notify_handler
        self._on_join = on_join
        self._on_leave = on_leave
        self._clock = clock
        self.backoff = backoff
        self._rng = rng if rng is not None else random.Random()
        self.forget_after_s = forget_after_s
        #: this worker's incarnation; raised when a peer says it declared it dead
        self.incarnation = 0
        #: this process's id, to tell a duplicate name from a rejoin
        self.instance = instance or secrets.token_hex(6)
        self.peers: dict[str, Peer] = {}
        #: every worker seen, live or lost, by name
        self.members: dict[str, Member] = {}
        #: heartbeats ignored for carrying an older incarnation than the one recorded
        self.stale_heartbeats = 0
        self._connecting: set[str] = set()
        self._closing: set[asyncio.Task[None]] = set()  # channels of removed peers, closing
        self._retries: dict[str, asyncio.Task[None]] = {}  # reconnections in flight, by name
        self._wake = asyncio.Event()  # a peer was lost or a retry ended: look at the schedule
        self._closed = False
        self._leaving = False  # said it leaves: takes nobody in any more
        #: the addresses this worker joined through (itself left out): tried again, with
        #: :attr:`backoff`, whenever it has no peer at all
        self.seeds: list[str] = []
        self._seed_failures = 0
        self._seed_retry_at = 0.0
        self._seed_retry: asyncio.Task[None] | None = None

    # -- joining -----------------------------------------------------------------------------
    async def join(self, addresses: Iterable[str], *, timeout_s: float | None = None) -> None:
        """Join the cluster through any of ``addresses`` (seeds), then connect to every member
        they know.

        While no seed answers, the seeds are tried again with :attr:`backoff` until one does or
        ``timeout_s`` passes (then :class:`ConnectFailed`); ``None`` tries each seed once. A
        refusal (the name is taken, a wrong token or version) is raised at once. A member that
        cannot be reached after the seed answered is left to :meth:`run` to retry. A seed that
        turns out to be this worker (by its instance, whatever address names it) is skipped; the
        others are kept, and tried again whenever this worker has no peer (:meth:`run`).
        """
        seeds = list(dict.fromkeys(addresses))
        if not seeds:
            return
        self.seeds = seeds  # _join_seeds drops this worker's own addresses from it
        pending = await self._join_seeds(seeds, timeout_s)
        tried = set(seeds)
        while pending:
            name, address = pending.pop()
            if name == self.name or name in self.peers or address in tried:
                continue
            tried.add(address)
            try:
                pending.extend(await self.connect_peer(address, expect=name))
            except ConfigError:
                raise  # refused: this worker's name is taken
            except CompassError as exc:
                log.info("%s: could not reach member %s at %s yet: %s", self.name, name,
                         address, exc)  # fmt: skip
                if name is not None:
                    self._lost(self._remember(name, address), self._clock())

    async def _join_seeds(
        self, seeds: list[str], timeout_s: float | None
    ) -> list[tuple[str | None, str]]:
        last: CompassError | None = None
        failures = 0
        deadline = None if timeout_s is None else self._clock() + timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    for seed in list(seeds):
                        try:
                            return await self.connect_peer(seed)
                        except (CompassConnectionError, CompassTimeout) as exc:
                            last = exc  # nobody listens there yet, or it does not answer
                        except ConfigError as exc:
                            if not (isinstance(exc.detail, dict) and exc.detail.get("itself")):
                                raise
                            seeds.remove(seed)  # this worker, by another address: not a seed
                    if not seeds:
                        return []  # the first worker of the cluster
                    if deadline is None:
                        assert last is not None
                        raise last
                    delay = min(self.backoff.delay_s(failures, self._rng.random()),
                                max(deadline - self._clock(), 0.0))  # fmt: skip
                    failures += 1
                    log.info("%s: could not join %s (%s); retrying in %.2f s", self.name,
                             ", ".join(seeds), last, delay)  # fmt: skip
                    await asyncio.sleep(delay)
        except TimeoutError as exc:
            if isinstance(exc, CompassError):  # a handshake timeout of the last seed, re-raised
                raise
            raise ConnectFailed(
                f"could not join the cluster at {', '.join(seeds)} within {timeout_s:g} s "
                f"(last error: {last or 'no answer'}); is a worker running there?"
            ) from None

    async def connect_peer(
        self, address: str, expect: str | None = None
    ) -> list[tuple[str | None, str]]:
        """Open a channel to the worker at ``address`` (named ``expect``, if known) and join
        it; returns the ``(name, address)`` of the members it knows (name ``None`` from a
        worker that predates names in the handshake)."""
        if address in self._connecting or self._closed:
            return []
        self._connecting.add(address)
        try:
            channel = await connect(
                address,
                token=self._token,
                name=self.name,
                role="worker",
                limits=self._limits,
                timeouts=self._timeouts,
                handler=self._handler,
                notify_handler=self._notify_handler,
                ssl=self._ssl,
            )
            if expect is None:  # a seed: it may be a lost member's address
                expect = next(
                    (m.name for m in self.members.values()
                     if m.address == address and m.lost_at is not None),
                    None,
                )  # fmt: skip
            try:
                known = self.members.get(expect) if expect is not None else None
                dead = known.dead_incarnation if known is not None and known.declared_dead else None
                reply = await channel.request("join", self._hello(dead))
                if not isinstance(reply, dict) or "name" not in reply or "address" not in reply:
                    raise ProtocolError(f"{address} answered join without its name and address")
                name = str(reply["name"])
                if expect is not None and name != expect:
                    self._moved(expect, address, name)
                instance = str(reply.get("instance", ""))
                if not self._unique(name, instance) and not self._restarted(
                    name, str(reply["address"])
                ):
                    log.error("%s: %s at %s has the name of live peer %s at %s; ignoring it",
                              self.name, name, address, name, self.peers[name].address)  # fmt: skip
                    await channel.aclose()
                    return []
                self._refute(reply.get("dead"), by=name)
                self.register(channel, name, str(reply["address"]),
                              incarnation=_int(reply.get("incarnation", 0)),
                              instance=str(reply.get("instance", "")))  # fmt: skip
            except BaseException:
                await channel.aclose()
                raise
            return _members_of(reply)
        finally:
            self._connecting.discard(address)

    def accept_join(self, channel: Channel, body: Any) -> dict[str, Any]:
        """Answer a peer's ``join`` request on an accepted channel; :class:`ConfigError` if its
        name is this worker's or a live peer's."""
        if not isinstance(body, dict) or "name" not in body or "address" not in body:
            raise CompassError("join needs {name, address}")
        name, address = str(body["name"]), str(body["address"])
        incarnation = _int(body.get("incarnation", 0))
        instance = str(body.get("instance", ""))
        if name == self.name:
            if instance == self.instance:
                raise ConfigError(
                    f"worker {name!r} tried to join itself at {self.address}",
                    detail={"name": name, "address": self.address, "itself": True},
                )
            raise ConfigError(
                f"the worker name {name!r} is taken: the worker at {self.address} has it; "
                "names must be unique in a cluster, so start this one with another --name",
                detail={"name": name, "address": self.address},
            )
        if self._leaving:
            raise WorkerUnavailable(f"worker {self.name} is leaving the cluster")
        if not self._unique(name, instance) and not self._restarted(name, address):
            taken = self.peers[name].address
            raise ConfigError(
                f"the worker name {name!r} is taken: the worker at {taken} has it; names "
                "must be unique in a cluster, so start this one with another --name",
                detail={"name": name, "address": taken},
            )
        self._refute(body.get("dead"), by=name)
        told = None
        known = self.members.get(name)
        if (
            known is not None
            and known.dead_incarnation is not None
            and incarnation <= known.dead_incarnation
            and "incarnation" in body  # a worker that predates incarnations stays at 0
        ):
            # it was declared dead here: it comes back one incarnation later (and adopts the
            # same number from this reply's "dead")
            told = known.dead_incarnation
            incarnation = told + 1
        self.register(channel, name, address, incarnation=incarnation, instance=instance)
        return {
            **self._hello(told),
            "members": [p.address for p in self.peers.values() if p.name != name],
            "peers": {p.name: p.address for p in self.peers.values() if p.name != name},
        }

    def _hello(self, dead: int | None) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "incarnation": self.incarnation,
            "instance": self.instance,
            "dead": dead,
        }

    def _unique(self, name: str, instance: str) -> bool:
        """False if ``name`` is a live peer's and ``instance`` says it is another process."""
        known = self.members.get(name)
        return not (
            name in self.peers
            and known is not None
            and known.instance
            and instance
            and known.instance != instance
        )

    def _restarted(self, name: str, address: str) -> bool:
        """A new instance of live peer ``name`` speaks from ``address``: True if that is where
        the peer listens, which makes it a restart (only one process can listen there, so the
        old one is gone, though its connection may not have said so yet): the old instance is
        removed, and its jobs with it. False: a second worker under a taken name."""
        peer = self.peers[name]
        if peer.address != address:
            return False
        self.remove(name, f"it restarted (a new instance of it answers at {address})")
        return True

    def _refute(self, dead: object, *, by: str) -> None:
        """``by`` says it declared this worker dead at incarnation ``dead``: take a newer one."""
        if dead is None:
            return
        declared = _int(dead)
        if declared >= self.incarnation:
            self.incarnation = declared + 1
            log.warning("%s: %s had declared this worker dead (incarnation %d); rejoined as "
                        "incarnation %d", self.name, by, declared, self.incarnation)  # fmt: skip

    def _moved(self, expected: str, address: str, name: str) -> None:
        """``address`` of lost ``expected`` now answers as ``name``: forget it there."""
        known = self.members.get(expected)
        if known is not None and known.lost_at is not None and known.address == address:
            del self.members[expected]
            log.info("%s: %s is now at %s, where %s was; forgetting %s", self.name, name,
                     address, expected, expected)  # fmt: skip

    def _remember(self, name: str, address: str) -> Member:
        known = self.members.get(name)
        if known is None:
            known = self.members[name] = Member(name, address)
        elif name not in self.peers:
            known.address = address  # a live peer's address is the one it joined with
        return known

    def register(
        self,
        channel: Channel,
        name: str,
        address: str,
        *,
        incarnation: int = 0,
        instance: str = "",
    ) -> None:
        """Make ``name`` a live peer on ``channel`` (a newer channel replaces an older one)."""
        if name == self.name:
            raise ConfigError(
                f"a worker named {name!r} is already this worker: names must be unique"
            )
        now = self._clock()
        known = self._remember(name, address)
        known.address = address
        back_after = None if known.lost_at is None else now - known.lost_at
        if instance and instance != known.instance:
            known.instance = instance
        known.incarnation = max(known.incarnation, incarnation)
        known.lost_at, known.failures, known.retry_at = None, 0, math.inf
        known.left = False
        old = self.peers.get(name)
        peer = Peer(name, address, channel, last_seen=now, joined_at=now)
        self.peers[name] = peer
        channel.on_close.append(lambda ch, exc: self._channel_closed(name, ch, exc))
        if old is None:
            if back_after is None:
                log.info("%s: peer %s joined from %s", self.name, name, address)
            else:
                log.warning("%s: peer %s is back after %.1f s (incarnation %d)", self.name, name,
                            back_after, known.incarnation)  # fmt: skip
            self._on_join(peer)

    def _channel_closed(self, name: str, channel: Channel, exc: BaseException | None) -> None:
        peer = self.peers.get(name)
        if peer is not None and peer.channel is channel:
            self.remove(name, f"connection closed ({exc or 'by peer'})")

    def remove(self, name: str, why: str) -> None:
        """Declare peer ``name`` dead at its current incarnation, and start retrying it."""
        peer = self.peers.pop(name, None)
        if peer is None:
            return
        log.warning("%s: peer %s removed: %s", self.name, name, why)
        known = self._remember(name, peer.address)
        known.dead_incarnation = known.incarnation
        self._lost(known, self._clock())
        if not peer.channel.closed:
            task = asyncio.get_running_loop().create_task(peer.channel.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self._on_leave(name, why)

    def left(self, name: str, why: str) -> None:
        """Peer ``name`` left on purpose: remove it, and retry it soon and often
        (:data:`LEFT_BACKOFF`) for :data:`FORGET_LEFT_AFTER_S`: a worker that leaves is most
        often restarting, and where it was the seed, its peers are how it finds the cluster."""
        known = self.members.get(name)
        if known is not None:
            known.left = True
            known.failures = 0
        self.remove(name, why)
        log.info("%s: %s left the cluster", self.name, name)

    def _lost(self, member: Member, now: float) -> None:
        if member.lost_at is None:
            member.lost_at, member.failures = now, 0
        backoff = LEFT_BACKOFF if member.left else self.backoff
        member.retry_at = now + backoff.delay_s(member.failures, self._rng.random())
        self._wake.set()

    # -- liveness ----------------------------------------------------------------------------
    def seen(self, name: str, incarnation: int | None = None) -> bool:
        """A heartbeat of ``name`` (of ``incarnation``, if it says) arrived: True if it counts.

        It does not if ``name`` is no peer, or if it is of an older incarnation than the one
        recorded (sent before the peer was declared dead and came back). A newer incarnation
        is adopted."""
        peer = self.peers.get(name)
        if peer is None:
            return False
        if incarnation is not None:
            known = self.members[name]
            if incarnation < known.incarnation:
                self.stale_heartbeats += 1
                return False
            known.incarnation = incarnation
        peer.last_seen = self._clock()
        return True

    def expire(self, timeout_s: float) -> list[str]:
        """Remove peers silent for longer than ``timeout_s``; returns their names."""
        now = self._clock()
        silent = [p.name for p in self.peers.values() if now - p.last_seen > timeout_s]
        for name in silent:
            self.remove(name, f"silent for more than {timeout_s * 1000:.0f} ms")
        return silent

    # -- taking lost peers back --------------------------------------------------------------
    def due(self, now: float) -> list[str]:
        """Lost members whose next try is due at ``now`` and not already under way (forgetting
        those lost longer than :attr:`forget_after_s`)."""
        for name in [
            m.name
            for m in self.members.values()
            if m.lost_at is not None
            and now - m.lost_at > (FORGET_LEFT_AFTER_S if m.left else self.forget_after_s)
        ]:
            log.info("%s: forgetting %s, unreachable for %.0f s", self.name, name,
                     now - (self.members[name].lost_at or now))  # fmt: skip
            del self.members[name]
        return [
            m.name
            for m in self.members.values()
            if m.lost_at is not None and m.retry_at <= now and m.name not in self._retries
        ]

    def failed(self, name: str, error: BaseException) -> None:
        """A try to reach lost ``name`` failed: back off further."""
        known = self.members.get(name)
        if known is None or known.lost_at is None:
            return
        known.failures += 1
        self._lost(known, self._clock())
        level = logging.INFO if known.failures == 1 else logging.DEBUG
        log.log(level, "%s: %s at %s still unreachable (%s); next try in %.2f s", self.name,
                name, known.address, error, known.retry_at - self._clock())  # fmt: skip

    async def run(self) -> None:
        """Retry lost peers, each on its own backoff, and the seeds while this worker has no
        peer at all, until cancelled."""
        while not self._closed:
            self._wake.clear()
            now = self._clock()
            for name in self.due(now):
                self._retries[name] = asyncio.create_task(
                    self._retry(name), name=f"{self.name}-rejoin-{name}"
                )
            alone = not self.peers and bool(self.seeds) and self._seed_retry is None
            if alone and self._seed_retry_at <= now:
                self._seed_retry = asyncio.create_task(
                    self._retry_seeds(), name=f"{self.name}-rejoin-seeds"
                )
            waiting = [
                m.retry_at
                for m in self.members.values()
                if m.lost_at is not None and m.name not in self._retries
            ]
            if alone and self._seed_retry is None:
                waiting.append(self._seed_retry_at)
            wait_s = min(waiting, default=math.inf) - now
            if math.isinf(wait_s):
                await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait_s, 0.0)):
                    await self._wake.wait()

    async def _retry(self, name: str) -> None:
        try:
            known = self.members.get(name)
            if known is None or known.lost_at is None:
                return
            try:
                await self.connect_peer(known.address, expect=name)
            except ConfigError as exc:  # refused: the name clash needs a person
                log.warning("%s: %s at %s refused to take this worker back: %s", self.name, name,
                            known.address, exc)  # fmt: skip
                self.failed(name, exc)
            except (CompassError, OSError) as exc:
                self.failed(name, exc)
            except Exception as exc:  # a bug must not stop the retries of every peer
                log.exception("%s: reconnecting to %s failed", self.name, name)
                self.failed(name, exc)
            else:
                if name not in self.peers:  # already connecting, or it answered as another
                    self.failed(name, ConnectFailed("no connection"))
        finally:
            self._retries.pop(name, None)
            self._wake.set()

    async def _retry_seeds(self) -> None:
        """Join through the seeds again (this worker has no peer): once each, then back off."""
        try:
            await self.join(self.seeds, timeout_s=None)
        except ConfigError as exc:  # refused: the name clash needs a person
            log.warning("%s: a seed refused this worker: %s", self.name, exc)
            self._seeds_failed()
        except (CompassError, OSError) as exc:
            log.debug("%s: no seed answered: %s", self.name, exc)
            self._seeds_failed()
        except Exception:  # a bug must not stop the retries
            log.exception("%s: joining the seeds again failed", self.name)
            self._seeds_failed()
        else:
            self._seed_failures = 0
        finally:
            self._seed_retry = None
            self._wake.set()

    def _seeds_failed(self) -> None:
        self._seed_retry_at = self._clock() + self.backoff.delay_s(
            self._seed_failures, self._rng.random()
        )
        self._seed_failures += 1

    # -- talking -----------------------------------------------------------------------------
    def broadcast(self, op: str, body: Any) -> None:
        for peer in list(self.peers.values()):
            if not peer.channel.closed:
                peer.channel.notify(op, body)

    def channel(self, name: str) -> Channel | None:
        peer = self.peers.get(name)
        return None if peer is None else peer.channel

    def describe(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [
            {
                "name": p.name,
                "address": p.address,
                "age_ms": round((now - p.last_seen) * 1000, 1),
                "incarnation": self.members[p.name].incarnation,
            }
            for p in sorted(self.peers.values(), key=lambda p: p.name)
        ]

    def describe_lost(self) -> list[dict[str, Any]]:
        """The members lost and being retried: since when, how often, the next try."""
        now = self._clock()
        return [
            {
                "name": m.name,
                "address": m.address,
                "lost_s": round(now - m.lost_at, 3),
                "failures": m.failures,
                "retry_in_s": round(max(m.retry_at - now, 0.0), 3),
                "left": m.left,
            }
            for m in sorted(self.members.values(), key=lambda m: m.name)
            if m.lost_at is not None
        ]

    def leave(self) -> None:
        """Tell every peer this worker leaves on purpose (they retry it soon, see
        :meth:`left`), and take nobody in from now on."""
        self._leaving = True
        self.broadcast("leave", {"name": self.name})

    async def aclose(self) -> None:
        self._closed = True
        self._wake.set()
        retries = list(self._retries.values())
        if self._seed_retry is not None:
            retries.append(self._seed_retry)
        for task in retries:
            task.cancel()
        peers = list(self.peers.values())
        self.peers.clear()
        await asyncio.gather(
            *retries,
            *(p.channel.aclose() for p in peers),
            *self._closing,
            return_exceptions=True,
        )


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"join: an incarnation must be an integer >= 0, got {value!r}")
    return value


def _members_of(reply: dict[str, Any]) -> list[tuple[str | None, str]]:
    named = reply.get("peers")
    if isinstance(named, dict):
        return [(str(n), str(a)) for n, a in named.items()]
    return [(None, str(a)) for a in reply.get("members", [])]
