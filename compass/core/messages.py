"""Every one-way message between workers, typed: one frozen dataclass each (:class:`TaskMsg`,
made for every task, frozen by convention: :mod:`compass.records`), one encode
(:meth:`to_wire`) and one decode (:func:`decode`).

Decoding validates types and required fields, so a malformed message from a peer is a
:class:`~compass.errors.ProtocolError` the worker counts and drops, never an exception inside
its rules. Whether a message makes sense (a workflow this worker knows, a plan that places
every task) is the worker core's to check: :mod:`compass.core.state`.

The wire layout (a msgpack map per message, keys as below) is documented in
docs/ARCHITECTURE.md ("Peer messages"). Values (task outputs, job inputs) travel as the codec
encodes them: arrays and tensors out of band.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from compass.errors import ProtocolError
from compass.records import record

if TYPE_CHECKING:
    from compass.core.queue import QueuedTask

__all__ = [
    "JOB_INPUTS",
    "LINK_LOST",
    "OTHER_VERSION",
    "PEER_MESSAGES",
    "ChoseMsg",
    "ChunkMsg",
    "DoneMsg",
    "FailedMsg",
    "PeerMessage",
    "PlacedMsg",
    "PlanReply",
    "PlanRequest",
    "ResultMsg",
    "TaskMsg",
    "decode",
]

#: the ``source`` of a push that carries the job's own inputs to a root task
JOB_INPUTS = ""

#: the ``code`` of a :class:`FailedMsg` that says a link broke (a peer lost, or a channel that
#: closed under a message): what was on it may be lost, and the job is planned again. Unlike
#: ``"unavailable"`` (a worker could not take or pass on a task) it never uses up the job's
#: attempts: each comes of one event of membership, as a lost peer's re-plan does
LINK_LOST = "link_lost"

#: the ``code`` of a :class:`FailedMsg` that says a worker refused a task of another version of
#: the weights than it serves (:attr:`TaskMsg.version`): the job's ingress plans it again
#: without that worker, as for a worker that could not take a task (``"unavailable"``), and
#: counts it alike
OTHER_VERSION = "other_version"


def _field(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], op: str) -> Any:
    try:
        value = body[key]
    except KeyError:
        raise ProtocolError(f"peer message {op!r} lacks field {key!r}") from None
    # bool is an int to isinstance; no field of ours takes a bool for a number
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise ProtocolError(
            f"peer message {op!r}: field {key!r} must be {_names(kind)}, got {type(value).__name__}"
        )
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _kinds(kind))


def _plan(body: Mapping[str, Any], key: str, op: str) -> dict[str, str]:
    """A map of task -> worker. Its entries are checked where they are used (the worker core
    checks the ones a message needs): a 1000-task plan travels with every push, and checking
    it whole at every hop would make a long chain quadratic."""
    plan: dict[str, str] = _field(body, key, dict, op)
    return plan


_NUMBER = (int, float)


def _budget(body: Mapping[str, Any], op: str) -> float | None:
    if "dl" not in body:
        return None
    budget = float(_field(body, "dl", _NUMBER, op))
    if not math.isfinite(budget):
        raise ProtocolError(f"peer message {op!r}: field 'dl' must be finite, got {budget!r}")
    return budget


# made for every task: a record, frozen by convention (:mod:`compass.records`)
@record
class TaskMsg:
    """One input of ``task``: the output of predecessor ``source``, or (``source`` =
    :data:`JOB_INPUTS`) the mapping of job inputs for a root task. ``plan`` is the job's plan
    as the sender knows it; ``sent`` and ``t0`` are wall-clock seconds (push time, job submit
    time) from which the receiver derives transfer time and job age.

    The job's objective: ``priority`` (higher runs first), ``budget_s`` (seconds left to its
    deadline when the message was sent, on the sender's clock: the receiver rebases it on its
    own, less the transfer; None: no deadline) and ``finish`` (run it to the end even past its
    deadline). Deadlines cross hosts as budgets, so no two hosts' clocks are compared."""

    op: ClassVar[str] = "task"
    job: str
    attempt: int
    workflow: str
    task: str
    source: str
    value: Any
    plan: dict[str, str]
    ingress: str
    sent: float = 0.0
    t0: float = 0.0
    priority: int = 0
    budget_s: float | None = None
    finish: bool = False
    #: the job streams its sinks' partial outputs to its caller (a step-wise sink sends each
    #: step's to the ingress: :class:`ChunkMsg`)
    stream: bool = False
    #: ``value`` is the first partial output of ``source``, which ``task`` takes as a stream
    #: (a streamed edge): the task may start now; the rest come as :class:`ChunkMsg` to it,
    #: and its end as a message like this one without the flag, carrying the final output
    opens: bool = False
    #: the weights version of the sender (:func:`~compass.workflow.versions.version_id`; 0:
    #: not known, which checks nothing), set where the message leaves it (:meth:`stamp`). A
    #: worker takes tasks of its own version only and plans on workers of its own, so it is
    #: the version the job's ingress planned with; a receiver of another refuses the task
    version: int = 0

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "job": self.job,
            "att": self.attempt,
            "wf": self.workflow,
            "task": self.task,
            "from": self.source,
            "value": self.value,
            "plan": self.plan,
            "ingress": self.ingress,
            "sent": self.sent,
            "t0": self.t0,
        }
        # the objective only when there is one: a job without one costs no bytes
        if self.priority:
            body["pri"] = self.priority
        if self.budget_s is not None:
            body["dl"] = self.budget_s
        if self.finish:
            body["fin"] = True
        if self.stream:
            body["st"] = True
        if self.opens:
            body["os"] = True
        if self.version:
            body["v"] = self.version
        return body

    def stamp(self, version: int) -> None:
        """Say the sender's weights version: where the message leaves its sender, which made
        it for this one send (frozen to the type checker, a record takes a store at run time:
        :mod:`compass.records`; a copy of 16 fields per task would cost more)."""
        object.__setattr__(self, "version", version)

    @classmethod
    def onward(
        cls,
        entry: QueuedTask,
        workflow: str,
        task: str,
        value: Any,
        plan: dict[str, str],
        now: float,
        *,
        opens: bool = False,
    ) -> TaskMsg:
        """What ``entry``'s task, run here, sends ``task`` of its job: ``value`` under
        ``plan``, with the job's fields and its deadline as the budget left at ``now``."""
        budget_s = None if entry.deadline is None else entry.deadline - now
        return cls(
            entry.job_id, entry.attempt, workflow, task, entry.task, value, plan,
            entry.ingress, 0.0, entry.t0, entry.level, budget_s, entry.finish, entry.stream,
            opens,
        )  # fmt: skip

    def to(self, task: str, source: str, value: Any) -> TaskMsg:
        """The same job's message for ``task``, from ``source``, carrying ``value``: its plan
        and objective kept, field by field (see :meth:`with_plan`); not sent yet."""
        return TaskMsg(
            self.job, self.attempt, self.workflow, task, source, value, self.plan,
            self.ingress, 0.0, self.t0, self.priority, self.budget_s, self.finish, self.stream,
        )  # fmt: skip

    def with_plan(self, plan: dict[str, str]) -> TaskMsg:
        """The same message carrying ``plan`` (every other field kept): what a copy on the
        wire is, for the simulator, field by field (``dataclasses.replace`` looks each one
        up by name, three times the cost, for every task)."""
        return TaskMsg(
            self.job, self.attempt, self.workflow, self.task, self.source, self.value, plan,
            self.ingress, self.sent, self.t0, self.priority, self.budget_s, self.finish,
            self.stream, self.opens, self.version,
        )  # fmt: skip

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> TaskMsg:
        op = cls.op
        if "value" not in body:
            raise ProtocolError(f"peer message {op!r} lacks field 'value'")
        return cls(
            job=_field(body, "job", str, op),
            attempt=_field(body, "att", int, op),
            workflow=_field(body, "wf", str, op),
            task=_field(body, "task", str, op),
            source=_field(body, "from", str, op),
            value=body["value"],
            plan=_plan(body, "plan", op),
            ingress=_field(body, "ingress", str, op),
            sent=float(_field(body, "sent", _NUMBER, op)),
            t0=float(_field(body, "t0", _NUMBER, op)),
            priority=_field(body, "pri", int, op) if "pri" in body else 0,
            budget_s=_budget(body, op),
            finish=_field(body, "fin", bool, op) if "fin" in body else False,
            stream=_field(body, "st", bool, op) if "st" in body else False,
            opens=_field(body, "os", bool, op) if "os" in body else False,
            version=_field(body, "v", int, op) if "v" in body else 0,
        )


