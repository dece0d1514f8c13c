"""The worker core's vocabulary: the events it is fed, the instructions it answers with, and
its window onto the view (:class:`ViewPort`).

Every event carries the time on the worker's clock (``now``) and an id (``cause``; the core
names an anonymous one); every instruction carries the id of the event that caused it, so a
trace or a test can tell why a task ran, a model loaded or a message went out (an anonymous
event's name is made only when read: :mod:`compass.core.causes`). The lanes'
own instructions, :class:`~compass.core.lanes.RunTask` and
:class:`~compass.core.lanes.LoadModel`, are defined with the lanes. Events and instructions
are frozen dataclasses, except those made for every task (:class:`Received`,
:class:`TaskDone`, :class:`Send`, :class:`~compass.core.lanes.RunTask`): records, frozen by
convention and to the type checker (:mod:`compass.records`), cheaper to make.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Protocol, TypeAlias

from compass.core.causes import Cause, Caused
from compass.core.messages import PeerMessage, PlanRequest, TaskMsg
from compass.core.queue import QueuedTask
from compass.core.replica import COLD_S
from compass.errors import CompassError, JobFailed
from compass.objective import NO_OBJECTIVE, Objective
from compass.records import record
from compass.sched.candidates import PlanScope
from compass.sched.heartbeat import Heartbeat
from compass.sched.placement import Placement
from compass.sched.snapshot import ViewSnapshot

__all__ = [
    "NOT_HANDLING",
    "Answer",
    "AskPlan",
    "Cancel",
    "Chunk",
    "Event",
    "Fault",
    "Feed",
    "Heard",
    "Instruction",
    "JoinRun",
    "LoadFailed",
    "LoadModel",
    "ModelLoaded",
    "Named",
    "PeerDraining",
    "PeerJoined",
    "PeerLost",
    "PlanAsked",
    "PlanReady",
    "Planned",
    "Received",
    "RunTask",
    "Send",
    "StopTask",
    "Submit",
    "SuspendTask",
    "TaskDone",
    "TaskFailed",
    "TaskReturned",
    "TaskStep",
    "Tick",
    "Undeliverable",
    "ViewPort",
    "Watch",
    "WatchFailed",
    "stimulus_id",
]


class ViewPort(Protocol):
    """What the core needs of the worker's view of the cluster."""

    def snapshot(
        self, now: float, without: str = "", priority: int = 0, scope: PlanScope | None = None
    ) -> ViewSnapshot:
        """The view at ``now``, this worker's own state exact, the counted placements of job
        ``without`` left out, the waits those of a task of ``priority``
        (:meth:`ClusterView.snapshot`). ``scope``: the job the snapshot is for, so a view
        that plans over candidates (:mod:`compass.sched.candidates`) may show only those;
        None, or a full view (the mesh), shows every worker."""
        ...

    def note_placement(self, worker: str, placed: Placement, now: float) -> None:
        """Count a task just placed on peer ``worker`` until its heartbeats do."""
        ...

    def remove(self, worker: str) -> None:
        """Forget a lost peer (and that it drained)."""
        ...

    def heard(self, heartbeat: Heartbeat, now: float) -> bool:
        """Take a peer's heartbeat into the view; False when it does not count (older than
        what the view holds, of a draining peer, or naming this worker)."""
        ...

    def drain(self, worker: str, instance: str) -> None:
        """Peer ``worker`` (process ``instance``) drains: out of the view until it leaves or
        another instance of it joins; its heartbeats no longer count."""
        ...

    def joined(self, worker: str, instance: str) -> None:
        """Peer ``worker`` (process ``instance``) is connected: a new instance is no longer
        draining (the same one, reconnecting, still is)."""
        ...

    def take_wanted(self) -> tuple[str, ...]:
        """The peers whose load the snapshots since the last call want watched (a bounded view
        plans over candidates that push their load to it: :class:`Watch`); () for none."""
        ...

    def watch_failed(self, peer: str) -> None:
        """A watch could not be asked of ``peer``: want it again at the next plan."""
        ...

    @property
    def version_id(self) -> int:
        """The weights version this worker serves, as task messages carry it
        (:func:`~compass.workflow.versions.version_id`; 0: not known, which checks nothing)."""
        ...

    def other_version(self, worker: str) -> None:
        """Peer ``worker`` refused a task of this worker's version: it serves another (it
        restarted with other weights, its first heartbeat not here yet). Out of the view until
        a heartbeat of it says its version (which keeps it apart, or brings it back)."""
        ...


