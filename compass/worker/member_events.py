"""What goes into the member table and what comes out of it, sans-IO: the join handshake
(:class:`Hello`, checked as it is read), the events the table takes and the decisions it makes
(frozen, slotted dataclasses). The rules that connect them are
:class:`~compass.worker.members.MemberTable`'s.

The join handshake is the ``join`` request: ``{name, address, incarnation, instance, dead}``
one way, the same plus ``{members, peers}`` back (:class:`Welcome`), where ``dead`` is the
incarnation at which the sender declared the receiver dead (or ``None``), ``peers`` maps the
sender's live peers to their addresses and ``members`` lists those addresses (for workers that
predate ``peers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from compass.errors import CompassError, ProtocolError

__all__ = [
    "Close",
    "Decision",
    "Dial",
    "Duplicate",
    "Event",
    "Expire",
    "Forgot",
    "Fresh",
    "HeardFrom",
    "Hello",
    "JoinAnswered",
    "JoinAsked",
    "JoinSeeds",
    "Leave",
    "Left",
    "Moved",
    "NotASeed",
    "NotReached",
    "PeerDown",
    "PeerUp",
    "Refuse",
    "Refuted",
    "Remove",
    "RetryAt",
    "RetryFailed",
    "Seeds",
    "SeedsAnswered",
    "SeedsFailed",
    "Stale",
    "Tick",
    "Welcome",
    "members_of",
    "parse_join",
    "parse_welcome",
]


# -- the join handshake --------------------------------------------------------------------------
def _incarnation(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(f"join: an incarnation must be an integer >= 0, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Hello:
    """One side of the join handshake: who speaks, where it listens, its incarnation and
    instance, and ``dead``: the incarnation at which it declared the other side dead."""

    name: str
    address: str
    incarnation: int = 0
    instance: str = ""
    dead: int | None = None
    #: the sender said its incarnation (a worker that predates incarnations does not)
    has_incarnation: bool = True

    def __post_init__(self) -> None:
        _incarnation(self.incarnation)
        if self.dead is not None:
            _incarnation(self.dead)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "incarnation": self.incarnation,
            "instance": self.instance,
            "dead": self.dead,
        }


def parse_join(body: object) -> Hello:
    """A ``join`` request's body; :class:`CompassError` without a name and an address,
    :class:`ProtocolError` for a bad incarnation."""
    if not isinstance(body, dict) or "name" not in body or "address" not in body:
        raise CompassError("join needs {name, address}")
    return Hello(
        str(body["name"]),
        str(body["address"]),
        _incarnation(body.get("incarnation", 0)),
        str(body.get("instance", "")),
        None if body.get("dead") is None else _incarnation(body["dead"]),
        has_incarnation="incarnation" in body,
    )


def parse_welcome(reply: object, address: str) -> Hello:
    """The answer of the worker at ``address`` to this worker's ``join``; :class:`ProtocolError`
    if it is not one."""
    if not isinstance(reply, dict) or "name" not in reply or "address" not in reply:
        raise ProtocolError(f"{address} answered join without its name and address")
    return Hello(
        str(reply["name"]),
        str(reply["address"]),
        _incarnation(reply.get("incarnation", 0)),
        str(reply.get("instance", "")),
        None if reply.get("dead") is None else _incarnation(reply["dead"]),
    )


def members_of(reply: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """The ``(name, address)`` of the members a join answer names (name ``None`` from a worker
    that predates names in the handshake)."""
    named = reply.get("peers")
    if isinstance(named, dict):
        return [(str(n), str(a)) for n, a in named.items()]
    return [(None, str(a)) for a in reply.get("members", [])]


# -- events ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JoinAsked:
    """A worker that dialed this one asks to join with ``hello``."""

    now: float
    hello: Hello


@dataclass(frozen=True, slots=True)
class JoinAnswered:
    """The worker this one dialed at ``address`` (expected to be ``expect``, if known) answered
    its join with ``hello``."""

    now: float
    address: str
    expect: str | None
    hello: Hello


@dataclass(frozen=True, slots=True)
class HeardFrom:
    """A heartbeat of ``name`` arrived (of ``incarnation``, if it says)."""

    now: float
    name: str
    incarnation: int | None = None


@dataclass(frozen=True, slots=True)
class Expire:
    """Remove the peers silent for longer than ``timeout_s``."""

    now: float
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Remove:
    """Declare peer ``name`` dead (its connection broke, or it restarted): ``why`` says why."""

    now: float
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class Left:
    """Peer ``name`` said it leaves on purpose."""

    now: float
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class NotReached:
    """Member ``name`` at ``address``, named by a seed, could not be reached while joining."""

    now: float
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class RetryFailed:
    """A try to reach lost ``name`` failed."""

    now: float
    name: str


@dataclass(frozen=True, slots=True)
class Tick:
    """Look at the schedule: forget whom to forget, dial whom to dial. ``busy``: lost members
    whose retry is under way; ``seeds_busy``: a join through the seeds is under way."""

    now: float
    busy: frozenset[str] = frozenset()
    seeds_busy: bool = False


@dataclass(frozen=True, slots=True)
class Seeds:
    """This worker joins through ``addresses`` (itself possibly among them)."""

    now: float
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NotASeed:
    """Seed ``address`` turned out to be this worker (by its instance): drop it."""

    now: float
    address: str


@dataclass(frozen=True, slots=True)
class SeedsFailed:
    """This worker, with no peer, tried its seeds again and none took it: back off."""

    now: float


@dataclass(frozen=True, slots=True)
class SeedsAnswered:
    """This worker, with no peer, joined through its seeds again."""

    now: float


@dataclass(frozen=True, slots=True)
class Leave:
    """This worker leaves the cluster: it takes nobody in from now on."""

    now: float


@dataclass(frozen=True, slots=True)
class Close:
    """This worker closes: its channels close, it has no peer any more (none is declared dead,
    none is retried)."""

    now: float


Event: TypeAlias = (
    JoinAsked
    | JoinAnswered
    | HeardFrom
    | Expire
    | Remove
    | Left
    | NotReached
    | RetryFailed
    | Tick
    | Seeds
    | NotASeed
    | SeedsFailed
    | SeedsAnswered
    | Leave
    | Close
)


# -- decisions -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PeerUp:
    """``name`` is a live peer on the channel its join came on. ``replaces``: it was one
    already (a newer channel replaces the older); ``back_after_s``: how long it was lost, or
    None if it was not."""

    name: str
    address: str
    incarnation: int
    back_after_s: float | None
    replaces: bool


@dataclass(frozen=True, slots=True)
class PeerDown:
    """``name`` is no peer any more (declared dead, or it left): close its channel."""

    name: str
    address: str
    why: str


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Lost ``name`` is next tried at ``at``, after ``failures`` failed tries."""

    name: str
    address: str
    failures: int
    at: float


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the join (nothing changed for it): raise :meth:`error`."""

    kind: type[CompassError]
    message: str
    detail: Mapping[str, Any] | None = None

    def error(self) -> CompassError:
        """A fresh exception saying why (its ``detail`` a dict of its own)."""
        return self.kind(self.message, detail=None if self.detail is None else dict(self.detail))


@dataclass(frozen=True, slots=True)
class Welcome:
    """Answer the join with ``reply``."""

    reply: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The worker dialed at ``address`` has the name of live peer ``name`` (at
    ``live_address``) and is another process: ignore it (close its channel)."""

    name: str
    address: str
    live_address: str