@dataclass(frozen=True, slots=True)
class ResultMsg:
    """The output of sink ``task``, for the job's ingress."""

    op: ClassVar[str] = "result"
    job: str
    attempt: int
    task: str
    value: Any

    def to_wire(self) -> dict[str, Any]:
        return {"job": self.job, "att": self.attempt, "task": self.task, "value": self.value}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> ResultMsg:
        op = cls.op
        if "value" not in body:
            raise ProtocolError(f"peer message {op!r} lacks field 'value'")
        return cls(
            job=_field(body, "job", str, op),
            attempt=_field(body, "att", int, op),
            task=_field(body, "task", str, op),
            value=body["value"],
        )


@dataclass(frozen=True, slots=True)
class ChunkMsg:
    """Step ``seq`` (from 0) of step-wise ``task`` ended with partial output ``value``: for
    the ingress of a job that streams to its caller (``task`` a sink, ``to`` empty), or for
    successor ``to``, which takes ``task``'s partial outputs as they come (a streamed edge;
    its step 0 came in the :class:`TaskMsg` that opened the stream)."""

    op: ClassVar[str] = "chunk"
    job: str
    attempt: int
    task: str
    seq: int
    value: Any
    to: str = ""

    def to_wire(self) -> dict[str, Any]:
        body = {
            "job": self.job,
            "att": self.attempt,
            "task": self.task,
            "seq": self.seq,
            "value": self.value,
        }
        if self.to:
            body["to"] = self.to
        return body

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> ChunkMsg:
        op = cls.op
        if "value" not in body:
            raise ProtocolError(f"peer message {op!r} lacks field 'value'")
        return cls(
            job=_field(body, "job", str, op),
            attempt=_field(body, "att", int, op),
            task=_field(body, "task", str, op),
            seq=_field(body, "seq", int, op),
            value=body["value"],
            to=_field(body, "to", str, op) if "to" in body else "",
        )


