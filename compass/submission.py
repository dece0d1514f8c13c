"""What a client makes of a submission's arguments before anything is sent: the job's inputs
(an ``inputs`` mapping and keywords, which cannot be mistaken for the client's options), its
objective's fields, whether it fits the one frame it travels in, and the sentinel that means
"the client's own timeout".

A job's inputs go either in ``inputs={...}`` or as keywords (``submit("wf", image=x)``).
:meth:`~compass.client.Client.submit_job` takes its options as one :class:`JobOptions`
(``submit_job("wf", options=JobOptions(trace=True), image=x)``); its old keyword spellings
still work, with a :class:`DeprecationWarning`.
A keyword is a job input unless it is one of the submission's options; a keyword named like
an option of another submission method (``trace`` given to ``submit``) is refused with a
:class:`TypeError` that says to pass it in ``inputs=``, where any name is an input. Sans-IO.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from compass.config import Limits, frame_carries
from compass.errors import InvalidInputs, JobTooLarge
from compass.objective import OnMiss, check_objective
from compass.payload import payload_bytes

__all__ = [
    "OPTION_NAMES",
    "USE_CLIENT_DEFAULT",
    "JobOptions",
    "OnMiss",
    "TimeoutArg",
    "UseClientDefault",
    "check_job_size",
    "job_inputs",
    "job_options",
    "objective_fields",
    "resolve_timeout",
]


class UseClientDefault(enum.Enum):
    """The type of :data:`USE_CLIENT_DEFAULT`: a call's ``timeout`` left unsaid, so the
    client's ``timeouts.request`` applies (``None`` means no timeout at all)."""

    USE_CLIENT_DEFAULT = "the client's timeouts.request"

    def __repr__(self) -> str:
        return "USE_CLIENT_DEFAULT"


#: a call's ``timeout`` left unsaid: the client's ``timeouts.request`` applies
USE_CLIENT_DEFAULT: Final = UseClientDefault.USE_CLIENT_DEFAULT

#: a call's ``timeout``: seconds, None (no timeout) or left unsaid (the client's own)
TimeoutArg = float | None | UseClientDefault

