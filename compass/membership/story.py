"""How the member table's events and decisions read in its stimulus log
(:class:`~compass.stimuli.StimulusLog`), and how an anonymous event is named
(:func:`stimulus_id`): ``kind:subject#n``, the ``n``-th event the table handled, about the peer
it names (``heard-from:b#12``), or ``kind#n`` (``tick#40``).

:func:`stimulus` makes the entry of one event, with the peers it and its decisions name, so that
``story(peer)`` finds every event that touched a peer. The routine is not kept
(:func:`worth_keeping`): a heartbeat that was merely fresh, a tick that decided nothing or only
the next probe of the round, a probe acked and a ping answered with nothing else decided. They
come every few milliseconds and tell nothing new: kept, they would push a peer's join, its
suspicion or its removal out of the log within a minute. What is not routine is kept whole
(a probe that went unanswered is followed by the indirect probes, the suspicion, the verdict).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields
from operator import attrgetter
from typing import Any

from compass.membership.events import (
    Acked,
    ChannelLost,
    Decision,
    Event,
    Fault,
    Fresh,
    Gossiped,
    HeardFrom,
    JoinAnswered,
    JoinAsked,
    Left,
    Listens,
    Nacked,
    Named,
    NotASeed,
    NotReached,
    Pinged,
    ProbeAsked,
    Remove,
    RetryFailed,
    SendAck,
    SendProbe,
    Tick,
)
from compass.stimuli import Stimulus

__all__ = ["stimulus", "stimulus_id", "worth_keeping"]

#: event type -> what its subject is (the peer it is about, or an address)
_SUBJECT: dict[type, Callable[[Any], str]] = {
    HeardFrom: attrgetter("name"),
    Remove: attrgetter("name"),
    Left: attrgetter("name"),
    NotReached: attrgetter("name"),
    RetryFailed: attrgetter("name"),
    ChannelLost: attrgetter("name"),
    Pinged: attrgetter("sender"),
    ProbeAsked: attrgetter("sender"),
    Acked: attrgetter("sender"),
    Nacked: attrgetter("sender"),
    Gossiped: attrgetter("sender"),
    Named: attrgetter("by"),
    JoinAsked: attrgetter("hello.name"),
    JoinAnswered: attrgetter("hello.name"),
    NotASeed: attrgetter("address"),
    Listens: attrgetter("address"),
}

#: fields a decision's or an event's words leave out: its cause (said apart), its time (idem),
#: and what is long (piggybacked updates, a welcome's member list, a handshake)
_QUIET = frozenset({"cause", "now", "updates", "reply", "detail", "members", "hello", "busy"})

#: fields that name a peer
_NAMES = ("name", "to", "target", "by", "expected", "sender", "expect")


#: type -> its kind in words (:func:`_kind`)
_KINDS: dict[type, str] = {}


def _kind(kind: type) -> str:
    """``PeerDown`` -> ``peer-down``."""
    words = _KINDS.get(kind)
    if words is None:
        words = _KINDS[kind] = re.sub(r"(?<!^)(?=[A-Z])", "-", kind.__name__).lower()
    return words


def stimulus_id(event: Event, n: int) -> str:
    """The id of an anonymous ``event``, the ``n``-th the table handled (see the module
    docstring)."""
    subject = _SUBJECT.get(type(event))
    about = "" if subject is None else subject(event)
    kind = _kind(type(event))
    return f"{kind}:{about}#{n}" if about else f"{kind}#{n}"


#: events that are routine when they decide no more than :data:`_ROUTINE_DECISIONS`
_ROUTINE_EVENTS = frozenset({Tick, HeardFrom, Pinged, Acked})
_ROUTINE_DECISIONS = frozenset({Fresh, SendProbe, SendAck})


def worth_keeping(event: Event, decisions: list[Decision]) -> bool:
    """Whether ``event``, which decided ``decisions``, goes into the log (see the module
    docstring)."""
    if type(event) not in _ROUTINE_EVENTS:
        return True
    return any(type(d) not in _ROUTINE_DECISIONS for d in decisions)


def stimulus(event: Event, n: int, cause: str, decisions: list[Decision]) -> Stimulus:
    """The log entry of ``event``, the ``n``-th the table handled, of id ``cause``, which
    decided ``decisions``: the event in words begins with its anonymous name
    (:func:`stimulus_id`), which its cause is unless it came with an id of its own."""
    about: set[str] = set()
    subject = _SUBJECT.get(type(event))
    if subject is not None:
        about.add(subject(event))
    for update in getattr(event, "updates", ()):
        about.add(update.name)
    if type(event) is Named:
        about.update(name for name, _, _ in event.members)
    did = tuple(_words(d, about) for d in decisions)
    about.discard("")
    words = _words(event, set(), head=stimulus_id(event, n))
    return Stimulus(cause, event.now, words, did, tuple(sorted(about)))


def _words(thing: Event | Decision, about: set[str], head: str = "") -> str:
    """``thing`` in words: ``head`` (its kind by default) and its short fields; the peers it
    names go to ``about``."""
    if isinstance(thing, Fault):
        return f"fault: {type(thing.error).__name__}: {thing.error}"[:300]
    parts = []
    for f in fields(thing):
        if f.name in _QUIET:
            continue
        value = getattr(thing, f.name)
        if f.name in _NAMES and isinstance(value, str):
            about.add(value)
        elif f.name == "via":
            about.update(value)
        if isinstance(value, float):
            parts.append(f"{f.name}={value:.6g}")
        elif isinstance(value, str | int | bool) or value is None:
            parts.append(f"{f.name}={value}")
        elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
            parts.append(f"{f.name}={','.join(value)}")
    return " ".join([head or _kind(type(thing)), *parts])[:300]
