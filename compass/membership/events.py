"""What goes into the member table and what comes out of it, sans-IO: the join handshake
(:class:`Hello`, checked as it is read), the events the table takes and the decisions it makes
(frozen, slotted dataclasses). The rules that connect them are
:class:`~compass.membership.table.MemberTable`'s.

The join handshake is the ``join`` request: ``{name, address, incarnation, instance, dead}``
one way, the same plus ``{members, peers, incarnations}`` back (:class:`Welcome`), where
``dead`` is the incarnation at which the sender declared the receiver dead (or ``None``),
``peers`` maps the sender's live peers to their addresses, ``incarnations`` to their
incarnations, and ``members`` lists those addresses (for workers that predate ``peers``). A
join that says ``list: false`` (a redial of a known peer, which does not need the member list)
is answered without the three.

The failure detector's messages are notifies between peers (:data:`PROBE_OPS`): ``probe``
``{seq, from, to, up}``, answered by ``ack`` ``{seq, from, up}``; ``probe-req`` ``{seq, from,
target, address, up}`` asks a peer to probe ``target`` for the sender, and is answered by an
``ack`` (the target answered) or a ``nack`` (it did not, in time). ``up`` holds the
piggybacked membership updates (:class:`Update`), each ``[status, name, incarnation,
address, by]``. Each message is read into its event by :func:`parse_probe`, checked as it is
read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from compass.errors import CompassError, ProtocolError

__all__ = [
    "MAX_UPDATES",
    "PROBE_OPS",
    "Acked",
    "AskIndirect",
    "Caused",
    "ChannelLost",
    "Close",
    "Decision",
    "Dial",
    "Duplicate",
    "Event",
    "Fault",
    "ForgetAfter",
    "Forgot",
    "Fresh",
    "Gossiped",
    "HeardFrom",
    "Hello",
    "JoinAnswered",
    "JoinAsked",
    "JoinSeeds",
    "Leave",
    "Left",
    "Listens",
    "Moved",
    "Nacked",
    "Named",
    "NotASeed",
    "NotReached",
    "PeerDown",
    "PeerUp",
    "Pinged",
    "ProbeAsked",
    "ProbeUnsent",
    "Refuse",
    "Refuted",
    "Remove",
    "RetryAt",
    "RetryFailed",
    "Seeds",
    "SeedsAnswered",
    "SeedsFailed",
    "SendAck",
    "SendNack",
    "SendProbe",
    "Stale",
    "Stalled",
    "Status",
    "Suspect",
    "Tick",
    "Unsuspected",
    "Update",
    "Welcome",
    "members_of",
    "named_in",
    "parse_join",
    "parse_probe",
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
        has_incarnation="incarnation" in reply,
    )


def members_of(reply: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """The ``(name, address)`` of the members a join answer names (name ``None`` from a worker
    that predates names in the handshake)."""
    named = reply.get("peers")
    if isinstance(named, dict):
        return [(str(n), str(a)) for n, a in named.items()]
    return [(None, str(a)) for a in reply.get("members", [])]


def named_in(reply: Mapping[str, Any]) -> tuple[tuple[str, str, int], ...]:
    """The ``(name, address, incarnation)`` of the members a join answer names by name (the
    incarnation 0 where it does not say); :class:`ProtocolError` for a bad incarnation."""
    named = reply.get("peers")
    if not isinstance(named, dict):
        return ()
    incarnations = reply.get("incarnations")
    if not isinstance(incarnations, dict):
        incarnations = {}
    return tuple((str(n), str(a), _incarnation(incarnations.get(n, 0))) for n, a in named.items())


# -- the failure detector's messages ------------------------------------------------------------
#: what an :class:`Update` says of a member
Status: TypeAlias = Literal["alive", "suspect", "dead", "left"]
_STATUSES: tuple[Status, ...] = ("alive", "suspect", "dead", "left")

#: the notifies of the failure detector
PROBE_OPS = ("probe", "probe-req", "ack", "nack")

#: the most updates one message may carry (a sender piggybacks far fewer)
MAX_UPDATES = 64

#: a probe's sequence number is below this
_MAX_SEQ = 1 << 63


@dataclass(frozen=True, slots=True)
class Update:
    """One membership change as the failure detector spreads it: member ``name`` is
    ``status`` at ``incarnation``; ``address``: where it listens (for ``alive``, so that a
    worker that did not know it can dial it); ``by``: the worker that says so (one
    suspicion told by distinct workers is confirmed)."""

    status: Status
    name: str
    incarnation: int
    address: str = ""
    by: str = ""

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ProtocolError(f"an update's status must be one of {_STATUSES}, got "
                                f"{self.status!r}")  # fmt: skip
        _incarnation(self.incarnation)

    def to_wire(self) -> list[Any]:
        return [_STATUSES.index(self.status), self.name, self.incarnation, self.address, self.by]


def _update(value: object) -> Update:
    if not (isinstance(value, list) and len(value) == 5):
        raise ProtocolError(f"an update is [status, name, incarnation, address, by], got "
                            f"{value!r:.80}")  # fmt: skip
    code, name, incarnation, address, by = value
    if not (isinstance(code, int) and 0 <= code < len(_STATUSES)) or isinstance(code, bool):
        raise ProtocolError(f"an update's status must be 0..{len(_STATUSES) - 1}, got {code!r}")
    if not (isinstance(name, str) and name and isinstance(address, str) and isinstance(by, str)):
        raise ProtocolError("an update's name, address and by must be strings (a name not empty)")
    return Update(_STATUSES[code], name, _incarnation(incarnation), address, by)


def _updates(body: dict[Any, Any]) -> tuple[Update, ...]:
    value = body.get("up", [])
    if not isinstance(value, list) or len(value) > MAX_UPDATES:
        raise ProtocolError(f"a probe's updates must be a list of at most {MAX_UPDATES}")
    return tuple(_update(v) for v in value)


def _seq(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _MAX_SEQ:
        raise ProtocolError(f"a probe's seq must be an integer in [0, 2**63), got {value!r:.40}")
    return value


def _name(body: dict[Any, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"a probe message needs {key!r}, a worker's name")
    return value


def parse_probe(op: str, body: object, now: float) -> Pinged | ProbeAsked | Acked | Nacked:
    """The event a failure detector's message ``op`` (one of :data:`PROBE_OPS`) with ``body``
    is, at ``now``; :class:`ProtocolError` if it is not well formed."""
    if not isinstance(body, dict):
        raise ProtocolError(f"a {op!r} message must be a map")
    seq, sender, updates = _seq(body.get("seq")), _name(body, "from"), _updates(body)
    if op == "probe":
        return Pinged(now, sender, seq, _name(body, "to"), updates)
    if op == "probe-req":
        address = body.get("address")
        if not isinstance(address, str) or not address:
            raise ProtocolError("a probe-req needs the target's address")
        return ProbeAsked(now, sender, seq, _name(body, "target"), address, updates)
    if op == "ack":
        return Acked(now, sender, seq, updates)
    if op == "nack":
        return Nacked(now, sender, seq, updates)
    raise ProtocolError(f"{op!r} is not a failure detector's message ({', '.join(PROBE_OPS)})")


def _wire(updates: tuple[Update, ...]) -> list[list[Any]]:
    return [u.to_wire() for u in updates]


# -- events ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Caused:
    """What every event and decision shares: ``cause``, the id of what caused it (dask's
    stimulus ids). An event's own id, or empty: the table names it ``kind:subject#n``, the
    ``n``-th event it handled; a decision's is the id of the event it was decided on (set by
    :meth:`~compass.membership.table.MemberTable.handle`). Keyword-only, and left out of
    comparisons: it says where a thing came from, not what it is."""

    cause: str = field(default="", kw_only=True, compare=False)


@dataclass(frozen=True, slots=True)
class JoinAsked(Caused):
    """A worker that dialed this one asks to join with ``hello``; ``wants_list``: it wants
    the member list back (a joiner does; a redial of a known peer need not)."""

    now: float
    hello: Hello
    wants_list: bool = True


@dataclass(frozen=True, slots=True)
class Named(Caused):
    """Worker ``by`` named ``members`` (``(name, address, incarnation)``) in the welcome it
    answered this worker's join with: taken as live without dialing them."""

    now: float
    by: str
    members: tuple[tuple[str, str, int], ...]


