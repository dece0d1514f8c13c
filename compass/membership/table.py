"""The member table, sans-IO: whom one worker knows in its cluster, live or lost, and the rules
that decide who joins, who is dropped, who is retried and who is forgotten.

:meth:`MemberTable.handle` is the only way the table's state changes: an event goes in (each
carries ``now``, on the worker's clock), decisions come out, in the order they must be carried
out. The table imports no asyncio and no socket code and reads no clock; its randomness (the
retries' jitter) comes from the ``random.Random`` it is given, so a seeded table fed the same
events makes the same decisions. The asyncio adapter (:class:`~compass.worker.membership.
Membership`) holds the channels and tasks: it turns what happens on the wire into events and
carries out the decisions (install or close a channel, dial an address, log).

The rules (after SWIM, as memberlist and Serf apply them):

- Failure detection is SWIM's, with Lifeguard's refinements (its rules are the table's part,
  :class:`~compass.membership.detector.FailureDetector`; its knobs and helpers are in
  :mod:`~compass.membership.swim`). Every period (:class:`Tick`) this worker probes one peer
  (:class:`SendProbe`), in a shuffled round-robin order; with no :class:`Acked` within the
  timeout (or the probe could not be sent, :class:`ProbeUnsent`) it asks ``indirect`` other
  peers to probe it (:class:`AskIndirect`, answered by :class:`Acked` or :class:`Nacked`);
  when they fail too the peer is *suspected* (:class:`Suspect`), and declared dead
  (:class:`PeerDown`) once the suspicion times out, sooner the more workers confirm it,
  unless it refutes it by raising its incarnation. A broken channel (:class:`ChannelLost`)
  is no verdict: the peer is probed at once. Each change (alive, suspect, dead, left, with
  its incarnation) is piggybacked (:class:`~.member_events.Update`) on the next probes and
  acks, a bounded number of times; what arrives is applied by the same rules (a worker told
  it is suspected or dead refutes at once). A worker answers every probe meant for it
  (:class:`Pinged`: :class:`SendAck`) and probes for a peer that asks (:class:`ProbeAsked`).
  Lifeguard's local health: a worker that misses the answers of the peers it asked, must
  refute, or whose own loop stalls (:class:`~.member_events.Stalled`), stretches its own
  period, timeouts and suspicions (it is likely the slow one). A busy worker is not a dead
  one: this worker's own stalls move the deadlines of its probes and suspicions (silence is
  measured in the time it listened), a peer that acked late lately gets that much longer to
  refute, and a suspect is told at once, as the one it refutes to is; no suspicion lasts more
  than the longest.
- Every worker ever seen is remembered (:class:`Member`: name, address, incarnation, instance).
  A live one (a *peer*) is removed when it is declared dead (above, or :class:`Remove`) or it
  says it leaves (:class:`Left`). A removed one is retried, each
  on its own :class:`Backoff` (:class:`Dial` at each :class:`Tick` when due), until it answers;
  one lost for :attr:`MemberTable.forget_after_s` (a day, Serf's reconnect timeout) is forgotten,
  one that left after :data:`FORGET_LEFT_AFTER_S`, retried soon and often meanwhile
  (:data:`LEFT_BACKOFF`).
- Each worker has an *incarnation*, 0 when it starts. Whoever removes a peer remembers the
  incarnation it declared it dead at, and says so in the next join handshake between the two
  (whichever side dials); the peer then takes the next incarnation (:class:`Refuted`).
  Heartbeats carry it: one of an older incarnation than the one recorded is stale, a newer one
  is adopted (:class:`HeardFrom`). A worker that hears it is suspected or dead refutes the
  same way, and says so in its updates.
- A join costs O(1) dials: a joiner dials its seed only, and takes the members its welcome
  names as live peers without dialing them (:class:`Named`); a worker that hears of a member
  it never saw (an ``alive`` update with its address) does the same. Such a peer's instance
  is unknown until the first handshake with it (whichever side dials, when there is something
  to send or to probe); a member named that is lost here is retried at once instead, so that
  it comes back through a handshake (at a newer incarnation, if it was declared dead).
- Names are unique. Each worker process has a random *instance* id; a join under the name of a
  live peer of another instance is refused (:class:`Refuse` with a
  :class:`~compass.errors.ConfigError`), unless the newcomer says it listens where that peer
  listens: only one process can, so it is a restart, and the old instance is removed first.
  A live peer whose instance is unknown yet (it was named, never met) is checked by address at
  the first handshake: from its address it is that peer, from another one a second worker
  under a taken name.
- A worker with no peer at all joins through its seeds again, on :attr:`MemberTable.backoff`.

The events, the decisions and the join handshake (:class:`~.member_events.Hello`) are defined
in :mod:`~compass.membership.events`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, assert_never

from compass.errors import ConfigError, WorkerUnavailable
from compass.membership.detector import FailureDetector
from compass.membership.events import (
    Acked,
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
    Gossiped,
    HeardFrom,
    Hello,
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
    Stale,
    Stalled,
    Tick,
    Update,
    Welcome,
)
from compass.membership.member import Member
from compass.membership.story import stimulus, stimulus_id, worth_keeping
from compass.membership.swim import Probing
from compass.stimuli import KEEP_STIMULI, Stimulus, StimulusLog

__all__ = [
    "FORGET_AFTER_S",
    "FORGET_LEFT_AFTER_S",
    "LEFT_BACKOFF",
    "Backoff",
    "Member",
    "MemberTable",
    "Probing",
]

#: a lost peer is forgotten after this long without answering (Serf's reconnect_timeout)
FORGET_AFTER_S = 24 * 3600.0

#: a peer that left on purpose is retried this long: it is most often restarting (a rolling
#: update, a new version), and a worker whose seed it was has no other way to find it again
FORGET_LEFT_AFTER_S = 3600.0


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


# -- the table -------------------------------------------------------------------------------------
class MemberTable:
    """Whom one worker knows; see the module docstring. Its failure detector (probes,
    suspicions, local health) is a part of it, :attr:`detector` (a :class:`~compass.
    membership.detector.FailureDetector` reading :attr:`members` and :attr:`live`).

    ``name``, ``address`` and ``instance`` are this worker's; ``backoff`` spaces the retries
    of a lost member and of the seeds; ``probing`` times the failure detector; ``rng`` draws
    the jitter, the probe order and the peers asked to probe indirectly; ``keep_stimuli``: the
    events its stimulus log keeps (0: none).
    """

    def __init__(
        self,
        name: str,
        address: str,
        *,
        instance: str,
        rng: random.Random,
        backoff: Backoff = Backoff(),
        forget_after_s: float = FORGET_AFTER_S,
        probing: Probing = Probing(),
        keep_stimuli: int = KEEP_STIMULI,
    ) -> None:
        self.name = name
        #: where peers reach this worker (what it tells them in the handshake)
        self.address = address
        #: this process's id, to tell a duplicate name from a rejoin
        self.instance = instance
        self.rng = rng
        self.backoff = backoff
        self.forget_after_s = forget_after_s
        #: this worker's incarnation; raised when a peer says it declared it dead
        self.incarnation = 0
        #: every worker seen, live or lost, by name
        self.members: dict[str, Member] = {}
        #: the live peers, in the order they became peers (one that came back is last)
        self.live: dict[str, Member] = {}
        #: heartbeats ignored for carrying an older incarnation than the one recorded
        self.stale_heartbeats = 0
        #: said it leaves: takes nobody in any more
        self.leaving = False
        #: the addresses this worker joined through (itself left out): joined through again,
        #: with :attr:`backoff`, whenever it has no peer at all
        self.seeds: list[str] = []
        self.seed_failures = 0
        self.seed_retry_at = 0.0
        #: the lost members (being retried), by name
        self._retrying: dict[str, Member] = {}
        #: the last events handled, their causes and what they decided (:meth:`story`)
        self.log = StimulusLog(keep_stimuli)
        self._handled = 0  # events handled so far (the anonymous ones are named by their number)
        #: SWIM's probes and suspicions, Lifeguard's local health, the updates to piggyback
        self.detector = FailureDetector(name, self.members, self.live, rng, probing,
                                        remove=self._remove)  # fmt: skip

    # -- the one entry point ------------------------------------------------------------------
    def handle(self, event: Event) -> list[Decision]:
        """Apply ``event``; return what the adapter must do, in order. An event the table
        refuses (:class:`Refuse`) changes nothing. Every decision carries the event's id
        (``cause``; an anonymous event is named ``kind:subject#n``, see :func:`~compass.
        membership.story.stimulus_id`). If a rule raises (a bug), the decisions made before
        are still returned, as the table changed with them, then a :class:`Fault`. The event
        and what it decided go into :attr:`log` (:meth:`story`)."""
        self._handled = n = self._handled + 1
        out: list[Decision] = []
        try:
            self._apply(event, out)
        except Exception as exc:
            out.append(Fault(exc))
        keep = self.log.keep and worth_keeping(event, out)
        if out or keep:  # an event that decided nothing and is not kept is not named
            cause = event.cause or stimulus_id(event, n)
            for decision in out:  # made just now and seen by nobody yet: its cause set in place
                object.__setattr__(decision, "cause", cause)
            if keep:
                self.log.add(stimulus(event, n, cause, out))
        return out

    def story(self, key: str) -> list[Stimulus]:
        """What :attr:`log` kept about ``key`` (a peer, an address, a cause id), oldest first."""
        return self.log.story(key)

    def _apply(self, event: Event, out: list[Decision]) -> None:
        """The rules: what ``event`` changes, and the decisions it makes, into ``out``."""
        match event:
            case HeardFrom():
                self._heard(event, out)
            case JoinAsked():
                self._join_asked(event, out)
            case JoinAnswered():
                self._join_answered(event, out)
            case Named():
                self._named(event, out)
            case Remove():
                self._remove(event.now, event.name, event.why, out)
            case Left():
                self._left(event.now, event.name, event.why, out)
            case NotReached():
                self._lost(self._remember(event.name, event.address), event.now, out)
            case RetryFailed():
                known = self.members.get(event.name)
                if known is not None and known.lost_at is not None:
                    known.failures += 1
                    self._lost(known, event.now, out)
            case Tick():
                self._tick(event, out)
            case Seeds():
                self.seeds = list(event.addresses)
            case NotASeed():
                if event.address in self.seeds:
                    self.seeds.remove(event.address)
            case SeedsFailed():
                delay = self.backoff.delay_s(self.seed_failures, self.rng.random())
                self.seed_retry_at = event.now + delay
                self.seed_failures += 1
            case SeedsAnswered():
                self.seed_failures = 0
            case Leave():
                self.leaving = True
                self.detector.broadcasts.add(
                    Update("left", self.name, self.incarnation, self.address, self.name)
                )
            case Close():
                self.live.clear()
                self.detector.clear()
            case Pinged():
                if event.to == self.name:  # else a probe for whoever listened here before
                    self._learn(event.now, event.sender, event.updates, out)
                    out.append(
                        SendAck(event.sender, event.seq, self.detector.piggyback(event.sender))
                    )
            case ProbeAsked():
                self._learn(event.now, event.sender, event.updates, out)
                if event.target == self.name:
                    out.append(
                        SendAck(event.sender, event.seq, self.detector.piggyback(event.sender))
                    )
                else:  # at the address this worker knows it by, if it does
                    known = self.members.get(event.target)
                    address = event.address if known is None else known.address
                    relay = (event.sender, event.seq)
                    self.detector.probe(event.now, event.target, address, relay, out)
            case Acked():
                self._learn(event.now, event.sender, event.updates, out)
                self.detector.acked(event, out)
            case Nacked():
                self._learn(event.now, event.sender, event.updates, out)
                self.detector.nacked(event, out)
            case ProbeUnsent():
                self.detector.unsent(event, out)
            case ChannelLost():
                self.detector.channel_lost(event, out)
            case Stalled():
                self.detector.stalled(event)
            case Gossiped():
                self._learn(event.now, event.sender, event.updates, out)
            case Listens():
                self.address = event.address
            case ForgetAfter():
                self.forget_after_s = event.seconds
            case _:
                assert_never(event)

    # -- queries ------------------------------------------------------------------------------
    def hello(self, dead: int | None = None) -> Hello:
        """This worker's side of the handshake, telling the other side ``dead``."""
        return Hello(self.name, self.address, self.incarnation, self.instance, dead)

    def dead_for(self, name: str | None) -> int | None:
        """The incarnation at which this worker declared ``name`` dead, if it still counts: what
        to tell ``name`` when dialing it."""
        known = None if name is None else self.members.get(name)
        return known.dead_incarnation if known is not None and known.declared_dead else None

    def lost_at_address(self, address: str) -> str | None:
        """The name of a lost member last at ``address``, if any (a seed may be one)."""
        return next((m.name for m in self._retrying.values() if m.address == address), None)

    def lost(self, name: str) -> Member | None:
        """Member ``name`` if it is lost (to be retried), else None."""
        known = self.members.get(name)
        return known if known is not None and known.lost_at is not None else None

    def next_due(self, busy: frozenset[str] = frozenset(), seeds_busy: bool = False) -> float:
        """When the next :class:`Tick` has something to dial (``inf``: nothing is scheduled);
        ``busy`` and ``seeds_busy`` as in :class:`Tick`."""
        waiting = [m.retry_at for m in self._retrying.values() if m.name not in busy]
        if self._alone() and not seeds_busy:
            waiting.append(self.seed_retry_at)
        waiting.extend(self.detector.due())
        return min(waiting, default=math.inf)

    def describe(self, now: float) -> list[dict[str, Any]]:
        """The live peers at ``now``: name, address, age of the last heartbeat, incarnation,
        and whether it is suspected."""
        return [
            {
                "name": p.name,
                "address": p.address,
                "age_ms": round((now - p.last_seen) * 1000, 1),
                "incarnation": self.members[p.name].incarnation,
                "suspect": p.name in self.detector.suspicions,
            }
            for p in sorted(self.live.values(), key=lambda p: p.name)
        ]

    def describe_lost(self, now: float) -> list[dict[str, Any]]:
        """The members lost and being retried: since when, how often, the next try."""
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

    # -- joining ------------------------------------------------------------------------------
    def _join_asked(self, ev: JoinAsked, out: list[Decision]) -> None:
        hello = ev.hello
        name = hello.name
        if name == self.name:
            if hello.instance == self.instance:
                out.append(
                    Refuse(
                        ConfigError,
                        f"worker {name!r} tried to join itself at {self.address}",
                        {"name": name, "address": self.address, "itself": True},
                    )
                )
                return
            out.append(self._taken(name, self.address))
            return
        if self.leaving:
            out.append(Refuse(WorkerUnavailable, f"worker {self.name} is leaving the cluster"))
            return
        if not self._unique(name, hello.instance, hello.address) and not self._restarted(
            ev.now, name, hello.address, out
        ):
            out.append(self._taken(name, self.live[name].address))
            return
        self._refute(hello.dead, hello.name, out)
        told = None
        incarnation = hello.incarnation
        known = self.members.get(name)
        if (
            known is not None
            and known.dead_incarnation is not None
            and incarnation <= known.dead_incarnation
            and hello.has_incarnation  # a worker that predates incarnations stays at 0
        ):
            # it was declared dead here: it comes back one incarnation later (and adopts the
            # same number from this reply's "dead")
            told = known.dead_incarnation
            incarnation = told + 1
        up = self._register(ev.now, name, hello.address, incarnation, hello.instance, out)
        if up is not None and not up.replaces:  # first hand: it came to this worker
            self.detector.broadcasts.add(
                Update("alive", name, up.incarnation, up.address, self.name)
            )
        reply = self.hello(told).to_wire()
        if ev.wants_list:
            others = [p for p in self.live.values() if p.name != name]
            reply["members"] = [p.address for p in others]
            reply["peers"] = {p.name: p.address for p in others}
            reply["incarnations"] = {p.name: p.incarnation for p in others}
        out.append(Welcome(reply))

    def _join_answered(self, ev: JoinAnswered, out: list[Decision]) -> None:
        hello = ev.hello
        name = hello.name
        if ev.expect is not None and name != ev.expect:
            known = self.members.get(ev.expect)
            if known is not None and known.lost_at is not None and known.address == ev.address:
                del self.members[ev.expect]
                self._retrying.pop(ev.expect, None)
                out.append(Moved(ev.expect, name, ev.address))
        if not self._unique(name, hello.instance, hello.address) and not self._restarted(
            ev.now, name, hello.address, out
        ):
            out.append(Duplicate(name, ev.address, self.live[name].address))
            return
        known = self.members.get(name)
        if (
            known is not None
            and name not in self.live
            and known.declared_dead
            and hello.has_incarnation
            and hello.incarnation <= (known.dead_incarnation or 0)
        ):
            # the answer to a join sent before it was declared dead here (it was slow, not
            # gone): it comes back only at a newer incarnation, so dial it again at once,
            # telling it
            self._lost(known, ev.now, out, delay_s=0.0)
            return
        self._refute(hello.dead, name, out)
        self._register(ev.now, name, hello.address, hello.incarnation, hello.instance, out)

    @staticmethod
    def _taken(name: str, address: str) -> Refuse:
        return Refuse(
            ConfigError,
            f"the worker name {name!r} is taken: the worker at {address} has it; names must be "
            "unique in a cluster, so start this one with another --name",
            {"name": name, "address": address},
        )

    def _unique(self, name: str, instance: str, address: str) -> bool:
        """False if ``name`` is a live peer's and ``instance`` says it is another process, or,
        where the peer's instance is unknown yet (named, never met), if it speaks from another
        address than the peer's."""
        known = self.members.get(name)
        if name not in self.live or known is None:
            return True
        if not known.instance:
            return address == known.address
        return not (instance and known.instance != instance)

    def _named(self, ev: Named, out: list[Decision]) -> None:
        """The members ``ev.by``'s welcome named: those never seen are live peers, not dialed;
        those lost here are retried at once (as a joiner dialed them all before)."""
        if self.leaving:
            return
        for name, address, incarnation in ev.members:
            known = self.members.get(name)
            if name == self.name or name in self.live or name == ev.by or not address:
                continue
            if known is None:
                self._meet(ev.now, name, address, incarnation, out)
            elif known.retry_at > ev.now:
                self._lost(known, ev.now, out, delay_s=0.0)

    def _meet(
        self, now: float, name: str, address: str, incarnation: int, out: list[Decision]
    ) -> None:
        """Take ``name``, never seen, as a live peer on another worker's word, without dialing
        it: its instance is learnt at the first handshake with it."""
        self._register(now, name, address, incarnation, "", out)

    def _restarted(self, now: float, name: str, address: str, out: list[Decision]) -> bool:
        """A new instance of live peer ``name`` speaks from ``address``: True if that is where
        the peer listens, which makes it a restart (only one process can listen there, so the
        old one is gone, though its connection may not have said so yet): the old instance is
        removed, and its jobs with it. False: a second worker under a taken name."""
        if self.live[name].address != address:
            return False
        self._remove(now, name, f"it restarted (a new instance of it answers at {address})", out)
        return True

    def _refute(
        self, dead: int | None, by: str, out: list[Decision], *, suspected: bool = False
    ) -> None:
        """``by`` says it declared this worker dead (``suspected``: suspects it) at incarnation
        ``dead``: take a newer one, and tell everyone."""
        if dead is not None and dead >= self.incarnation:
            self.incarnation = dead + 1
            self.detector.broadcasts.add(
                Update("alive", self.name, self.incarnation, self.address, self.name)
            )
            self.detector.adjust_health(+1)
            out.append(Refuted(by, dead, self.incarnation, suspected))

    def _remember(self, name: str, address: str) -> Member:
        known = self.members.get(name)
        if known is None:
            known = self.members[name] = Member(name, address)
        elif name not in self.live:
            known.address = address  # a live peer's address is the one it joined with
        return known

    def _register(
        self,
        now: float,
        name: str,
        address: str,
        incarnation: int,
        instance: str,
        out: list[Decision],
    ) -> PeerUp | None:
        """Make ``name`` a live peer (on the channel its join came on)."""
        if name == self.name:
            out.append(
                Refuse(
                    ConfigError,
                    f"a worker named {name!r} is already this worker: names must be unique",
                )
            )
            return None
        known = self._remember(name, address)
        known.address = address
        back_after = None if known.lost_at is None else now - known.lost_at
        if instance and instance != known.instance:
            known.instance = instance
        known.incarnation = max(known.incarnation, incarnation)
        known.lost_at, known.failures, known.retry_at = None, 0, math.inf
        known.left = False
        known.joined_at = known.last_seen = now
        self._retrying.pop(name, None)
        replaces = name in self.live
        self.live[name] = known
        up = PeerUp(name, address, known.incarnation, back_after, replaces)
        out.append(up)
        if self.detector.suspicions:
            self.detector.unsuspect(name, out)
        if not replaces:
            self.detector.joined(now, name)
        return up

    # -- losing -------------------------------------------------------------------------------
    def _remove(self, now: float, name: str, why: str, out: list[Decision]) -> None:
        """Declare peer ``name`` dead at its current incarnation, and schedule its retries."""
        peer = self.live.pop(name, None)
        if peer is None:
            return
        out.append(PeerDown(name, peer.address, why))
        self.detector.dropped(name)
        known = self._remember(name, peer.address)
        known.dead_incarnation = known.incarnation
        self._lost(known, now, out)

    def _left(self, now: float, name: str, why: str, out: list[Decision]) -> None:
        known = self.members.get(name)
        if known is not None:
            known.left = True
            known.failures = 0
            if name in self.live and len(self.live) > 1:
                self.detector.broadcasts.add(
                    Update("left", name, known.incarnation, known.address, name)
                )
        self._remove(now, name, why, out)

    def _lost(
        self, member: Member, now: float, out: list[Decision], delay_s: float | None = None
    ) -> None:
        """Retry ``member`` after ``delay_s``, else on its backoff."""
        if member.lost_at is None:
            member.lost_at, member.failures = now, 0
        self._retrying[member.name] = member
        if delay_s is None:
            backoff = LEFT_BACKOFF if member.left else self.backoff
            delay_s = backoff.delay_s(member.failures, self.rng.random())
        member.retry_at = now + delay_s
        out.append(RetryAt(member.name, member.address, member.failures, member.retry_at))

    def _heard(self, ev: HeardFrom, out: list[Decision]) -> None:
        peer = self.live.get(ev.name)
        if peer is None:
            return  # not a peer (any more): its heartbeats do not count
        if ev.incarnation is not None:
            known = self.members[ev.name]
            if ev.incarnation < known.incarnation:
                self.stale_heartbeats += 1
                out.append(Stale(ev.name, ev.incarnation, known.incarnation))
                return
            known.incarnation = ev.incarnation
        peer.last_seen = ev.now
        out.append(Fresh(ev.name))
        self.detector.unsuspect(ev.name, out)
        if ev.direct:
            self.detector.heard(ev.now, ev.name)

    # -- taking lost peers back ---------------------------------------------------------------
    def _alone(self) -> bool:
        return not self.live and bool(self.seeds)

    def _tick(self, ev: Tick, out: list[Decision]) -> None:
        now = ev.now
        self.detector.detect(now, out)
        for name in [
            m.name
            for m in self._retrying.values()
            if now - (m.lost_at or now) > (FORGET_LEFT_AFTER_S if m.left else self.forget_after_s)
        ]:
            out.append(Forgot(name, now - (self.members[name].lost_at or now)))
            del self.members[name], self._retrying[name]
        out.extend(
            Dial(m.name, m.address)
            for m in self._retrying.values()
            if m.retry_at <= now and m.name not in ev.busy
        )
        if self._alone() and not ev.seeds_busy and self.seed_retry_at <= now:
            out.append(JoinSeeds(tuple(self.seeds)))

    # -- what others say ------------------------------------------------------------------------
    def _learn(
        self, now: float, sender: str, updates: tuple[Update, ...], out: list[Decision]
    ) -> None:
        for update in updates:
            self._apply_update(now, sender, update, out)

    def _apply_update(self, now: float, sender: str, u: Update, out: list[Decision]) -> None:
        """Apply one update heard from ``sender``; pass on what was news."""
        by = u.by or sender
        if u.name == self.name:
            if u.status != "alive" and not self.leaving:
                before = self.incarnation
                self._refute(u.incarnation, by, out, suspected=u.status == "suspect")
                peer = self.live.get(by)
                if self.incarnation > before and peer is not None:
                    # the refutation goes first: to the one that suspects it, now, on a probe
                    # (its updates, the newest first), not when the round reaches it
                    self.detector.probe(now, by, peer.address, None, out)
            return
        known = self.members.get(u.name)
        if known is None:  # a member this worker never saw: a live peer, not dialed
            if u.status == "alive" and u.address and not self.leaving:
                self._meet(now, u.name, u.address, u.incarnation, out)
                self.detector.broadcasts.add(u)
            return
        if u.name not in self.live:  # lost here: alive at a newer incarnation, it is back
            if u.status == "alive" and u.incarnation > known.incarnation:
                known.incarnation = u.incarnation
                if known.retry_at > now:
                    self._lost(known, now, out, delay_s=0.0)
                self.detector.broadcasts.add(u)
            return
        if u.incarnation < known.incarnation:
            return  # old news
        match u.status:
            case "alive":
                if u.incarnation > known.incarnation:
                    known.incarnation = u.incarnation
                    self.detector.unsuspect(u.name, out)
                    self.detector.broadcasts.add(u)
            case "suspect":
                self.detector.suspect(now, u.name, u.incarnation, by, out)
            case "dead":
                known.incarnation = u.incarnation
                self._remove(now, u.name, f"declared dead by {by}", out)
                if self.live:
                    self.detector.broadcasts.add(u)
            case "left":
                known.incarnation = u.incarnation
                self._left(now, u.name, f"it left the cluster (heard from {sender})", out)
            case _:
                assert_never(u.status)