# -- events ----------------------------------------------------------------------------------


class Named:
    """What every event type shares: an anonymous one names itself (:func:`stimulus_id`).
    :func:`compass.core.causes.cause_text` reads the name through this method: it cannot
    import this module, which imports the lanes, which use it."""

    __slots__ = ()

    def stimulus_id(self, n: int) -> str:
        """This event's id as the ``n``-th a core handled (:func:`stimulus_id`)."""
        return stimulus_id(self, n)  # type: ignore[arg-type]  # every subclass is an Event


# made for every job: a record, frozen by convention (:mod:`compass.records`)
@record
class Submit(Named):
    """A client submitted a job to this worker (its ingress). ``t0`` is the submit time on
    the clock every worker shares for job ages (wall clock; virtual time in the simulator)."""

    now: float
    job_id: str
    workflow: str
    inputs: Any
    input_bytes: int
    t0: float
    #: the client's name for the job: a resubmission with the same key gets the same answer
    key: str | None = None
    #: its deadline, priority and what to do when it would miss it
    objective: Objective = NO_OBJECTIVE
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""
    #: its caller reads its sinks' partial outputs as they are made (:class:`Chunk`)
    stream: bool = False


@dataclass(frozen=True, slots=True)
class TaskStep(Named):
    """Step ``seq`` (from 0) of step-wise task ``entry``, running here, ended with partial
    output ``value`` (reported only for a job that streams)."""

    now: float
    entry: QueuedTask
    seq: int
    value: Any
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class PlanReady(Named):
    """The plan asked of another worker (:class:`AskPlan`) arrived; ``None``: no answer,
    plan here."""

    now: float
    job_id: str
    plan: dict[str, str] | None
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


# made for every task: a record, frozen by convention (:mod:`compass.records`)
@record
class Received(Named):
    """A message from a peer. For a :class:`TaskMsg`: ``transfer_s`` it spent on the wire and
    ``job_arrival``, the job's submit time on this worker's clock."""

    now: float
    sender: str
    msg: PeerMessage
    transfer_s: float = 0.0
    job_arrival: float | None = None
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