@dataclass(frozen=True, slots=True)
class FailedMsg:
    """``task`` of the job failed on ``worker``; ``code`` is the error's wire code
    (:class:`~compass.errors.CompassError`), ``message`` and ``traceback`` its text."""

    op: ClassVar[str] = "failed"
    job: str
    attempt: int
    task: str
    worker: str
    message: str
    traceback: str = ""
    code: str = "job_failed"

    def to_wire(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "att": self.attempt,
            "task": self.task,
            "worker": self.worker,
            "message": self.message,
            "traceback": self.traceback,
            "code": self.code,
        }

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> FailedMsg:
        op = cls.op
        return cls(
            job=_field(body, "job", str, op),
            attempt=_field(body, "att", int, op),
            task=_field(body, "task", str, op),
            worker=_field(body, "worker", str, op),
            message=_field(body, "message", str, op),
            traceback=str(body.get("traceback", "")),
            code=str(body.get("code", "job_failed")),
        )


@dataclass(frozen=True, slots=True)
class PlacedMsg:
    """Dynamic adjustment moved ``task`` to ``worker``: the ingress keeps its plan current
    (it re-plans the job if that worker is lost)."""

    op: ClassVar[str] = "placed"
    job: str
    attempt: int
    task: str
    worker: str

    def to_wire(self) -> dict[str, Any]:
        return {"job": self.job, "att": self.attempt, "task": self.task, "worker": self.worker}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> PlacedMsg:
        op = cls.op
        return cls(
            job=_field(body, "job", str, op),
            attempt=_field(body, "att", int, op),
            task=_field(body, "task", str, op),
            worker=_field(body, "worker", str, op),
        )


