"""compass: decentralized scheduling of latency-sensitive ML workflows across GPU workers.

The public surface: declare models and workflows with :class:`App`, run workers with
``compass worker start`` (or :class:`LocalCluster` for a local one), and submit jobs with the
async :class:`Client`. Everything raised derives from :class:`CompassError`.

Names are imported on first use (PEP 562), so importing a sans-IO module such as
``compass.wire.frames`` or ``compass.sched.planner`` does not pull in asyncio or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from compass.app import App, Stream, load_app
    from compass.cache.weights import Model
    from compass.client import Client, JobResult
    from compass.cluster import LocalCluster
    from compass.config import CacheConfig, Limits, SchedConfig, Timeouts, WorkerConfig
    from compass.errors import (
        AnswerNotKept,
        AuthenticationError,
        CacheError,
        CompassConnectionError,
        CompassError,
        CompassTimeout,
        ConfigError,
        ConnectFailed,
        ConnectionClosed,
        ConnectionLost,
        DeadlineError,
        DeadlineExceeded,
        DeadlineUnreachable,
        InvalidInputs,
        JobFailed,
        JobTooLarge,
        ModelTooLarge,
        Overloaded,
        ProtocolError,
        RemoteError,
        StaleHandle,
        StreamOverrun,
        UnknownOperation,
        UnknownWorkflow,
        VersionMismatch,
        WorkersLost,
        WorkerUnavailable,
        WorkflowError,
    )
    from compass.reports import JobRecord, WorkerStatus, WorkerTimeline
    from compass.submission import JobOptions
    from compass.sync_client import SyncClient
    from compass.trace import JobTrace, TaskTrace
    from compass.workflow.choices import SKIPPED, Decision, choose, fan_out, stop
    from compass.workflow.dag import Task, TaskProfile, Workflow
    from compass.workflow.seats import Done, Seat, step_batch

__all__ = [
    "SKIPPED",
    "AnswerNotKept",
    "App",
    "AuthenticationError",
    "CacheConfig",
    "CacheError",
    "Client",
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
    "Decision",
    "Done",
    "InvalidInputs",
    "JobFailed",
    "JobOptions",
    "JobRecord",
    "JobResult",
    "JobTooLarge",
    "JobTrace",
    "Limits",
    "LocalCluster",
    "Model",
    "ModelTooLarge",
    "Overloaded",
    "ProtocolError",
    "RemoteError",
    "SchedConfig",
    "Seat",
    "StaleHandle",
    "Stream",
    "StreamOverrun",
    "SyncClient",
    "Task",
    "TaskProfile",
    "TaskTrace",
    "Timeouts",
    "UnknownOperation",
    "UnknownWorkflow",
    "VersionMismatch",
    "WorkerConfig",
    "WorkerStatus",
    "WorkerTimeline",
    "WorkerUnavailable",
    "WorkersLost",
    "Workflow",
    "WorkflowError",
    "__version__",
    "choose",
    "fan_out",
    "load_app",
    "step_batch",
    "stop",
]

_ERRORS = (
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
)

#: where each public name lives; imported on first access
_LAZY: dict[str, str] = {
    "App": "compass.app",
    "load_app": "compass.app",
    "Stream": "compass.app",
    "Model": "compass.cache.weights",
    "Client": "compass.client",
    "JobResult": "compass.client",
    "JobOptions": "compass.submission",
    "SyncClient": "compass.sync_client",
    "LocalCluster": "compass.cluster",
    "CacheConfig": "compass.config",
    "Limits": "compass.config",
    "SchedConfig": "compass.config",
    "Timeouts": "compass.config",
    "WorkerConfig": "compass.config",
    "JobRecord": "compass.reports",
    "WorkerStatus": "compass.reports",
    "WorkerTimeline": "compass.reports",
    "JobTrace": "compass.trace",
    "TaskTrace": "compass.trace",
    "Task": "compass.workflow.dag",
    "TaskProfile": "compass.workflow.dag",
    "Workflow": "compass.workflow.dag",
    **dict.fromkeys(
        ("SKIPPED", "Decision", "choose", "fan_out", "stop"), "compass.workflow.choices"
    ),
    **dict.fromkeys(("Done", "Seat", "step_batch"), "compass.workflow.seats"),
    **dict.fromkeys(_ERRORS, "compass.errors"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