# made for every task: a record, frozen by convention (:mod:`compass.records`)
@record
class TaskDone(Named):
    """``entry`` ran to its end with ``output``. ``exec_s``: how long its run took, measured
    (None: not measured, as in emulation); ``batch``: how many tasks the run took, ``first``:
    ``entry`` led it (a batch is one measurement, recorded under its lead); ``steps``: the
    steps a step-wise run took (0: a plain task). A learning core (real mode) folds the
    measurement and the output's size into its profiles."""

    now: float
    entry: QueuedTask
    output: Any
    exec_s: float | None = None
    batch: int = 1
    first: bool = True
    steps: int = 0
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class TaskFailed(Named):
    """``entry`` failed: ``error`` is ``Type: message``; ``code`` the error's wire code.
    ``still_running``: it was abandoned past its timeout and its thread runs on (it keeps its
    model pinned until :class:`TaskReturned`)."""

    now: float
    entry: QueuedTask
    error: str
    traceback: str = ""
    code: str = JobFailed.code
    still_running: bool = False
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class TaskReturned(Named):
    """The thread of ``entry``, abandoned past its timeout, returned at last."""

    now: float
    entry: QueuedTask
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class ModelLoaded(Named):
    """The load of ``model`` (a :class:`LoadModel`) ended after ``seconds`` of copying."""

    now: float
    model: str
    seconds: float
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class LoadFailed(Named):
    """The load of ``model`` failed with ``error``; the tasks waiting for it fail with it."""

    now: float
    model: str
    error: CompassError
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class Tick(Named):
    """A periodic check (the real worker's heartbeat): an idle worker may warm its cache."""

    now: float
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""
    #: a hot model the cluster wants another copy of here, ahead of need (empty: none;
    #: :mod:`compass.elastic.replicate`)
    hot: str = ""
    #: ``hot``'s copy evicts only models unused here for this long (:mod:`compass.core.replica`)
    cold_s: float = COLD_S
    #: models ``hot``'s copy may evict though used lately (:mod:`compass.core.replica`)
    spare: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PeerLost(Named):
    """Peer ``name`` was declared dead or left."""

    now: float
    name: str
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class Cancel(Named):
    """The client of ``job_id`` stopped waiting: drop the job everywhere."""

    now: float
    job_id: str
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class Undeliverable(Named):
    """``msg`` could not be sent to ``peer``: ``error`` says why (a task output the wire
    cannot encode, say). The job it carried fails; nothing else does. ``unreachable``: this
    worker has no connection to ``peer`` (one that restarted and has not reached it yet):
    the job's ingress plans it again instead."""

    now: float
    peer: str
    msg: PeerMessage
    error: str
    unreachable: bool = False
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class WatchFailed(Named):
    """A :class:`Watch` could not be asked of ``peer`` (no channel to it now)."""

    now: float
    peer: str
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class PlanAsked(Named):
    """Another ingress asks this worker to plan its job (the ``central`` policy plans at one
    worker); answer with :class:`Planned`. Planning counts the placements in this worker's
    view, so it is an event, not a query."""

    now: float
    request: PlanRequest
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class Heard(Named):
    """A heartbeat of a live peer, of its current incarnation (the membership vouched for
    it): its queue and cache go into the view, and a host-to-device bandwidth it measured
    into the profiles."""

    now: float
    heartbeat: Heartbeat
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class PeerJoined(Named):
    """Peer ``name`` (process ``instance``) is connected: new, back, or restarted."""

    now: float
    name: str
    instance: str
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


@dataclass(frozen=True, slots=True)
class PeerDraining(Named):
    """Peer ``name`` (process ``instance``) drains before it stops: nothing new is placed
    there until it leaves or another instance joins under its name."""

    now: float
    name: str
    instance: str
    #: its id, carried by every instruction it causes (empty: the core names it)
    cause: str = ""


Event: TypeAlias = (
    Submit
    | PlanReady
    | Received
    | TaskDone
    | TaskFailed
    | TaskReturned
    | ModelLoaded
    | LoadFailed
    | Tick
    | PeerLost
    | Cancel
    | Undeliverable
    | PlanAsked
    | Heard
    | PeerJoined
    | PeerDraining
    | WatchFailed
    | TaskStep
)


# -- instructions ----------------------------------------------------------------------------


# made for every task: a record, frozen by convention (:mod:`compass.records`)
@record
class RunTask(Caused):
    """Run ``entry`` on ``lane`` now, with ``mates`` in one batch (other jobs' tasks of its
    group); its model (if any) is resident and pinned for the run. Each entry ends with an
    event of its own.

    GPU lanes are numbered from 0, host lanes after them. ``fetch_s``: how long it waited for
    its model; ``hit``: whether the model was resident when the task asked (None: no model).
    """

    entry: QueuedTask
    lane: int
    host: bool
    fetch_s: float
    hit: bool | None
    mates: tuple[QueuedTask, ...] = ()
    #: the event that made it run (:attr:`cause` names it)
    stimulus: Cause = ""

    @property
    def entries(self) -> tuple[QueuedTask, ...]:
        """Every task of the run, its first (``entry``) first."""
        return (self.entry, *self.mates)


