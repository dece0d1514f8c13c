"""The public surface is pinned: changing it is a decision, not an accident."""

from __future__ import annotations

import compass
from compass import errors


def test_all_is_pinned() -> None:
    assert sorted(compass.__all__) == [
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
        "SKIPPED",
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
    for name in compass.__all__:
        assert hasattr(compass, name), name


def test_every_error_derives_from_compass_error_and_has_a_unique_code() -> None:
    classes = [getattr(errors, n) for n in errors.__all__ if isinstance(getattr(errors, n), type)]
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        assert issubclass(cls, errors.CompassError)


def test_errors_round_trip_through_their_wire_form() -> None:
    original = errors.UnknownWorkflow("unknown workflow 'x'", detail={"known": ["a"]})
    wire = original.to_wire()
    again = errors.error_from_wire(wire["code"], wire["message"], wire["detail"])
    assert type(again) is errors.UnknownWorkflow
    assert again.message == original.message and again.detail == {"known": ["a"]}
    odd = errors.error_from_wire("no-such-code", "boom", 1)
    assert type(odd) is errors.RemoteError and odd.detail == {"code": "no-such-code", "detail": 1}
    assert type(errors.error_from_wire(7, b"x")) is errors.RemoteError
