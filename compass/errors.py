"""Every error compass raises to a user, in one tree.

::

    CompassError                      code
    ├── ConfigError                   "config"        bad configuration or arguments
    ├── ProtocolError                 "protocol"      the peer broke the wire protocol
    │   └── VersionMismatch           "version"       the peer speaks another protocol version
    ├── AuthenticationError           "auth"          wrong or missing cluster token
    ├── CompassConnectionError        "connection"    base of the connection errors below
    │   ├── ConnectFailed             "connect"       could not reach the address
    │   ├── ConnectionLost            "lost"          the peer went away (broken by peer)
    │   └── ConnectionClosed          "closed"        used after *you* closed it
    ├── CompassTimeout                "timeout"       a request got no answer in time
    ├── RemoteError                   "internal"      the peer failed in an unexpected way
    ├── WorkflowError                 "workflow"      an invalid workflow definition
    │   ├── UnknownWorkflow           "unknown_workflow"
    │   └── InvalidInputs             "invalid_inputs"
    ├── CacheError                    "cache"         the model cache could not serve a request
    │   ├── ModelTooLarge             "model_too_large"
    │   └── StaleHandle               "stale_handle"
    ├── JobFailed                     "job_failed"    a task of the job raised
    ├── DeadlineError                 "deadline"      the job's deadline cannot be met
    │   ├── DeadlineUnreachable       "deadline_unreachable"  refused: no plan meets it
    │   └── DeadlineExceeded          "deadline_exceeded"     dropped: too late to finish
    ├── JobTooLarge                   "job_too_large" one job's inputs exceed the ingress's limit
    ├── AnswerNotKept                 "answer_not_kept" a resubmitted key ran; its answer is gone
    ├── StreamOverrun                 "stream_overrun" the caller read a streamed job too slowly
    ├── UnknownOperation              "unknown_op"    the peer has no handler for a request
    └── WorkerUnavailable             "unavailable"   the worker is shutting down or has no peers
        ├── Overloaded                "overloaded"    too many jobs in flight at that ingress
        └── WorkersLost               "workers_lost"  the job's workers failed it too often

An error about one job carries its id (``detail["job_id"]``, :attr:`CompassError.job_id`), the
id the workers' logs name it by.

Errors cross the wire as ``{code, message, detail}`` (see :mod:`compass.wire.rpc`); the caller
re-raises the class registered for ``code``, so a remote ``UnknownWorkflow`` is a local
``UnknownWorkflow``. Nothing is ever pickled.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AnswerNotKept",
    "AuthenticationError",
    "CacheError",
    "CompassConnectionError",
    "CompassError",
    "CompassTimeout",
    "ConfigError",
    "ConnectFailed",
    "ConnectionClosed",
    "ConnectionLost",
    "DeadlineError",
    "DeadlineExceeded",
    "DeadlineUnreachable",
    "InvalidInputs",
    "JobFailed",
    "JobTooLarge",
    "ModelTooLarge",
    "Overloaded",
    "ProtocolError",
    "RemoteError",
    "StaleHandle",
    "StreamOverrun",
    "UnknownOperation",
    "UnknownWorkflow",
    "VersionMismatch",
    "WorkerUnavailable",
    "WorkersLost",
    "WorkflowError",
    "error_from_wire",
]


class CompassError(Exception):
    """Base of every error compass raises.

    ``code`` is stable and travels on the wire; ``detail`` carries structured, msgpack-able
    context (a remote traceback as text, the limit that was exceeded, ...).
    """

    code: ClassVar[str] = "error"
    _by_code: ClassVar[dict[str, type[CompassError]]] = {}

    def __init__(self, message: str, *, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            CompassError._by_code[cls.code] = cls

    @property
    def job_id(self) -> str | None:
        """The id of the job this error is about, where it is about one (workers log it)."""
        value = self.detail.get("job_id") if isinstance(self.detail, dict) else None
        return value if isinstance(value, str) else None

    def to_wire(self) -> dict[str, Any]:
        """The ``{code, message, detail}`` form sent to a peer."""
        return {"code": self.code, "message": self.message, "detail": self.detail}


class ConfigError(CompassError, ValueError):
    code = "config"


class ProtocolError(CompassError):
    code = "protocol"


class VersionMismatch(ProtocolError):
    code = "version"


class AuthenticationError(CompassError):
    code = "auth"


class CompassConnectionError(CompassError, ConnectionError):
    code = "connection"


class ConnectFailed(CompassConnectionError):
    code = "connect"


class ConnectionLost(CompassConnectionError):
    code = "lost"


class ConnectionClosed(CompassConnectionError):
    code = "closed"


class CompassTimeout(CompassError, TimeoutError):
    code = "timeout"


class RemoteError(CompassError):
    code = "internal"


class WorkflowError(CompassError):
    code = "workflow"


class UnknownWorkflow(WorkflowError):
    code = "unknown_workflow"


class InvalidInputs(WorkflowError):
    code = "invalid_inputs"


class CacheError(CompassError):
    code = "cache"


class ModelTooLarge(CacheError):
    code = "model_too_large"


class StaleHandle(CacheError):
    code = "stale_handle"


class JobFailed(CompassError):
    """A task raised. ``detail`` holds ``workflow``, ``task``, ``job_id`` and ``traceback``."""

    code = "job_failed"

    @property
    def task(self) -> str | None:
        return self.detail.get("task") if isinstance(self.detail, dict) else None

    @property
    def workflow(self) -> str | None:
        return self.detail.get("workflow") if isinstance(self.detail, dict) else None

    @property
    def remote_traceback(self) -> str | None:
        return self.detail.get("traceback") if isinstance(self.detail, dict) else None


class DeadlineError(CompassError):
    """The job's deadline (``deadline_ms``, or its workflow's objective) cannot be met. Not
    retried: a later try has even less time. ``detail`` holds ``job_id``, ``deadline_ms``
    and the estimate that missed it."""

    code = "deadline"


class DeadlineUnreachable(DeadlineError):
    """Refused at the ingress before anything ran: the best plan for the job finishes after
    its deadline (the estimate is in the message)."""

    code = "deadline_unreachable"


class DeadlineExceeded(DeadlineError):
    """Dropped on the way: a task of the job would start too late for the job to finish in
    time (now plus its remaining critical path past the deadline), so the job was answered at
    once and its other tasks dropped everywhere; or it finished, but past its deadline
    (``detail["late_ms"]``: by how much), and a late result is not given.
    ``on_miss="finish"`` runs it to the end and gives its value however late."""

    code = "deadline_exceeded"


class JobTooLarge(CompassError):
    """One job's inputs are larger than the ingress takes for one job (its ``--max-job-mb``,
    by default what one frame carries), or than the one frame a job travels in (the workers'
    ``--max-frame-mb``: the client refuses such a job before sending it). Not worth retrying
    anywhere with the same inputs: make them smaller, or raise the limit the message names."""

    code = "job_too_large"


class AnswerNotKept(CompassError):
    """A resubmission of a job key the ingress answered, whose answer it no longer keeps (it
    keeps answers within a byte budget). The job ran once and is not run again: the answer went
    to the request that submitted it first."""

    code = "answer_not_kept"


class StreamOverrun(CompassError):
    """The caller of a streamed job read its partial outputs too slowly: its ingress held as
    many as it keeps for one stream, so it cancelled the job rather than hold more (or drop
    one silently). Read faster, or submit the job without streaming."""

    code = "stream_overrun"


class UnknownOperation(CompassError):
    code = "unknown_op"


class WorkerUnavailable(CompassError):
    code = "unavailable"


class Overloaded(WorkerUnavailable):
    """The ingress already holds its limit of jobs in flight (``--max-jobs``), or of their
    inputs (``--max-held-mb``): retry later or submit to another worker. Nothing of the
    refused job was started."""

    code = "overloaded"


class WorkersLost(WorkerUnavailable):
    """The ingress took the job and planned it, but the workers it planned it on could not
    take or pass on its tasks (unreachable, degraded) more often than it plans a job again,
    or no worker was left to plan it on. Unlike its base class, it says nothing of the
    ingress, which answered the job (and keeps the answer under its key): a client does not
    submit it again to another worker, where it would run a second time."""

    code = "workers_lost"


def error_from_wire(code: object, message: object, detail: Any = None) -> CompassError:
    """Rebuild the typed error a peer reported. Unknown codes become :class:`RemoteError`."""
    cls = CompassError._by_code.get(code, RemoteError) if isinstance(code, str) else RemoteError
    text = message if isinstance(message, str) else repr(message)
    err = cls(text, detail=detail)
    if cls is RemoteError and code != RemoteError.code:
        err.detail = {"code": code, "detail": detail}
    return err