@dataclass(frozen=True, slots=True)
class LoadModel(Caused):
    """Copy ``model``'s weights into the slabs the cache gave it; ``evict`` left the cache to
    make room (their modules go). Answer with ``ModelLoaded`` or ``LoadFailed``."""

    model: str
    evict: tuple[str, ...]
    prefetch: bool
    #: the event that made it load (:attr:`cause` names it)
    stimulus: Cause = ""


# made for every task: a record, frozen by convention (:mod:`compass.records`)
@record
class Send(Caused):
    """Send ``msg`` to peer ``peer`` (never this worker: the core delivers those itself)."""

    peer: str
    msg: PeerMessage
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class Chunk(Caused):
    """A partial output of a job this worker is the ingress of, for its caller: step ``seq``
    of sink ``task``, in order per task (the job's :class:`Answer` still ends it)."""

    job_id: str
    task: str
    seq: int
    value: Any
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class Feed(Caused):
    """Of a streamed edge into task ``task`` of ``job_id``'s ``attempt``, here: step ``seq``
    of predecessor ``source`` gave partial output ``value``, in order (``last`` false); or
    ``source`` ended (``last``: ``value`` is its final output, which the stream does not
    yield); or the stream breaks (``error``: its job ended or failed), so a task reading it
    stops waiting. The first of a stream comes before the task can run."""

    job_id: str
    attempt: int
    task: str
    source: str
    seq: int
    value: Any
    last: bool = False
    error: CompassError | None = None
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class StopTask(Caused):
    """``entries`` run here for a job that ended (answered, cancelled, failed or dropped
    elsewhere): a step-wise task stops at its next step boundary, which frees its lane (its
    outcome still comes, as :class:`TaskFailed`); a plain one runs to its end."""

    entries: tuple[QueuedTask, ...]
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class JoinRun(Caused):
    """Step-wise ``entries`` join the step batch that ``lead``'s run is on ``lane``
    (continuous batching: a task of the batch's group takes a seat at its next step boundary
    and leaves when its own steps end). Each ends with an event of its own; the lane is free
    when every member has ended."""

    lead: QueuedTask
    entries: tuple[QueuedTask, ...]
    lane: int
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class SuspendTask(Caused):
    """Step-wise ``entry``, running here, gives its lane up at the step boundary just reported
    (:class:`TaskStep`): a queued task runs first (:mod:`compass.core.preempt`). It keeps its
    state and resumes where it stopped when a lane takes it again (a :class:`RunTask` of an
    entry whose ``done_steps`` is above 0); it never runs twice, and its outcome comes once,
    when it ends."""

    entry: QueuedTask
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class Watch(Caused):
    """Ask ``peers`` to send this worker their state for a lease: its plans are placing work
    there (a bounded view's candidates; answered with heartbeats, or :class:`WatchFailed`)."""

    peers: tuple[str, ...]
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class AskPlan(Caused):
    """Ask ``peer`` to plan the job (answer with :class:`PlanReady`)."""

    peer: str
    request: PlanRequest
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


# made for every job: a record, frozen by convention (:mod:`compass.records`)
@record
class Answer(Caused):
    """The job's one answer: ``value``, or ``error``. ``record`` describes the job for the
    worker's trace (plan, attempts, latency)."""

    job_id: str
    value: Any = None
    error: CompassError | None = None
    record: Mapping[str, Any] = field(default_factory=dict)
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class Planned(Caused):
    """The answer to :class:`PlanAsked`: ``plan`` for ``job_id``, or the ``error`` that
    stopped it (an unknown workflow, say); ``peer`` asked."""

    peer: str
    job_id: str
    plan: dict[str, str] | None
    error: CompassError | None = None
    #: the event that caused it (:attr:`cause` names it; see :meth:`WorkerCore.handle`)
    stimulus: Cause = ""


@dataclass(frozen=True, slots=True)
class Fault(Caused):
    """Handling the event ``cause`` raised ``error``, a bug: the instructions before this one
    were decided, and must be carried out, as the core's state changed with them; what the
    event would have done after is lost. The worker logs and counts it, the simulator
    stops."""

    error: Exception
    #: the event whose handling raised (:attr:`cause` names it)
    stimulus: Cause = ""