@dataclass(frozen=True, slots=True)
class JoinAnswered(Caused):
    """The worker this one dialed at ``address`` (expected to be ``expect``, if known) answered
    its join with ``hello``."""

    now: float
    address: str
    expect: str | None
    hello: Hello


@dataclass(frozen=True, slots=True)
class HeardFrom(Caused):
    """A heartbeat of ``name`` arrived (of ``incarnation``, if it says); ``direct``: ``name``
    sent it itself, on its own channel (not a rumor passed on): it was running a moment ago."""

    now: float
    name: str
    incarnation: int | None = None
    direct: bool = False


@dataclass(frozen=True, slots=True)
class Remove(Caused):
    """Declare peer ``name`` dead at once (not through a suspicion): ``why`` says why."""

    now: float
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class Left(Caused):
    """Peer ``name`` said it leaves on purpose."""

    now: float
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class NotReached(Caused):
    """Member ``name`` at ``address``, named by a seed, could not be reached while joining."""

    now: float
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class RetryFailed(Caused):
    """A try to reach lost ``name`` failed."""

    now: float
    name: str


@dataclass(frozen=True, slots=True)
class Tick(Caused):
    """Look at the schedule: probe the next peer when the period is up, go indirect or
    suspect when an ack is late, declare dead a suspect whose time is up, forget whom to
    forget, dial whom to dial. ``busy``: lost members whose retry is under way;
    ``seeds_busy``: a join through the seeds is under way."""

    now: float
    busy: frozenset[str] = frozenset()
    seeds_busy: bool = False


