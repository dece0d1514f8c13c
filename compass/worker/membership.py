r"""Cluster membership, the asyncio side: join through any known address, open channels to peers
on demand, and carry out what the member table decides.

The rules (who joins, who is refused, incarnations, who is retried when and who is forgotten)
are the sans-IO :class:`~compass.membership.table.MemberTable`'s; this module turns what happens
on the wire and in time into its events, and carries out its decisions: it dials, answers the
``join`` request, installs and closes channels, runs the retries as tasks and logs. Where this
worker is reached is :mod:`~compass.worker.addresses`'s.

A peer is live per the table whether or not a channel to it is open: channels are opened on
demand, closed when idle and capped by its :attr:`Membership.channels`
(:class:`~compass.worker.peer_channels.PeerChannels`). What the table keeps (this worker's
name, address and incarnation, the members, the seeds) is read on :attr:`Membership.table`.
A peer is known by its name; two workers that connect to each other at once end up with two
channels, and the newer one is used.

Failure detection is the table's (SWIM, see :mod:`~compass.membership.table`); this side sends
its probes, acks, nacks and probe requests as notifies over the peer channels
(:meth:`Membership.route` serves them), dials a peer it must probe but has no channel to (so a
broken channel is no verdict: the peer is probed through a new one, and through others), and
runs the table's timers in :meth:`Membership.run`.

Channels are opened with :attr:`MembershipOptions.dial` (:func:`compass.wire.tcp.connect` by
default): a :class:`~compass.wire.memory.MemoryNetwork`'s ``connect`` runs membership with no
sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import random
import secrets
from collections.abc import Callable, Iterable
from typing import Any, assert_never

from compass.errors import (
    CompassConnectionError,
    CompassError,
    CompassTimeout,
    ConfigError,
    ConnectFailed,
)
from compass.gossip.spread import gossip_gap_s
from compass.membership.events import (
    PROBE_OPS,
    Acked,
    AskIndirect,
    ChannelLost,
    Close,
    Decision,
    Dial,
    Duplicate,
    Event,
    Fault,
    ForgetAfter,
    Forgot,
    Fresh,
    HeardFrom,
    JoinAnswered,
    JoinAsked,
    JoinSeeds,
    Leave,
    Left,
    Listens,
    Moved,
    Nacked,
    Named,
    NotASeed,
    NotReached,
    PeerDown,
    PeerUp,
    Pinged,
    ProbeAsked,
    ProbeUnsent,
    Refuse,
    Refuted,
    Remove,
    RetryAt,
    RetryFailed,
    Seeds,
    SeedsAnswered,
    SeedsFailed,
    SendAck,
    SendNack,
    SendProbe,
    Stale,
    Stalled,
    Suspect,
    Tick,
    Unsuspected,
    Welcome,
    members_of,
    named_in,
    parse_join,
    parse_probe,
    parse_welcome,
)
from compass.membership.swim import Probing
from compass.membership.table import (
    FORGET_AFTER_S,
    FORGET_LEFT_AFTER_S,
    LEFT_BACKOFF,
    Backoff,
    Member,
    MemberTable,
)
from compass.supervisor import OnFailure, Supervisor, log_failures
from compass.wire.rpc import Router
from compass.wire.transport import Channel, Handler, NotifyHandler
from compass.worker.addresses import advertised_address, default_worker_name, primary_address
from compass.worker.member_options import MembershipOptions
from compass.worker.peer_channels import BYE_OP, Peer, PeerChannels
from compass.worker.stalls import StallCheck
from compass.workflow.versions import AppStamp

__all__ = [
    "FORGET_AFTER_S",
    "FORGET_LEFT_AFTER_S",
    "LEFT_BACKOFF",
    "Backoff",
    "Member",
    "Membership",
    "MembershipOptions",
    "Peer",
    "Probing",
    "advertised_address",
    "default_worker_name",
    "gossip_gap_s",
    "primary_address",
]

log = logging.getLogger("compass.worker")


class Membership:
    """Who is in the cluster, as seen from one worker.

    ``address`` is where peers reach this worker (:meth:`listen_at` changes it);
    ``options`` (:class:`MembershipOptions`) its name, how it dials and its timings. It
    composes the rules and what they keep, :attr:`table` (a
    :class:`~compass.membership.table.MemberTable`), and the channels to the live peers,
    :attr:`channels` (a :class:`~compass.worker.peer_channels.PeerChannels`): what is sent to
    a peer goes through the latter. Its channels answer requests with ``handler`` and
    notifies with ``notify_handler``;
    ``on_join`` is called with each peer that joins (or comes back), ``on_leave`` with the
    name of each one removed and why; ``on_failure`` with each of its background tasks (a
    retry, a dial, a probe, the idle-channel sweeper) that fails in a way nobody foresaw,
    once it is logged (see :class:`~compass.supervisor.Supervisor`).
    """

    def __init__(
        self,
        address: str,
        options: MembershipOptions,
        *,
        handler: Handler,
        notify_handler: NotifyHandler,
        on_join: Callable[[Peer], None],
        on_leave: Callable[[str, str], None],
        on_failure: OnFailure | None = None,
    ) -> None:
        #: the rules and what they keep: members, incarnations, schedules, probes
        self.table = MemberTable(
            options.channels.name,
            address,
            instance=options.instance or secrets.token_hex(6),
            rng=options.rng if options.rng is not None else random.Random(),
            backoff=options.backoff,
            forget_after_s=options.forget_after_s,
            probing=options.probing,
        )
        #: this worker's name (the table's, which never changes): in every log line
        self.name = options.channels.name
        self._channels = options.channels  # TLS among them: mutual TLS to peers, if any
        self._handler = handler
        self._notify_handler = notify_handler
        self._on_join = on_join
        self._on_leave = on_leave
        self._clock = options.clock
        self._dial = options.dial
        self._connecting: set[str] = set()
        #: suspicions of this worker it refuted, and declarations of its death it came back
        #: from (its status's stats count them)
        self.suspicions_refuted = 0
        self.deaths_refuted = 0
        #: its background tasks: retries, dials, probes, closing channels, the sweeper
        self._tasks = Supervisor(options.channels.name, log, on_failure=on_failure)
        #: the live peers and the channels to them, opened on demand
        self.channels = PeerChannels(
            options.channels.name,
            options.channels.timeouts,
            self._tasks,
            reach=self._reach,
            lost=self._channel_lost,
            idle_s=options.idle_s,
            max_channels=options.max_channels,
            max_queued=options.max_queued,
        )
        self._retries: dict[str, asyncio.Task[None]] = {}  # reconnections in flight, by name
        self._wake = asyncio.Event()  # a peer was lost or a retry ended: look at the schedule
        self._closed = False
        self._seed_retry: asyncio.Task[None] | None = None
        #: joins under way (the first one, from start): the seeds are being tried already
        self._joining = 0
        self._sweeper: asyncio.Task[None] | None = None
        #: this worker's own loop stalls, told the table (armed by :meth:`run`)
        self._stalls = StallCheck(self._stalled)
        #: join handshakes this worker made: joining (through a seed, asking for the member
        #: list) and redials of known peers (a send, a probe, a retry; no list)
        self.handshakes = {"join": 0, "redial": 0}
        self.stamp = AppStamp()  # the app served (set at start): another's join is refused

    # -- what the table keeps, told as events -------------------------------------------------
    def listen_at(self, address: str) -> None:
        """Peers reach this worker at ``address`` from now on (told them in the handshake)."""
        self._apply(Listens(self._clock(), address))

    def forget_after(self, seconds: float) -> None:
        """A member lost ``seconds`` without answering is forgotten from now on."""
        self._apply(ForgetAfter(self._clock(), seconds))

    def use_seeds(self, addresses: Iterable[str]) -> None:
        """The addresses this worker joins through (itself left out): tried again, with the
        table's backoff, whenever it has no peer at all."""
        self._apply(Seeds(self._clock(), tuple(addresses)))

    # -- carrying out the table's decisions --------------------------------------------------
    def _apply(self, event: Event, channel: Channel | None = None) -> list[Decision]:
        """Feed ``event`` to the table and carry out its decisions (``channel``: the one the
        join or the probe message came on). Raises a :class:`Refuse`'s error; returns the
        decisions, for the caller to read its answer in."""
        decisions = self.table.handle(event)
        if type(event) is not Tick and (type(event) is not HeardFrom or len(decisions) > 1):
            self._wake.set()  # a probe, a suspicion or a retry may be due sooner: look again
        for decision in decisions:
            match decision:
                case SendProbe():
                    self._send_probe(decision)
                case AskIndirect():
                    body = decision.to_wire(self.name)
                    for name in decision.via:
                        self.channels.send(name, "probe-req", body)
                case SendAck() | SendNack():
                    op = "ack" if type(decision) is SendAck else "nack"
                    # an answer to the message just read goes back the way that came
                    back = None
                    if isinstance(event, (Pinged, ProbeAsked, Acked, Nacked)):
                        back = channel if event.sender == decision.to else None
                    wire = decision.to_wire(self.name)
                    if not self.channels.send_on(back, op, wire):
                        self.channels.send(decision.to, op, wire)
                case Suspect():
                    log.warning("%s: suspects %s (incarnation %d, first by %s): declared dead "
                                "in %.0f ms unless it refutes", self.name, decision.name,
                                decision.incarnation, decision.by,
                                decision.timeout_s * 1000)  # fmt: skip
                case Unsuspected():
                    log.info("%s: %s refuted its suspicion (incarnation %d)", self.name,
                             decision.name, decision.incarnation)  # fmt: skip
                case PeerUp():  # on the join's channel; one named (in an update) has none yet
                    joining = isinstance(event, (JoinAsked, JoinAnswered))
                    self._up(decision, channel if joining else None)
                case PeerDown():
                    self._down(decision)
                case RetryAt():
                    self._wake.set()
                case Refuse():
                    raise decision.error()
                case Refuted(suspected=True):
                    self.suspicions_refuted += 1
                    log.info("%s: %s suspected this worker (incarnation %d); refuted as "
                             "incarnation %d", self.name, decision.by, decision.declared,
                             decision.incarnation)  # fmt: skip
                case Refuted():
                    self.deaths_refuted += 1
                    log.warning("%s: %s had declared this worker dead (incarnation %d); rejoined "
                                "as incarnation %d", self.name, decision.by, decision.declared,
                                decision.incarnation)  # fmt: skip
                case Moved():
                    log.info("%s: %s is now at %s, where %s was; forgetting %s", self.name,
                             decision.name, decision.address, decision.expected,
                             decision.expected)  # fmt: skip
                case Forgot():
                    log.info("%s: forgetting %s, unreachable for %.0f s", self.name,
                             decision.name, decision.lost_s)  # fmt: skip
                case Duplicate():
                    log.error("%s: %s at %s has the name of live peer %s at %s; ignoring it",
                              self.name, decision.name, decision.address, decision.name,
                              decision.live_address)  # fmt: skip
                case Fault():  # a bug: what was decided before it is carried out, above
                    log.error("%s: the member table failed on %s", self.name, decision.cause,
                              exc_info=decision.error)  # fmt: skip
                case Welcome() | Dial() | JoinSeeds() | Fresh() | Stale():
                    pass  # answers, read by the caller
                case _:
                    assert_never(decision)
        return decisions

    def _up(self, up: PeerUp, channel: Channel | None) -> None:
        """``up.name`` is a live peer; ``channel``: the one its join came on (None: it was
        named by another worker, and is dialed when there is something to send)."""
        name = up.name
        live = self.table.live[name]
        peer, reconnected = self.channels.up(live, channel, replaces=up.replaces)
        if up.replaces:
            if reconnected:  # as good as joined
                log.info("%s: reconnected to peer %s", self.name, name)
                self._on_join(peer)
            return
        if up.back_after_s is None:
            log.info("%s: peer %s joined from %s", self.name, name, up.address)
        else:  # routine (a restart, a healed link): its loss was the warning
            log.info("%s: peer %s is back after %.1f s (incarnation %d)", self.name, name,
                     up.back_after_s, up.incarnation)  # fmt: skip
        self._on_join(peer)

    def _down(self, down: PeerDown) -> None:
        member = self.table.members.get(down.name)  # one that left on purpose is routine
        left = member is not None and member.left  # (the worker's re-planning line is INFO)
        log.log(logging.INFO if left else logging.WARNING, "%s: peer %s removed: %s", self.name,
                down.name, down.why)  # fmt: skip
        self.channels.down(down.name)
        self._on_leave(down.name, down.why)

    def _channel_lost(self, name: str) -> None:
        """The channel to peer ``name`` broke, and no other is open: the table probes it."""
        self._apply(ChannelLost(self._clock(), name))

    # -- probing -----------------------------------------------------------------------------
    def route(self, router: Router) -> None:
        """Serve the failure detector's messages (:data:`~.member_events.PROBE_OPS`) on
        ``router``: from workers only."""
        for op in PROBE_OPS:
            router.add_notify(op, functools.partial(self._on_probe_message, op))
        router.add_notify(BYE_OP, self.channels.on_bye)

    def _on_probe_message(self, op: str, channel: Channel, body: Any) -> None:
        if channel.peer_role != "worker":
            log.warning("%s: dropped %r from a %s", self.name, op, channel.peer_role or "stranger")
            return
        if not self._closed:  # a malformed one raises ProtocolError: the channel drops it
            self.spoke(channel.peer_name)
            self._apply(parse_probe(op, body, self._clock()), channel)

    def _send_probe(self, probe: SendProbe) -> None:
        body = probe.to_wire(self.name)
        channels = self.channels
        if channels.send_on(channels.channel(probe.target), "probe", body):
            return
        self._tasks.spawn(
            self._probe_through_dial(probe, body), name=f"{self.name}-probe-{probe.target}"
        )

    async def _probe_through_dial(self, probe: SendProbe, body: Any) -> None:
        """No channel to the probe's target: dial it (one dial per peer at a time), then send
        it; if that fails, the table hears it could not be sent."""
        try:
            channel = await asyncio.shield(self.channels.reach(probe.target, probe.address))
            if self.channels.send_on(channel, "probe", body):
                return
        except (CompassError, OSError) as exc:
            log.debug("%s: could not reach %s to probe it: %s", self.name, probe.target, exc)
            if not self._closed:
                self._apply(ProbeUnsent(self._clock(), probe.seq, _refused(exc)))
            return
        if not self._closed:
            self._apply(ProbeUnsent(self._clock(), probe.seq))

    async def _reach(self, name: str, address: str) -> Channel:
        for attempt in range(3):  # the peer may close a channel as it opens (over its cap)
            if attempt:
                await asyncio.sleep(0.05 * attempt)
            await self.connect_peer(address, expect=name, want_list=False)
            channel = self.channels.channel(name)
            if channel is not None:
                return channel
            if name not in self.channels.peers:
                break
        raise ConnectFailed(f"{name} at {address} did not take this worker's join")

    # -- joining -----------------------------------------------------------------------------
    async def join(self, addresses: Iterable[str], *, timeout_s: float | None = None) -> None:
        """Join the cluster through any of ``addresses`` (seeds): the first that answers is
        the one worker dialed; the members its welcome names are live peers at once, dialed
        when there is something to send them (a worker that predates names in the welcome
        names addresses only: those are dialed).

        While no seed answers, the seeds are tried again with the table's backoff until one does or
        ``timeout_s`` passes (then :class:`ConnectFailed`); ``None`` tries each seed once. A
        refusal (the name is taken, a wrong token or version) is raised at once. A member that
        cannot be reached after the seed answered is left to :meth:`run` to retry. A seed that
        turns out to be this worker (by its instance, whatever address names it) is skipped; the
        others are kept, and tried again whenever this worker has no peer (:meth:`run`).
        """
        seeds = list(dict.fromkeys(addresses))
        if not seeds:
            return
        self._joining += 1
        try:
            await self._join(seeds, timeout_s)
        finally:
            self._joining -= 1

    async def _join(self, seeds: list[str], timeout_s: float | None) -> None:
        self._apply(Seeds(self._clock(), tuple(seeds)))
        pending = await self._join_seeds(seeds, timeout_s)
        tried = set(seeds)
        while pending:
            name, address = pending.pop()
            if name == self.name or name in self.channels.peers or address in tried:
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
                    self._apply(NotReached(self._clock(), name, address))

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
                            self._apply(NotASeed(self._clock(), seed))
                    if not seeds:
                        return []  # the first worker of the cluster
                    if deadline is None:
                        assert last is not None
                        raise last
                    delay = min(self.table.backoff.delay_s(failures, self.table.rng.random()),
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
        self, address: str, expect: str | None = None, *, want_list: bool = True
    ) -> list[tuple[str | None, str]]:
        """Open a channel to the worker at ``address`` (named ``expect``, if known) and join
        it. ``want_list``: ask for the members it knows, and take those it names as live
        peers (not dialed); returns the addresses of those it does not name (``(None,
        address)``, from a worker that predates names in the handshake), for the caller to
        dial. A redial of a known peer asks for no list (``want_list=False``)."""
        if address in self._connecting or self._closed or self.table.leaving:
            return []  # a leaving worker dials nobody: its peers would take it in again
        self._connecting.add(address)
        try:
            channel = await self._dial(
                address,
                self._channels,
                role="worker",
                handler=self._handler,
                notify_handler=self._notify_handler,
            )
            self.handshakes["join" if want_list else "redial"] += 1
            if expect is None:  # a seed: it may be a lost member's address
                expect = self.table.lost_at_address(address)
            try:
                hello = self.table.hello(self.table.dead_for(expect)).to_wire()
                hello.update(self.stamp.to_wire(), **({} if want_list else {"list": False}))
                reply = await channel.request("join", hello)
                answer = parse_welcome(self.stamp.checked(reply), address)
                event = JoinAnswered(self._clock(), address, expect, answer)
                if not any(type(d) is PeerUp for d in self._apply(event, channel)):
                    await channel.aclose()  # a duplicate, or an answer too old to take
                    return []
            except BaseException:
                await channel.aclose()
                raise
            if not want_list:
                return []
            self._apply(Named(self._clock(), answer.name, named_in(reply)))
            return [m for m in members_of(reply) if m[0] is None]
        finally:
            self._connecting.discard(address)

    def accept_join(self, channel: Channel, body: Any) -> dict[str, Any]:
        """Answer a peer's ``join`` request on an accepted channel; :class:`ConfigError` if its
        name is this worker's or a live peer's, or if it serves another app."""
        self.stamp.checked(body)  # another app: refused before anything changes
        wants_list = not (isinstance(body, dict) and body.get("list") is False)
        decisions = self._apply(JoinAsked(self._clock(), parse_join(body), wants_list), channel)
        return next(dict(d.reply) | self.stamp.to_wire() for d in decisions if type(d) is Welcome)

    # -- losing ------------------------------------------------------------------------------
    def remove(self, name: str, why: str) -> None:
        """Declare peer ``name`` dead at its current incarnation, and start retrying it."""
        self._apply(Remove(self._clock(), name, why))

    def left(self, name: str, why: str) -> None:
        """Peer ``name`` left on purpose: remove it, and retry it soon and often
        (:data:`LEFT_BACKOFF`) for :data:`FORGET_LEFT_AFTER_S`: a worker that leaves is most
        often restarting, and where it was the seed, its peers are how it finds the cluster."""
        self._apply(Left(self._clock(), name, why))
        log.info("%s: %s left the cluster", self.name, name)

    # -- liveness ----------------------------------------------------------------------------
    def seen(self, name: str, incarnation: int | None = None) -> bool:
        """A heartbeat of ``name`` (of ``incarnation``, if it says) arrived: True if it counts.

        It does not if ``name`` is no peer, or if it is of an older incarnation than the one
        recorded (sent before the peer was declared dead and came back). A newer incarnation
        is adopted."""
        decisions = self._apply(HeardFrom(self._clock(), name, incarnation))
        return bool(decisions) and type(decisions[0]) is Fresh

    def spoke(self, name: str) -> None:
        """Peer ``name`` sent a message on its own channel: it was running a moment ago. Only
        a suspect's is news to the table (its suspicion counts its silence from now: a busy
        peer whose refutation is late is alive while it talks); anyone else's costs a lookup."""
        if name in self.table.detector.suspicions and not self._closed:
            self._apply(HeardFrom(self._clock(), name, direct=True))

    def _stalled(self, late_s: float) -> None:
        """This worker's loop was stuck ``late_s`` (:class:`~compass.worker.stalls.StallCheck`)."""
        self._apply(Stalled(self._clock(), late_s))

    # -- taking lost peers back --------------------------------------------------------------
    def _tick(self, now: float) -> list[Decision]:
        if self._stalls.overdue():
            self._stalls.check()
        return self._apply(Tick(now, frozenset(self._retries), self._seeding))

    def due(self, now: float) -> list[str]:
        """Lost members whose next try is due at ``now`` and not already under way (forgetting
        those lost longer than the table's ``forget_after_s``)."""
        return [d.name for d in self._tick(now) if type(d) is Dial]

    def failed(self, name: str, error: BaseException) -> None:
        """A try to reach lost ``name`` failed: back off further."""
        now = self._clock()
        for decision in self._apply(RetryFailed(now, name)):
            if type(decision) is RetryAt:
                level = logging.INFO if decision.failures == 1 else logging.DEBUG
                log.log(level, "%s: %s at %s still unreachable (%s); next try in %.2f s",
                        self.name, name, decision.address, error,
                        decision.at - now)  # fmt: skip

    async def run(self) -> None:
        """Retry lost peers, each on its own backoff, and the seeds while this worker has no
        peer at all, until cancelled."""
        if not self._stalls.armed:
            self._stalls.check()
        while not self._closed:
            self._wake.clear()
            if self.channels.idle_s > 0 and (self._sweeper is None or self._sweeper.done()):
                # started here, and started again if it failed (the supervisor logged why)
                sweep = self.channels.sweep()
                self._sweeper = self._tasks.spawn(sweep, f"{self.name}-idle-channels")
                self._sweeper.add_done_callback(lambda _: self._wake.set())
            now = self._clock()
            for decision in self._tick(now):
                if type(decision) is Dial:
                    name = decision.name
                    retry = self._tasks.spawn(self._retry(name), f"{self.name}-rejoin-{name}")
                    self._retries[name] = retry
                    retry.add_done_callback(functools.partial(self._retry_ended, name))
                elif type(decision) is JoinSeeds:
                    self._seed_retry = self._tasks.spawn(
                        self._retry_seeds(), f"{self.name}-rejoin-seeds"
                    )
                    self._seed_retry.add_done_callback(self._seeds_ended)
            wait_s = self.table.next_due(frozenset(self._retries), self._seeding) - now
            if math.isinf(wait_s):
                await self._wake.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait_s, 0.0)):
                    await self._wake.wait()

    async def _retry(self, name: str) -> None:
        try:
            known = self.table.lost(name)
            if known is None:
                return
            try:
                await self.connect_peer(known.address, expect=name, want_list=False)
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
                if name not in self.channels.peers:  # already connecting, or it answered as another
                    self.failed(name, ConnectFailed("no connection"))
        finally:
            self._retries.pop(name, None)
            self._wake.set()

    def _retry_ended(self, name: str, task: asyncio.Task[None]) -> None:
        """A retry of ``name`` ended. One that failed in a way nobody foresaw (the supervisor
        logged it) counts as a failed try, so that the next one backs off, and it is no
        longer under way whatever it left undone."""
        if self._retries.get(name) is task:
            del self._retries[name]
        self._wake.set()
        if task.cancelled() or self._closed:
            return
        error = task.exception()
        if error is not None:
            self.failed(name, error)  # the table ignores it for a peer back meanwhile

    @property
    def _seeding(self) -> bool:
        """Whether the seeds are being tried already (a join under way): the table must not
        ask for them again, or two dials of one seed race and the second, finding it being
        dialed, would count as joined."""
        return self._seed_retry is not None or self._joining > 0

    async def _retry_seeds(self) -> None:
        """Join through the seeds again (this worker has no peer): once each, then back off."""
        try:
            await self.join(self.table.seeds, timeout_s=None)
        except ConfigError as exc:  # refused: the name clash needs a person
            log.warning("%s: a seed refused this worker: %s", self.name, exc)
            self._apply(SeedsFailed(self._clock()))
        except (CompassError, OSError) as exc:
            log.debug("%s: no seed answered: %s", self.name, exc)
            self._apply(SeedsFailed(self._clock()))
        except Exception:  # a bug must not stop the retries
            log.exception("%s: joining the seeds again failed", self.name)
            self._apply(SeedsFailed(self._clock()))
        else:
            self._apply(SeedsAnswered(self._clock()))
        finally:
            self._seed_retry = None
            self._wake.set()

    def _seeds_ended(self, task: asyncio.Task[None]) -> None:
        """The seeds' retry ended: it is no longer under way, whatever it left undone (a
        failure nobody foresaw is the supervisor's to log)."""
        if self._seed_retry is task:
            self._seed_retry = None
        self._wake.set()

    # -- talking -----------------------------------------------------------------------------
    def describe(self) -> list[dict[str, Any]]:
        return self.table.describe(self._clock())

    def describe_lost(self) -> list[dict[str, Any]]:
        """The members lost and being retried: since when, how often, the next try."""
        return self.table.describe_lost(self._clock())

    def leave(self) -> None:
        """Tell the peers this worker leaves on purpose (they retry it soon, see :meth:`left`),
        and take nobody in from now on. Those it has a channel open to hear it at once and
        pass it on piggybacked on their probes (as the member table does every change); it
        dials nobody, as it closes next (a dial to each of a thousand peers would be
        cancelled unfinished). A peer the word does not reach in time finds it gone by
        probing it."""
        self._apply(Leave(self._clock()))
        self.channels.tell_connected("leave", {"name": self.name})

    async def aclose(self) -> None:
        """Cancel the retries, dials, probes and the sweeper, close every channel to a peer,
        and wait for it all (channels closing by choice finish closing); what failed is
        logged, not dropped."""
        self._closed = True
        self._wake.set()
        self._stalls.close()
        self._tasks.cancel()
        channels = self.channels.close()
        self._apply(Close(self._clock()))
        closing = [self._tasks.aclose(), *(c.aclose() for c in channels)]
        results = await asyncio.gather(*closing, return_exceptions=True)
        log_failures(results, log, f"{self.name}: closing the channels to peers")


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, a refused connection: nothing listens there."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of causes, never a cycle followed for long
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