@dataclass(frozen=True, slots=True)
class Moved:
    """Lost ``expected``'s address now answers as ``name``: ``expected`` is forgotten."""

    expected: str
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class Refuted:
    """``by`` had declared this worker dead at incarnation ``declared``: it is ``incarnation``
    now."""

    by: str
    declared: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class Forgot:
    """``name``, lost for ``lost_s``, is forgotten."""

    name: str
    lost_s: float


@dataclass(frozen=True, slots=True)
class Dial:
    """Try to reach lost ``name`` at ``address`` (answer with :class:`RetryFailed` if it fails)."""

    name: str
    address: str


@dataclass(frozen=True, slots=True)
class JoinSeeds:
    """This worker has no peer: join through ``seeds`` again (then :class:`SeedsAnswered` or
    :class:`SeedsFailed`)."""

    seeds: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Fresh:
    """A heartbeat of ``name`` counts: it is alive."""

    name: str


@dataclass(frozen=True, slots=True)
class Stale:
    """A heartbeat of ``name`` was of ``incarnation``, older than the ``recorded`` one: it was
    sent before the peer was declared dead and came back; ignore it."""

    name: str
    incarnation: int
    recorded: int


Decision: TypeAlias = (
    PeerUp
    | PeerDown
    | RetryAt
    | Refuse
    | Welcome
    | Duplicate
    | Moved
    | Refuted
    | Forgot
    | Dial
    | JoinSeeds
    | Fresh
    | Stale
)