@dataclass(frozen=True, slots=True)
class ChoseMsg:
    """Decision task ``task`` of a workflow decided at run time chose ``label`` (a branch's
    successor, a fan-out's width, a loop's "again" or "stop"): for the job's ingress, which
    records it with the job and learns the workflow's choice frequencies from it."""

    op: ClassVar[str] = "chose"
    job: str
    attempt: int
    task: str
    label: str

    def to_wire(self) -> dict[str, Any]:
        return {"job": self.job, "att": self.attempt, "task": self.task, "label": self.label}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> ChoseMsg:
        op = cls.op
        return cls(
            job=_field(body, "job", str, op),
            attempt=_field(body, "att", int, op),
            task=_field(body, "task", str, op),
            label=_field(body, "label", str, op),
        )


@dataclass(frozen=True, slots=True)
class DoneMsg:
    """Drop what is held of the job: every attempt (``below`` None: it was answered or
    abandoned), or the attempts below ``below`` (it was re-planned)."""

    op: ClassVar[str] = "done"
    job: str
    below: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"job": self.job, "below": self.below}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> DoneMsg:
        op = cls.op
        below = body.get("below")
        if below is not None and (not isinstance(below, int) or isinstance(below, bool)):
            raise ProtocolError(f"peer message {op!r}: 'below' must be an int or nil")
        return cls(job=_field(body, "job", str, op), below=below)


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """Plan a job for another ingress (the ``central`` policy plans at one worker); a
    request, answered with the plan (:func:`PlanReply.from_wire`)."""

    op: ClassVar[str] = "plan"
    job: str
    workflow: str
    ingress: str
    input_bytes: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "workflow": self.workflow,
            "ingress": self.ingress,
            "input_bytes": self.input_bytes,
        }

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> PlanRequest:
        op = cls.op
        return cls(
            job=_field(body, "job", str, op),
            workflow=_field(body, "workflow", str, op),
            ingress=_field(body, "ingress", str, op),
            input_bytes=_field(body, "input_bytes", int, op),
        )


class PlanReply:
    """The answer to a :class:`PlanRequest`: task -> worker."""

    @staticmethod
    def from_wire(body: Any) -> dict[str, str]:
        if not isinstance(body, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in body.items()
        ):
            raise ProtocolError("a plan reply must map task names to worker names")
        return body


PeerMessage: TypeAlias = TaskMsg | ResultMsg | FailedMsg | PlacedMsg | DoneMsg | ChunkMsg | ChoseMsg

#: every peer message type, by its ``op``
PEER_MESSAGES: tuple[type[PeerMessage], ...] = (
    TaskMsg, ResultMsg, FailedMsg, PlacedMsg, DoneMsg, ChunkMsg, ChoseMsg,
)  # fmt: skip

_BY_OP: dict[str, type[PeerMessage]] = {cls.op: cls for cls in PEER_MESSAGES}


def decode(op: str, body: Any) -> PeerMessage:
    """The typed message ``op`` with ``body``; :class:`ProtocolError` when it is malformed."""
    cls = _BY_OP.get(op)
    if cls is None:
        raise ProtocolError(f"unknown peer message {op!r}")
    if not isinstance(body, dict):
        raise ProtocolError(f"peer message {op!r} must be a map, got {type(body).__name__}")
    return cls.from_wire(body)
