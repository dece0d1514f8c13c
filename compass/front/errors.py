"""Compass errors as HTTP answers: the status, ``Retry-After``, and each protocol's body.

======================================  ======  ===============================================
error                                   status  why
======================================  ======  ===============================================
:class:`~compass.errors.UnknownWorkflow` 404    no such workflow (or OpenAI model name)
:class:`~compass.errors.InvalidInputs`   400    the inputs do not fit the workflow
:class:`~compass.errors.ConfigError`     400    a bad parameter
:class:`~compass.errors.JobTooLarge`     413    past ``--max-job-mb`` (also a body past it)
:class:`~compass.errors.DeadlineError`   429    refused, dropped or finished late for its
                                                deadline (a late result is not sent): retry
                                                later or with a longer one (``Retry-After``)
:class:`~compass.errors.WorkerUnavailable` 503  draining, overloaded, shutting down
                                                (``Retry-After``)
:class:`~compass.errors.CompassTimeout`  504    a task ran past its timeout
anything else                            500    a task failed: the body names the job id
======================================  ======  ===============================================

429 rather than 422 for a deadline: the request is well formed and could be met at another
load, which is what 429 and its ``Retry-After`` tell a client (422 says "do not retry as is").
"""

from __future__ import annotations

from typing import Any

from compass.errors import (
    CompassError,
    CompassTimeout,
    ConfigError,
    DeadlineError,
    InvalidInputs,
    JobTooLarge,
    UnknownWorkflow,
    WorkerUnavailable,
)

__all__ = ["RETRY_AFTER_S", "HttpError", "openai_body", "status_of", "v2_body"]

#: seconds a 429 or 503 asks the client to wait before retrying
RETRY_AFTER_S = 1

_STATUS: tuple[tuple[type[CompassError], int], ...] = (
    (UnknownWorkflow, 404),
    (InvalidInputs, 400),
    (ConfigError, 400),
    (JobTooLarge, 413),
    (DeadlineError, 429),
    (WorkerUnavailable, 503),
    (CompassTimeout, 504),
)


class HttpError(CompassError):
    """A request the front door refuses before it is a job: its status and one-line message."""

    code = "http"

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def status_of(exc: CompassError) -> tuple[int, int | None]:
    """The HTTP status for ``exc`` and the ``Retry-After`` seconds it carries (None: none)."""
    if isinstance(exc, HttpError):
        return exc.status, exc.retry_after
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status, RETRY_AFTER_S if status in (429, 503) else None
    return 500, None


def _message(exc: CompassError, status: int) -> str:
    job = exc.job_id
    if status == 500 and job is not None and job not in exc.message:
        return f"{exc.message} (job {job})"
    return exc.message


def v2_body(exc: CompassError, status: int) -> dict[str, Any]:
    """The Open Inference Protocol's error body: ``{"error": message}`` (with the job id)."""
    body: dict[str, Any] = {"error": _message(exc, status)}
    if exc.job_id is not None:
        body["job_id"] = exc.job_id
    return body


_OPENAI_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def openai_body(exc: CompassError, status: int) -> dict[str, Any]:
    """The OpenAI API's error body: ``{"error": {message, type, param, code}}``."""
    return {
        "error": {
            "message": _message(exc, status),
            "type": _OPENAI_TYPE.get(status, "server_error"),
            "param": None,
            "code": exc.code,
        }
    }
