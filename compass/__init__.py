"""compass: decentralized scheduling of latency-sensitive ML workflows across GPU workers.

The public surface: declare models and workflows with :class:`App`, run workers with
``compass worker start`` (or :class:`LocalCluster` for a local one), and submit jobs with the
async :class:`Client`. Everything raised derives from :class:`CompassError`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from compass.app import App, load_app
from compass.cache.models import Model
from compass.client import Client
from compass.cluster import LocalCluster
from compass.config import CacheConfig, Limits, SchedConfig, Timeouts, WorkerConfig
from compass.errors import (
    AuthenticationError,
    CacheError,
    CompassConnectionError,
    CompassError,
    CompassTimeout,
    ConfigError,
    ConnectFailed,
    ConnectionClosed,
    ConnectionLost,
    InvalidInputs,
    JobFailed,
    ModelTooLarge,
    Overloaded,
    ProtocolError,
    RemoteError,
    UnknownWorkflow,
    VersionMismatch,
    WorkerUnavailable,
    WorkflowError,
)
from compass.workflow.dag import Task, TaskProfile, Workflow

__all__ = [
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
    "InvalidInputs",
    "JobFailed",
    "Limits",
    "LocalCluster",
    "Model",
    "ModelTooLarge",
    "Overloaded",
    "ProtocolError",
    "RemoteError",
    "SchedConfig",
    "Task",
    "TaskProfile",
    "Timeouts",
    "UnknownWorkflow",
    "VersionMismatch",
    "WorkerConfig",
    "WorkerUnavailable",
    "Workflow",
    "WorkflowError",
    "__version__",
    "load_app",
]
