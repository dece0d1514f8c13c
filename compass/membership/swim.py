"""The failure detector's parts, sans-IO: its knobs and timings (:class:`Probing`), the order
peers are probed in (:class:`ProbeOrder`) and the updates waiting to ride on probes and acks
(:class:`Broadcasts`). The rules that use them are
:class:`~compass.membership.detector.FailureDetector`'s, the base of
:class:`~compass.membership.table.MemberTable`; nothing here reads a clock or does I/O.

After SWIM (Das, Gupta and Motivala, 2002) with Lifeguard's refinements (Dadgar et al.,
2018) as HashiCorp's memberlist applies them: each period a worker probes one peer, in a
shuffled round-robin order so that every peer is probed once a round; a peer that does not
answer within the timeout is probed through ``indirect`` others, then *suspected*; a suspicion
that is not refuted in time (:meth:`Probing.suspicion_timeout_s`: shorter as other workers
confirm it) declares the peer dead. Membership changes ride on the probes and their answers,
each sent :meth:`Probing.retransmits` times (``retransmit_mult * log10(n + 1)``, rounded up),
so one reaches every worker in O(log n) periods while a worker sends a constant number of
messages per period whatever the cluster's size.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Container
from dataclasses import dataclass

from compass.errors import ConfigError
from compass.membership.events import Update

__all__ = ["Broadcasts", "ProbeOrder", "Probing"]


@dataclass(frozen=True, slots=True)
class Probing:
    """The failure detector's knobs (seconds).

    ``period_s``: a worker probes one peer this often. ``timeout_s``: an ack later than this
    sends the probe through ``indirect`` other peers, which have the rest of the period to
    answer. A suspicion lasts between :meth:`suspicion_bounds_s`: ``suspicion_mult x
    max(1, log10(n)) x period_s`` at least, ``suspicion_max_mult`` times that at most, and
    never more than ``suspicion_max_s`` (``--peer-timeout-ms``). Each update is piggybacked
    ``retransmit_mult x ceil(log10(n + 1))`` times, at most ``max_piggyback`` on one message.
    ``max_health``: the most Lifeguard's local health multiplier grows, stretching this
    worker's period, timeouts and suspicions (up to the longest) while it misses answers or
    stalls itself (it is the slow one).
    """

    period_s: float = 0.2
    timeout_s: float = 0.1
    indirect: int = 3
    suspicion_mult: float = 3.0
    suspicion_max_mult: float = 6.0
    suspicion_max_s: float = math.inf
    retransmit_mult: int = 4
    max_piggyback: int = 8
    max_health: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s < self.period_s:
            raise ConfigError(
                f"Probing needs 0 < timeout_s < period_s, got {self.timeout_s!r}, {self.period_s!r}"
            )
        if self.indirect < 0:
            raise ConfigError(f"Probing.indirect must be >= 0, got {self.indirect!r}")
        if not self.suspicion_mult >= 1 or not self.suspicion_max_mult >= 1:
            raise ConfigError(
                f"Probing.suspicion_mult and suspicion_max_mult must be >= 1, got "
                f"{self.suspicion_mult!r}, {self.suspicion_max_mult!r}"
            )
        if not self.suspicion_max_s > 0:
            raise ConfigError(f"Probing.suspicion_max_s must be > 0, got {self.suspicion_max_s!r}")
        if self.retransmit_mult < 1 or self.max_piggyback < 1 or self.max_health < 0:
            raise ConfigError(
                "Probing needs retransmit_mult >= 1, max_piggyback >= 1 and max_health >= 0"
            )

    def suspicion_bounds_s(self, members: int) -> tuple[float, float]:
        """The shortest and the longest a suspicion lasts in a cluster of ``members``."""
        shortest = self.suspicion_mult * max(1.0, math.log10(max(members, 1))) * self.period_s
        longest = min(self.suspicion_max_mult * shortest, self.suspicion_max_s)
        return min(shortest, longest), longest

    def busy_bound_s(self, members: int) -> float:
        """The longest a suspicion of a peer that was slow to ack lately lasts: four times the
        longest (a busy peer's slowness extends it by at most three times the longest; on a
        saturated host a loop stalls seconds at a time). A peer quick to ack before it went
        silent, or whose port refuses (killed), gets the longest, as before."""
        return 4 * self.suspicion_bounds_s(members)[1]

    def suspicion_timeout_s(self, members: int, confirmations: int) -> float:
        """How long a suspicion lasts once ``confirmations`` other workers suspect the same
        peer (Lifeguard): the longest at none, falling with the log of the confirmations to
        the shortest at the ``suspicion_mult - 2`` expected (fewer in a small cluster). Where
        nobody can confirm it (two workers, or ``suspicion_mult`` below 3) it lasts the
        longest: a worker alone in its verdict takes its time."""
        shortest, longest = self.suspicion_bounds_s(members)
        expected = min(int(self.suspicion_mult) - 2, members - 2)
        if expected < 1:
            return longest
        fall = math.log(confirmations + 1) / math.log(expected + 1)
        return max(shortest, longest - (longest - shortest) * fall)

    def retransmits(self, members: int) -> int:
        """How many times one update is piggybacked, in a cluster of ``members``."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(members + 1)))