@dataclass(frozen=True, slots=True)
class Seeds(Caused):
    """This worker joins through ``addresses`` (itself possibly among them)."""

    now: float
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NotASeed(Caused):
    """Seed ``address`` turned out to be this worker (by its instance): drop it."""

    now: float
    address: str


@dataclass(frozen=True, slots=True)
class SeedsFailed(Caused):
    """This worker, with no peer, tried its seeds again and none took it: back off."""

    now: float


@dataclass(frozen=True, slots=True)
class SeedsAnswered(Caused):
    """This worker, with no peer, joined through its seeds again."""

    now: float


@dataclass(frozen=True, slots=True)
class Leave(Caused):
    """This worker leaves the cluster: it takes nobody in from now on."""

    now: float


@dataclass(frozen=True, slots=True)
class Close(Caused):
    """This worker closes: its channels close, it has no peer any more (none is declared dead,
    none is retried)."""

    now: float


@dataclass(frozen=True, slots=True)
class Pinged(Caused):
    """Peer ``sender`` probes this worker (probe ``seq``, meant for ``to``) with ``updates``."""

    now: float
    sender: str
    seq: int
    to: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeAsked(Caused):
    """Peer ``sender`` asks this worker to probe ``target`` (at ``address``) for it: its
    probe ``seq`` timed out."""

    now: float
    sender: str
    seq: int
    target: str
    address: str
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Acked(Caused):
    """Peer ``sender`` answered probe ``seq``: its target is alive (``sender`` is the target,
    or a peer that probed it for this worker)."""

    now: float
    sender: str
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class Nacked(Caused):
    """Peer ``sender``, asked to probe for this worker (its probe ``seq``), got no answer."""

    now: float
    sender: str
    seq: int
    updates: tuple[Update, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeUnsent(Caused):
    """Probe ``seq`` could not be sent (no channel to its target, and dialing it failed;
    ``refused``: its host refused the connection, nothing listens at its address)."""

    now: float
    seq: int
    refused: bool = False


@dataclass(frozen=True, slots=True)
class ChannelLost(Caused):
    """The channel to live peer ``name`` broke: probe it now (it is dialed again for that)."""

    now: float
    name: str


@dataclass(frozen=True, slots=True)
class Stalled(Caused):
    """This worker's own event loop ran ``late_s`` seconds late (a timer due ``late_s`` ago
    fired only now): its peers' silence meanwhile is no sign against them."""

    now: float
    late_s: float


@dataclass(frozen=True, slots=True)
class Gossiped(Caused):
    """``updates`` arrived from ``sender`` other than on a probe."""

    now: float
    sender: str
    updates: tuple[Update, ...]


@dataclass(frozen=True, slots=True)
class Listens(Caused):
    """This worker listens at ``address`` now (its server bound): what it tells its peers in
    the join handshake from now on."""

    now: float
    address: str


@dataclass(frozen=True, slots=True)
class ForgetAfter(Caused):
    """A member lost ``seconds`` is forgotten from now on (:attr:`~compass.membership.table.
    MemberTable.forget_after_s`)."""

    now: float
    seconds: float


Event: TypeAlias = (
    JoinAsked
    | JoinAnswered
    | Named
    | HeardFrom
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
    | Pinged
    | ProbeAsked
    | Acked
    | Nacked
    | ProbeUnsent
    | ChannelLost
    | Stalled
    | Gossiped
    | Listens
    | ForgetAfter
)


# -- decisions -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PeerUp(Caused):
    """``name`` is a live peer on the channel its join came on. ``replaces``: it was one
    already (a newer channel replaces the older); ``back_after_s``: how long it was lost, or
    None if it was not."""

    name: str
    address: str
    incarnation: int
    back_after_s: float | None
    replaces: bool


@dataclass(frozen=True, slots=True)
class PeerDown(Caused):
    """``name`` is no peer any more (declared dead, or it left): close its channel."""

    name: str
    address: str
    why: str


@dataclass(frozen=True, slots=True)
class RetryAt(Caused):
    """Lost ``name`` is next tried at ``at``, after ``failures`` failed tries."""

    name: str
    address: str
    failures: int
    at: float


@dataclass(frozen=True, slots=True)
class Refuse(Caused):
    """Refuse the join (nothing changed for it): raise :meth:`error`."""

    kind: type[CompassError]
    message: str
    detail: Mapping[str, Any] | None = None

    def error(self) -> CompassError:
        """A fresh exception saying why (its ``detail`` a dict of its own)."""
        return self.kind(self.message, detail=None if self.detail is None else dict(self.detail))


@dataclass(frozen=True, slots=True)
class Welcome(Caused):
    """Answer the join with ``reply``."""

    reply: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Duplicate(Caused):
    """The worker dialed at ``address`` has the name of live peer ``name`` (at
    ``live_address``) and is another process: ignore it (close its channel)."""

    name: str
    address: str
    live_address: str


@dataclass(frozen=True, slots=True)
class Moved(Caused):
    """Lost ``expected``'s address now answers as ``name``: ``expected`` is forgotten."""

    expected: str
    name: str
    address: str


@dataclass(frozen=True, slots=True)
class Refuted(Caused):
    """``by`` had declared this worker dead at incarnation ``declared`` (``suspected``: only
    suspected it, which the refutation ends before anyone declares it dead): it is
    ``incarnation`` now."""

    by: str
    declared: int
    incarnation: int
    suspected: bool = False


@dataclass(frozen=True, slots=True)
class Forgot(Caused):
    """``name``, lost for ``lost_s``, is forgotten."""

    name: str
    lost_s: float


@dataclass(frozen=True, slots=True)
class Dial(Caused):
    """Try to reach lost ``name`` at ``address`` (answer with :class:`RetryFailed` if it fails)."""

    name: str
    address: str


@dataclass(frozen=True, slots=True)
class JoinSeeds(Caused):
    """This worker has no peer: join through ``seeds`` again (then :class:`SeedsAnswered` or
    :class:`SeedsFailed`)."""

    seeds: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Fresh(Caused):
    """A heartbeat of ``name`` counts: it is alive."""

    name: str


@dataclass(frozen=True, slots=True)
class Stale(Caused):
    """A heartbeat of ``name`` was of ``incarnation``, older than the ``recorded`` one: it was
    sent before the peer was declared dead and came back; ignore it."""

    name: str
    incarnation: int
    recorded: int


@dataclass(frozen=True, slots=True)
class SendProbe(Caused):
    """Probe ``target`` at ``address`` (``seq``, piggybacking ``updates``); with no channel to
    it, dial it first (and answer :class:`ProbeUnsent` if that fails)."""

    target: str
    address: str
    seq: int
    updates: tuple[Update, ...]

    def to_wire(self, sender: str) -> dict[str, Any]:
        return {"seq": self.seq, "from": sender, "to": self.target, "up": _wire(self.updates)}


@dataclass(frozen=True, slots=True)
class AskIndirect(Caused):
    """Ask each of ``via`` to probe ``target`` at ``address`` for this worker's probe
    ``seq`` (``probe-req``)."""

    via: tuple[str, ...]
    target: str
    address: str
    seq: int
    updates: tuple[Update, ...]

    def to_wire(self, sender: str) -> dict[str, Any]:
        return {"seq": self.seq, "from": sender, "target": self.target,
                "address": self.address, "up": _wire(self.updates)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class SendAck(Caused):
    """Answer probe ``seq`` of ``to``: alive (on the channel the probe came on, if it did)."""

    to: str
    seq: int
    updates: tuple[Update, ...]

    def to_wire(self, sender: str) -> dict[str, Any]:
        return {"seq": self.seq, "from": sender, "up": _wire(self.updates)}


@dataclass(frozen=True, slots=True)
class SendNack(Caused):
    """Tell ``to`` that the peer it asked this worker to probe (its probe ``seq``) did not
    answer in time."""

    to: str
    seq: int
    updates: tuple[Update, ...]

    def to_wire(self, sender: str) -> dict[str, Any]:
        return {"seq": self.seq, "from": sender, "up": _wire(self.updates)}


@dataclass(frozen=True, slots=True)
class Suspect(Caused):
    """Peer ``name`` (at ``incarnation``) is suspected (first by ``by``): it is declared dead
    in ``timeout_s`` unless it refutes, sooner as others confirm."""

    name: str
    incarnation: int
    by: str
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Unsuspected(Caused):
    """Suspected peer ``name`` refuted it: it is alive at ``incarnation``."""

    name: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class Fault(Caused):
    """Handling the event ``cause`` raised ``error``, a bug: the decisions before this one were
    made, and must be carried out, as the table changed with them; what the event would have
    decided after is lost. The adapter logs it."""

    error: Exception


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
    | SendProbe
    | AskIndirect
    | SendAck
    | SendNack
    | Suspect
    | Unsuspected
    | Fault
)