#: the options of the submission methods (``submit``, ``submit_job``, ``submit_many``), which
#: a keyword can never be a job input of; ``inputs`` is the mapping itself, ``options``
#: ``submit_job``'s :class:`JobOptions`
OPTION_NAMES: Final = frozenset(
    {"timeout", "deadline_ms", "priority", "on_miss", "trace", "traceparent", "concurrency",
     "inputs", "options"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The options of one job of :meth:`~compass.client.Client.submit_job`: its objective,
    ``deadline_ms``, ``priority`` and ``on_miss`` (as :meth:`~compass.client.Client.submit`
    takes them, checked when the job is submitted), ``trace`` (trace the job whatever the
    workers' sampling and answer its trace with it) and ``traceparent`` (the W3C trace
    context of the caller's span; by default the current OpenTelemetry span's)."""

    deadline_ms: float | None = None
    priority: int = 0
    on_miss: OnMiss = "drop"
    trace: bool = False
    traceparent: str | None = None


#: :class:`JobOptions`' fields, which ``submit_job`` took as keywords before (deprecated)
_JOB_OPTIONS: Final = ("deadline_ms", "priority", "on_miss", "trace", "traceparent")


def job_options(method: str, options: JobOptions | None, keywords: dict[str, Any]) -> JobOptions:
    """``options``, or the default ones; a :class:`JobOptions` field given as a keyword is
    taken out of ``keywords`` into them, with a :class:`DeprecationWarning` (the spelling
    ``method`` took before), or a :class:`TypeError` beside ``options``."""
    old = {name: keywords.pop(name) for name in _JOB_OPTIONS if name in keywords}
    if not old:
        return JobOptions() if options is None else options
    said = ", ".join(f"{name}=" for name in old)
    if options is not None:
        raise TypeError(f"{method}() got options= and {said} too; put them all in options=")
    warnings.warn(
        f"{method}({said}...) is deprecated: pass options=JobOptions({said}...); to send a "
        f"job input of such a name, pass it in inputs=",
        DeprecationWarning,
        stacklevel=3,
    )
    return JobOptions(**old)


def resolve_timeout(timeout: TimeoutArg, default: float | None) -> float | None:
    """``timeout``, or ``default`` where it was left unsaid; a TypeError for anything else
    (a job input named ``timeout`` passed as a keyword lands here)."""
    if isinstance(timeout, UseClientDefault):
        return default
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout must be a number of seconds or None, got {timeout!r}; to send a job "
            "input named 'timeout', pass it in inputs={'timeout': ...}"
        )
    return float(timeout)


def job_inputs(method: str, inputs: object, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """A job's inputs from ``inputs`` (a mapping or None) and ``keywords``; a
    :class:`TypeError` that says what to do when they are not a mapping of names, name an
    input twice, or a keyword is named like a submission option ``method`` does not take."""
    for name in keywords:
        if name in OPTION_NAMES:
            raise TypeError(
                f"{method}() got the keyword {name!r}, an option of another submission "
                f"method, not of {method}(); to send a job input named {name!r}, pass it in "
                f"inputs={{{name!r}: ...}}"
            )
    if inputs is None:
        return dict(keywords)
    if not isinstance(inputs, Mapping):
        raise TypeError(
            f"{method}() inputs must be a mapping of input names to values, got a "
            f"{type(inputs).__name__}"
        )
    merged = dict(inputs)
    for name in merged:
        if not isinstance(name, str):
            raise TypeError(f"{method}() inputs must be named by strings, got {name!r}")
    twice = sorted(merged.keys() & keywords.keys())
    if twice:
        raise TypeError(
            f"{method}() got the job input {twice[0]!r} twice: in inputs= and as a keyword"
        )
    merged.update(keywords)
    return merged


def objective_fields(deadline_ms: float | None, priority: int, on_miss: OnMiss) -> dict[str, Any]:
    """The objective's fields of a submission (none for a job that asks for nothing), checked
    here so that a bad one fails before anything is sent (its message then says where a job
    input of that name goes)."""
    if deadline_ms is None and type(priority) is int and priority == 0 and on_miss == "drop":
        return {}  # the defaults: nothing to check or send
    try:
        check_objective(deadline_ms, priority, on_miss)
    except InvalidInputs as exc:
        name = exc.message.split(" ", 1)[0]
        raise InvalidInputs(
            f"{exc.message}; to send a job input named {name!r}, pass it in "
            f"inputs={{{name!r}: ...}}"
        ) from None
    body: dict[str, Any] = {}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    if priority:
        body["priority"] = priority
    if on_miss != "drop":
        body["on_miss"] = on_miss
    return body


def check_job_size(
    inputs: Mapping[str, Any], input_bytes: int, send: Limits, own: Limits, address: str
) -> None:
    """:class:`~compass.errors.JobTooLarge` when a job's ``inputs`` (``input_bytes`` by
    :func:`~compass.payload.payload_bytes`) are more than the one frame they travel in to the
    worker at ``address`` carries (:func:`~compass.config.frame_carries`: the frame less the
    message around them, the rule the worker's ``--max-job-mb`` follows too): ``send`` are
    the limits of that connection (the tighter of this client's, ``own``, and the worker's).
    Checked before anything is sent (by :meth:`Client.submit <compass.Client.submit>` and
    :meth:`Client.stream <compass.Client.stream>`), so that the error names the flag to raise
    (a frame the wire refuses names only ``max_frame_bytes``), and the connection and the
    worker are left as they were. A job within the frame may still be past a ``--max-job-mb``
    given lower (the handshake does not announce it): the worker refuses it, with the same
    error naming that flag.

    Only what certainly does not fit is refused: the bytes of the inputs' arrays, tensors,
    bytes and strings, which travel as they are. ``payload_bytes`` counts a scalar as 16
    bytes, where msgpack may take one, so it is only the first, cheap test."""
    frame_bytes = send.max_frame_bytes
    carried = frame_carries(frame_bytes)
    if input_bytes <= carried:
        return  # payload_bytes is at least the floor below: nothing more to count
    floor = _bytes_at_least(inputs)
    if floor <= carried:
        return
    mib = 1 << 20
    frame = f"{frame_bytes / mib:g} MiB"
    if frame_bytes < own.max_frame_bytes:
        whose = f"the worker's --max-frame-mb is {frame}"
    else:  # this client's limit binds, the worker's perhaps too (it announced no smaller one)
        whose = "the smaller of the worker's --max-frame-mb and this client's "
        whose += f"Limits.max_frame_bytes is {frame}"
    raise JobTooLarge(
        f"the job's inputs take {floor / mib:.1f} MiB, more than the one frame a job travels "
        f"in to {address} carries ({whose}, less {(frame_bytes - carried) / mib:g} MiB for "
        "the message around the inputs); send smaller inputs or split the job, or raise "
        "--max-frame-mb on every worker (their --max-job-mb follows it unless given) and "
        "Limits.max_frame_bytes here",
        detail={"input_bytes": floor, "max_frame_bytes": frame_bytes, "carried": carried},
    )


def _bytes_at_least(value: Any) -> int:
    """Bytes ``value`` takes on the wire at least: its arrays', tensors', bytes' and strings'
    (the bulk of any large job), and nothing for its scalars and containers."""
    if isinstance(value, Mapping):
        return sum(map(_bytes_at_least, value.values()))
    if isinstance(value, (list, tuple)):
        return sum(map(_bytes_at_least, value))
    if value is None or isinstance(value, (bool, int, float, complex)):
        return 0
    return payload_bytes(value)  # exact for arrays, tensors, bytes; a str's characters