class ProbeOrder:
    """The peers in the order they are probed: a shuffled list walked round-robin, shuffled
    again at the end of each round, so every peer is probed once a round (SWIM's bound on the
    time to first detection) yet no two workers probe in lockstep. A newcomer is inserted at
    a random place; names that are no peer any more are skipped and dropped."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._order: list[str] = []
        self._names: set[str] = set()
        self._next = 0

    def add(self, name: str) -> None:
        if name not in self._names:
            self._names.add(name)
            self._order.insert(int(self._rng.random() * (len(self._order) + 1)), name)

    def next(self, live: Container[str], skip: Container[str] = ()) -> str | None:
        """The next peer to probe among ``live``, not one of ``skip`` (a probe of it is under
        way); None if there is none."""
        for _ in range(2 * len(self._order) + 1):
            if self._next >= len(self._order):
                self._order = [n for n in self._order if n in live]
                self._names = set(self._order)
                self._rng.shuffle(self._order)
                self._next = 0
                if not self._order:
                    return None
            name = self._order[self._next]
            self._next += 1
            if name in live and name not in skip:
                return name
        return None

    def __len__(self) -> int:
        return len(self._order)

    def __eq__(self, other: object) -> bool:  # the same order, at the same place in it
        if not isinstance(other, ProbeOrder):
            return NotImplemented
        return (self._order, self._next) == (other._order, other._next)

    __hash__ = None  # type: ignore[assignment]


@dataclass(slots=True)
class _Entry:
    update: Update
    order: int  # when it was added: the newer, the sooner it goes
    sent: int = 0


class Broadcasts:
    """The updates this worker has to tell, one per member (a newer one replaces the older),
    each piggybacked a bounded number of times: the least sent first, the newest first among
    those, so a fresh change goes out on the very next message."""

    def __init__(self) -> None:
        self._queue: dict[str, _Entry] = {}
        self._added = 0

    def add(self, update: Update) -> None:
        self._added += 1
        self._queue[update.name] = _Entry(update, self._added)

    def drop(self, name: str) -> None:
        self._queue.pop(name, None)

    def clear(self) -> None:
        self._queue.clear()

    def get(self, name: str) -> Update | None:
        """The update waiting about ``name``, if any."""
        entry = self._queue.get(name)
        return None if entry is None else entry.update

    def take(
        self, most: int, limit: int, first: str | None = None, times: int = 1
    ) -> tuple[Update, ...]:
        """Up to ``most`` updates for a message sent ``times`` times (to as many peers), the
        one about ``first`` ahead of all, if any (Lifeguard's buddy system tells a suspect it
        is suspected); each is counted sent ``times``, and dropped once sent ``limit``
        times."""
        chosen: list[_Entry] = []
        head = None if first is None else self._queue.get(first)
        if head is not None:
            chosen.append(head)
        if most > len(chosen):
            rest = (e for e in self._queue.values() if e is not head)
            chosen += heapq.nsmallest(most - len(chosen), rest, key=lambda e: (e.sent, -e.order))
        for entry in chosen:
            entry.sent += times
            if entry.sent >= limit:
                del self._queue[entry.update.name]
        return tuple(entry.update for entry in chosen)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, name: object) -> bool:
        return name in self._queue

    def __eq__(self, other: object) -> bool:  # the same updates, each sent as often
        if not isinstance(other, Broadcasts):
            return NotImplemented
        return (self._queue, self._added) == (other._queue, other._added)

    __hash__ = None  # type: ignore[assignment]