Instruction: TypeAlias = (
    Send
    | RunTask
    | LoadModel
    | AskPlan
    | Answer
    | Planned
    | Watch
    | StopTask
    | SuspendTask
    | JoinRun
    | Chunk
    | Feed
    | Fault
)


def stimulus_id(event: Event, n: int) -> str:
    """The id of an anonymous event, the ``n``-th a core handled: its kind, what it is about,
    and its number (the same for the same events): ``kind:subject#n``, or ``kind#n`` when it
    is about nothing in particular (a tick)."""
    namer = _NAMERS.get(type(event))
    if namer is None:
        namer = _namer_of(type(event))
    return namer(event, n)


def _namer_of(kind: type) -> Callable[[Any, int], str]:
    """The namer of a subclass of an event type; an object of no event type is a bug."""
    for base in kind.__mro__:
        namer = _NAMERS.get(base)
        if namer is not None:
            return namer
    raise AssertionError(f"not an event: {kind.__name__}")


def _about(kind: str, subject: Callable[[Any], str]) -> Callable[[Any, int], str]:
    """The namer of an event kind about ``subject`` (its job, model or peer)."""

    def named(event: Any, n: int) -> str:
        about = subject(event)
        return f"{kind}:{about}#{n}" if about else f"{kind}#{n}"

    return named


def _submit_id(event: Submit, n: int) -> str:
    job = event.job_id
    return f"submit:{job}#{n}" if job else f"submit#{n}"


def _received_id(event: Received, n: int) -> str:
    msg = event.msg
    if isinstance(msg, TaskMsg):
        return f"received:{msg.job}/{msg.task}<{msg.source}#{n}"
    return f"received:{msg.op}:{msg.job}#{n}"


def _entry_id(kind: str) -> Callable[[TaskDone | TaskFailed | TaskReturned, int], str]:
    def named(event: TaskDone | TaskFailed | TaskReturned, n: int) -> str:
        entry = event.entry
        return f"{kind}:{entry.job_id}/{entry.task}#{n}"

    return named


#: event type -> its namer (one per type, looked up by exact type: the core's hot path).
#: Every type of :data:`Event` has one (tests/unit/worker/test_core_events.py checks it)
_NAMERS: dict[type, Callable[[Any, int], str]] = {
    Submit: _submit_id,
    PlanReady: _about("plan-ready", attrgetter("job_id")),
    Received: _received_id,
    TaskDone: _entry_id("done"),
    TaskFailed: _entry_id("failed"),
    TaskReturned: _entry_id("returned"),
    ModelLoaded: _about("loaded", attrgetter("model")),
    LoadFailed: _about("load-failed", attrgetter("model")),
    Tick: lambda e, n: f"tick#{n}",
    PeerLost: _about("lost", attrgetter("name")),
    Cancel: _about("cancel", attrgetter("job_id")),
    Undeliverable: lambda e, n: f"undeliverable:{e.msg.op}>{e.peer}#{n}",
    PlanAsked: _about("plan-asked", attrgetter("request.job")),
    Heard: _about("heard", attrgetter("heartbeat.name")),
    PeerJoined: _about("joined", attrgetter("name")),
    PeerDraining: _about("draining", attrgetter("name")),
    WatchFailed: _about("watch-failed", attrgetter("peer")),
    TaskStep: lambda e, n: f"step:{e.entry.job_id}/{e.entry.task}:{e.seq}#{n}",
}


class _NotHandling(list[Instruction]):
    """The core's output between events: an instruction decided outside ``handle`` is a bug
    (one shared sentinel instead of a fresh list after every event)."""

    def append(self, instruction: Instruction, /) -> None:
        raise RuntimeError(f"the core decided {instruction!r} outside handle")


#: see :class:`_NotHandling`
NOT_HANDLING: list[Instruction] = _NotHandling()
