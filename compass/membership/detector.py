"""The failure detector's rules, sans-IO: SWIM's probes with Lifeguard's refinements, as the
member table (:class:`~compass.membership.table.MemberTable`) applies them.

:class:`FailureDetector` is a part of the table (its :attr:`~compass.membership.table.
MemberTable.detector`): it keeps what the detector keeps (the probes under way, the
suspicions, the local health, the next probe of the round and the updates to piggyback) and
the rules that change it; the table's :meth:`~compass.membership.table.MemberTable.handle`
calls them. It reads the table's members and live peers (the same dicts, given when it is
made) and declares a peer dead through the ``remove`` it was given (the table's rule). It
imports nothing of the table. The knobs and the parts they use (the probe order, the
broadcasts) are in :mod:`~compass.membership.swim`; the rules themselves are described in
:mod:`~compass.membership.table`'s docstring. Like the table, nothing here reads a clock or
does I/O: every time comes with an event, every random draw from the table's ``rng``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from compass.membership.events import (
    Acked,
    AskIndirect,
    ChannelLost,
    Decision,
    Nacked,
    ProbeUnsent,
    SendAck,
    SendNack,
    SendProbe,
    Stalled,
    Suspect,
    Unsuspected,
    Update,
)
from compass.membership.member import Member
from compass.membership.swim import Broadcasts, ProbeOrder, Probing

__all__ = ["LATE_ACKS", "FailureDetector"]

#: own probes given up on whose acks may still come (each tells how slow its target is)
LATE_ACKS = 64


@dataclass(slots=True)
class _Probe:
    """A probe under way: this worker's own, or one it sends for a peer that asked
    (``relay``: that peer and its probe's seq)."""

    target: str
    address: str
    #: no ack by then: ask others (own), or tell the asker (relay)
    ack_by: float
    relay: tuple[str, int] | None = None
    #: when it was sent
    sent: float = 0.0
    #: others were asked to probe it: it failed unless acked by then
    indirect_by: float | None = None
    asked: int = 0
    nacks: int = 0

    def due(self) -> float:
        return self.ack_by if self.indirect_by is None else self.indirect_by


@dataclass(slots=True)
class _Suspicion:
    """A live peer suspected at ``incarnation`` since ``since``, by the workers in ``by`` (the
    first suspected it, the others confirmed), declared dead at ``deadline``; ``stalled``:
    how long this worker's own loop stalled since, by which the deadline moved; ``heard``:
    when the peer was last heard from directly since (its silence counts from then), and
    ``stalled_heard``: this worker's stalls after that."""

    incarnation: int
    since: float
    deadline: float
    by: list[str]
    stalled: float = 0.0
    heard: float = -math.inf
    stalled_heard: float = 0.0


#: how the table declares a peer dead: ``remove(now, name, why, out)``
Remove = Callable[[float, str, str, list[Decision]], None]


class FailureDetector:
    """The failure detector of one worker's member table: probes, suspicions and local
    health; see the module docstring.

    ``name`` is this worker's; ``members`` and ``live`` are the table's dicts of every worker
    it saw and of its live peers (read here, written by the table); ``remove`` is the table's
    rule that declares a peer dead. ``probing`` times it; ``rng`` (the table's) draws the
    probe order, the first seq and the peers asked to probe indirectly.
    """

    def __init__(
        self,
        name: str,
        members: dict[str, Member],
        live: dict[str, Member],
        rng: random.Random,
        probing: Probing,
        *,
        remove: Remove,
    ) -> None:
        self.name = name
        self.members = members
        self.live = live
        self.rng = rng
        self._remove = remove
        self.probing = probing
        #: Lifeguard's local health multiplier: this worker's period and timeouts are
        #: (1 + health) times the configured ones
        self.health = 0
        #: the next probe of the round
        self.probe_at = math.inf
        self._order = ProbeOrder(rng)
        #: the membership updates to piggyback
        self.broadcasts = Broadcasts()
        #: the probes under way, by seq; seqs start at random, so an answer meant for an earlier
        #: process of this name (a relayed ack arriving late) matches nothing
        self._probes: dict[int, _Probe] = {}
        self._seq = rng.getrandbits(48)
        #: the suspected live peers
        self.suspicions: dict[str, _Suspicion] = {}
        #: how slow each live peer has been to ack lately (seconds: its slowest ack, as of
        #: ``_slow_at``, halving every longest suspicion since: :meth:`slowness_at`): a peer
        #: that answered late a moment ago is busy, and its suspicion lasts that much longer
        #: (see _suspicion_timeout_s)
        self.slowness: dict[str, float] = {}
        self._slow_at: dict[str, float] = {}
        #: own probes given up on, by seq: target and when sent (the last LATE_ACKS)
        self._given_up: dict[int, tuple[str, float]] = {}

    # -- what the table tells it ---------------------------------------------------------------
    def joined(self, now: float, name: str) -> None:
        """``name`` became a live peer (it was none): probe it in its turn; the first peer
        starts the probing, at a random phase."""
        self._order.add(name)
        if math.isinf(self.probe_at):
            self.probe_at = now + self.rng.random() * self.probing.period_s

    def dropped(self, name: str) -> None:
        """Live peer ``name`` was removed (the table's ``live`` no longer has it)."""
        self.suspicions.pop(name, None)
        self.slowness.pop(name, None)
        self._slow_at.pop(name, None)
        if not self.live:  # nobody left to tell: what was to be told is stale by the next peer
            self.broadcasts.clear()
            self.probe_at = math.inf  # nobody to probe either, until the next peer

    def clear(self) -> None:
        """The table closes: no probe, suspicion or update is under way any more."""
        self._probes.clear()
        self._given_up.clear()
        self.suspicions.clear()
        self.slowness.clear()
        self._slow_at.clear()
        self.broadcasts.clear()
        self.probe_at = math.inf

    def due(self) -> Iterator[float]:
        """When something of the detector is due: the next probe, probe timeouts, the ends
        of suspicions."""
        yield self.probe_at
        yield from (p.due() for p in self._probes.values())
        yield from (s.deadline for s in self.suspicions.values())

    # -- its rules ------------------------------------------------------------------------------
    def detect(self, now: float, out: list[Decision]) -> None:
        """What is due of the failure detector at ``now``: late acks, failed probes,
        suspicions timed out, the next probe of the round."""
        for seq, probe in list(self._probes.items()):
            if seq not in self._probes or probe.due() > now:
                continue
            if probe.relay is not None:
                self._nack(seq, probe, out)
            elif probe.target not in self.live:
                del self._probes[seq]  # declared dead meanwhile, or it left
            elif probe.indirect_by is None:
                self._indirect(now, seq, probe, out)
            else:
                self._failed(now, seq, probe, out)
        for name, suspicion in list(self.suspicions.items()):
            if suspicion.deadline <= now and self.suspicions.get(name) is suspicion:
                del self.suspicions[name]
                self._declare_dead(now, name, suspicion, out)
        if self.probe_at <= now:
            if not self.live:
                self.probe_at = math.inf  # started again by the next peer
                return
            self.probe_at = now + self.probing.period_s * (1 + self.health)
            busy = {p.target for p in self._probes.values() if p.relay is None}
            target = self._order.next(self.live, busy)
            if target is not None:
                self.probe(now, target, self.live[target].address, None, out)

    def probe(
        self,
        now: float,
        target: str,
        address: str,
        relay: tuple[str, int] | None,
        out: list[Decision],
    ) -> None:
        self._seq += 1
        timeout_s = self.probing.timeout_s * (1 + self.health)
        if relay is not None:
            timeout_s *= 0.8  # the asker hears the nack before its own window closes
        self._probes[self._seq] = _Probe(target, address, now + timeout_s, relay, now)
        out.append(SendProbe(target, address, self._seq, self.piggyback(target)))

    def channel_lost(self, ev: ChannelLost, out: list[Decision]) -> None:
        """Probe the peer now, through a new channel; a direct probe of it still waiting for
        its ack went out on the broken one: its answer will not come back, it is replaced."""
        peer = self.live.get(ev.name)
        if peer is None:
            return
        for seq, probe in list(self._probes.items()):
            if probe.target == ev.name and probe.relay is None:
                if probe.indirect_by is not None:
                    return  # others are probing it already
                del self._probes[seq]
        self.probe(ev.now, peer.name, peer.address, None, out)

    def stalled(self, ev: Stalled) -> None:
        """This worker's loop stalled ``ev.late_s``: silence is measured in the time it was
        listening, so every deadline of its own probes and suspicions moves by the stall (an
        ack may be waiting unread, a refutation could not be asked for). A stall of half a
        probe timeout or more counts against its local health, as a missed nack does: it is
        the slow one, and stretches its period and timeouts (Lifeguard)."""
        late = ev.late_s
        for probe in self._probes.values():
            if probe.relay is None:  # a relay owes its asker a nack within the asker's window
                probe.ack_by += late
                if probe.indirect_by is not None:
                    probe.indirect_by += late
        for suspicion in self.suspicions.values():
            suspicion.stalled += late
            suspicion.stalled_heard += late
            suspicion.deadline += late
        if late >= self.probing.timeout_s / 2:
            self.adjust_health(+1)

    def _indirect(self, now: float, seq: int, probe: _Probe, out: list[Decision]) -> None:
        """Probe ``seq``'s ack is late: ask others to probe its target."""
        healthy = [n for n in self.live if n != probe.target and n not in self.suspicions]
        via = self.rng.sample(healthy, min(self.probing.indirect, len(healthy)))
        if not via:
            self._failed(now, seq, probe, out)
            return
        probe.indirect_by = now + self.probing.timeout_s * (1 + self.health)
        probe.asked = len(via)
        updates = self.piggyback(None, times=len(via))
        out.append(AskIndirect(tuple(via), probe.target, probe.address, seq, updates))

    def _failed(self, now: float, seq: int, probe: _Probe, out: list[Decision]) -> None:
        """Nobody got an ack from probe ``seq``'s target: suspect it."""
        del self._probes[seq]
        self._given_up[seq] = (probe.target, probe.sent)
        if len(self._given_up) > LATE_ACKS:
            del self._given_up[next(iter(self._given_up))]
        if probe.nacks < probe.asked:
            # a peer asked did not even nack: this worker may be the slow one
            self.adjust_health(+1)
        known = self.live.get(probe.target)
        if known is not None:
            self.suspect(now, probe.target, known.incarnation, self.name, out)

    def _nack(self, seq: int, probe: _Probe, out: list[Decision]) -> None:
        del self._probes[seq]
        assert probe.relay is not None
        asker, their_seq = probe.relay
        out.append(SendNack(asker, their_seq, self.piggyback(asker)))

    def acked(self, ev: Acked, out: list[Decision]) -> None:
        probe = self._probes.pop(ev.seq, None)
        if probe is None:
            late = self._given_up.pop(ev.seq, None)
            if late is not None:  # decided already, but it tells how slow the target is
                self._slow(ev.now, late[0], ev.now - late[1])
            return
        if probe.relay is not None:
            asker, their_seq = probe.relay
            out.append(SendAck(asker, their_seq, self.piggyback(asker)))
        else:
            self.adjust_health(-1)
            self._slow(ev.now, probe.target, ev.now - probe.sent)

    def slowness_at(self, now: float, name: str) -> float:
        """How slow ``name`` has been to ack lately, at ``now``: its slowest ack, halved for
        every longest suspicion since. "Lately" is a time, not a count of acks: a peer is
        acked a few times a second in a small cluster and once in minutes in a large one,
        and a worker that stalled 900 ms a second ago is as likely to stall again in either."""
        slowness = self.slowness.get(name, 0.0)
        if not slowness:
            return 0.0
        age = now - self._slow_at.get(name, now)
        if age <= 0:
            return slowness
        half_life = self.probing.suspicion_bounds_s(len(self.live) + 1)[1]
        return slowness * math.pow(0.5, age / half_life)

    def _slow(self, now: float, name: str, rtt_s: float) -> None:
        """An ack of ``name`` took ``rtt_s``: its slowest lately (:meth:`slowness_at`). A
        suspect that acks late was busy, not gone: its suspicion takes the new slowness in."""
        if name not in self.live:
            return
        self.slowness[name] = max(rtt_s, self.slowness_at(now, name))
        self._slow_at[name] = now
        suspicion = self.suspicions.get(name)
        if suspicion is not None:
            suspicion.deadline = max(suspicion.deadline, self._deadline(now, name, suspicion))

    def _gone_quiet(self, now: float, name: str) -> None:
        """Nothing listens where ``name`` did (a killed process's port refuses): whatever made
        it slow, it is not busy now. Its suspicion gets no time for slowness."""
        self._slow_at.pop(name, None)
        if self.slowness.pop(name, None) is None:
            return
        suspicion = self.suspicions.get(name)
        if suspicion is not None and name in self.live:
            suspicion.deadline = min(suspicion.deadline, self._deadline(now, name, suspicion))

    def heard(self, now: float, name: str) -> None:
        """Peer ``name`` was heard from directly (a heartbeat it sent itself, on its own
        channel): it was running a moment ago, whatever anyone suspects. If it is suspected,
        its silence counts from now: the suspicion ends in its death only once it has been
        silent for the suspicion's whole time. A busy peer whose refutation is late (it has
        not heard it is suspected yet, or its answer waits in a lagging loop) but that talks
        is alive; one stopped, killed or cut off says nothing, and nothing changes for it."""
        suspicion = self.suspicions.get(name)
        if suspicion is None:
            return
        suspicion.heard, suspicion.stalled_heard = now, 0.0
        suspicion.deadline = max(suspicion.deadline, self._deadline(now, name, suspicion))

    def _deadline(self, now: float, name: str, suspicion: _Suspicion) -> float:
        """When ``suspicion`` of ``name`` ends by its rules at ``now``: its time (confirmations,
        slowness, health) after the later of its start and the last time ``name`` was heard
        from, plus this worker's own stalls in between."""
        timeout_s = self._suspicion_timeout_s(len(self.live) + 1, len(suspicion.by) - 1, name, now)
        if suspicion.heard > suspicion.since:
            return suspicion.heard + suspicion.stalled_heard + timeout_s
        return suspicion.since + suspicion.stalled + timeout_s

    def nacked(self, ev: Nacked, out: list[Decision]) -> None:
        probe = self._probes.get(ev.seq)
        if probe is None or probe.relay is not None or probe.indirect_by is None:
            return
        probe.nacks += 1
        if probe.nacks >= probe.asked:  # every peer asked failed too: no ack is coming
            self._failed(ev.now, ev.seq, probe, out)

    def unsent(self, ev: ProbeUnsent, out: list[Decision]) -> None:
        probe = self._probes.get(ev.seq)
        if probe is None:
            return
        if ev.refused and probe.relay is None:
            self._gone_quiet(ev.now, probe.target)
        if probe.relay is not None:
            self._nack(ev.seq, probe, out)
        elif probe.indirect_by is None and probe.target in self.live:
            self._indirect(ev.now, ev.seq, probe, out)

    def suspect(
        self, now: float, name: str, incarnation: int, by: str, out: list[Decision]
    ) -> None:
        """``by`` suspects live peer ``name`` at ``incarnation``: a new suspicion, or a
        confirmation of the one under way (which shortens it)."""
        known = self.live[name]
        members = len(self.live) + 1
        suspicion = self.suspicions.get(name)
        if suspicion is not None and suspicion.incarnation >= incarnation:
            if by in suspicion.by or not by:
                return
            suspicion.by.append(by)
            confirmations = len(suspicion.by) - 1
            suspicion.deadline = self._deadline(now, name, suspicion)
            if confirmations <= self.probing.suspicion_mult:  # more shorten nothing more
                self.broadcasts.add(Update("suspect", name, incarnation, known.address, by))
            return
        known.incarnation = max(known.incarnation, incarnation)
        timeout_s = self._suspicion_timeout_s(members, 0, name, now)
        self.suspicions[name] = _Suspicion(incarnation, now, now + timeout_s, [by])
        self.broadcasts.add(Update("suspect", name, incarnation, known.address, by))
        out.append(Suspect(name, incarnation, by, timeout_s))
        if by == self.name:
            # tell it now, not on the next probe of it a round later: the probe carries its
            # suspicion first (see _piggyback), and a live peer refutes in its ack (the
            # first to suspect it tells it; those that only hear of it do not, at any n)
            self.probe(now, name, known.address, None, out)

    def _suspicion_timeout_s(
        self, members: int, confirmations: int, name: str, now: float
    ) -> float:
        """How long a suspicion of ``name`` lasts here: Lifeguard's, stretched by this
        worker's local health (a slow worker is slow to hear refutations too), never more
        than the longest (with ``--peer-timeout-ms``, the bound the operator set); plus
        twice how slow ``name`` has been to ack lately, up to three times the longest more
        (:meth:`~compass.membership.swim.Probing.busy_bound_s`), unless its address refused
        a connection since (:meth:`_gone_quiet`).

        A busy peer refutes late: on a saturated host every worker's loop lags alike, so the
        others' confirmations are no independent evidence, and a suspicion cut to Lifeguard's
        shortest, or capped at the longest, dropped workers that were alive and serving
        (issue 32). One that was quick when it went silent (killed, stopped, cut off) gets
        no more time than before, and one whose port refuses gets none."""
        base = self.probing.suspicion_timeout_s(members, confirmations) * (1 + self.health)
        _, longest = self.probing.suspicion_bounds_s(members)
        busy = self.probing.busy_bound_s(members) - longest
        return min(base, longest) + min(2 * self.slowness_at(now, name), busy)

    def unsuspect(self, name: str, out: list[Decision]) -> None:
        """Peer ``name``'s incarnation went up: a suspicion of an older one is over."""
        suspicion = self.suspicions.get(name)
        incarnation = self.members[name].incarnation
        if suspicion is not None and incarnation > suspicion.incarnation:
            del self.suspicions[name]
            out.append(Unsuspected(name, incarnation))

    def _declare_dead(
        self, now: float, name: str, suspicion: _Suspicion, out: list[Decision]
    ) -> None:
        known = self.members[name]
        others = len(suspicion.by) - 1
        stalled = (
            f", {suspicion.stalled * 1000:.0f} ms of it this worker's own stalls"
            if suspicion.stalled >= 0.001
            else ""
        )
        heard = (
            f", last heard from {(now - suspicion.heard) * 1000:.0f} ms ago"
            if suspicion.heard > suspicion.since
            else ""
        )
        why = (
            f"suspected for {(now - suspicion.since) * 1000:.0f} ms without refuting it "
            f"(first by {suspicion.by[0]}, confirmed by {others} other worker"
            f"{'' if others == 1 else 's'}{stalled}{heard})"
        )
        self._remove(now, name, why, out)
        if self.live:
            self.broadcasts.add(Update("dead", name, known.incarnation, known.address, self.name))

    def adjust_health(self, change: int) -> None:
        self.health = min(max(self.health + change, 0), self.probing.max_health)

    def piggyback(self, to: str | None, times: int = 1) -> tuple[Update, ...]:
        """The updates for one message to ``to`` (sent ``times`` times): a suspect is told
        first that it is suspected, so that it can refute (Lifeguard's buddy system)."""
        most, limit = self.probing.max_piggyback, self.probing.retransmits(len(self.live) + 1)
        suspicion = None if to is None else self.suspicions.get(to)
        if to is None or suspicion is None:
            return self.broadcasts.take(most, limit, times=times)
        if to in self.broadcasts:
            return self.broadcasts.take(most, limit, first=to, times=times)
        address = self.members[to].address if to in self.members else ""
        told = Update("suspect", to, suspicion.incarnation, address, suspicion.by[0])
        return (told, *self.broadcasts.take(most - 1, limit, times=times))
