"""A web front end over a compass cluster: FastAPI under uvicorn, one Client for the app's life.

An example to copy, not part of the package: ``examples/`` ships in the repository, not in the
wheel, so run it from a clone (``pip install -e '.[examples]'``). A pip-installed compass
serves HTTP itself: the worker's front door (``--http-port``, :mod:`compass.front`).

Run (workers started with ``compass worker start --app examples.vision_app``)::

    COMPASS_WORKERS=127.0.0.1:7341,127.0.0.1:7342 COMPASS_TOKEN=... \\
        uvicorn examples.webapp:app --loop uvloop --port 8000
    curl -X POST localhost:8000/jobs/echo -H 'content-type: application/json' -d '{"x": [1, 2]}'

Environment: ``COMPASS_WORKERS`` (comma-separated worker addresses; the client fails over
between them), ``COMPASS_TOKEN`` (the cluster token), ``COMPASS_TIMEOUT`` (seconds a job may
take unless the request says ``?timeout=``; default 30).

``POST /jobs/{workflow}`` takes the job's inputs as one JSON object and answers
``{"workflow": ..., "result": ...}`` (arrays and tensors in the result become nested lists).
compass errors become HTTP statuses with a JSON body ``{"error": code, "message": ...}``:

=========================================  ====================================================
UnknownWorkflow                            404
InvalidInputs (and a body that is no JSON  422
object)
JobTooLarge (inputs over the worker's        413
``--max-job-mb``)
Overloaded, WorkerUnavailable, connection  503, with ``Retry-After``
errors
CompassTimeout                             504
JobFailed                                  500, naming the ``task`` that raised
anything else compass raises               502
=========================================  ====================================================

A caller that hangs up before its answer is ready gets its job cancelled: the request races the
job against the ASGI ``http.disconnect`` message, and cancelling the submission tells the ingress
worker to drop the job.

``POST /streams/{workflow}`` runs the job streaming and answers server-sent events as they are
made: ``event: output`` for each partial output of its step-wise sinks (``{"task", "seq",
"value"}``), then ``event: result`` (``{"workflow", "result"}``), or ``event: error`` when it
fails on the way (an error before its first output is the status above). A browser's
``EventSource`` or ``curl -N`` reads it; a caller that hangs up cancels the job, whose step-wise
tasks stop at their next step::

    curl -N -X POST localhost:8000/streams/tell -H 'content-type: application/json' -d '{"n": 5}'
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from compass import Client, Timeouts
from compass.errors import (
    CompassConnectionError,
    CompassError,
    CompassTimeout,
    ConfigError,
    InvalidInputs,
    JobFailed,
    JobTooLarge,
    UnknownWorkflow,
    WorkerUnavailable,
)

log = logging.getLogger("examples.webapp")

#: seconds a refused caller is told to wait before trying again
RETRY_AFTER_S = 1
#: nginx's status for "the client closed the request"; nobody is left to read it
CLIENT_CLOSED = 499


@dataclass(frozen=True, slots=True)
class Settings:
    workers: tuple[str, ...]
    token: str | None
    timeout: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        workers = tuple(a.strip() for a in env.get("COMPASS_WORKERS", "").split(",") if a.strip())
        if not workers:
            raise ConfigError(
                "set COMPASS_WORKERS to the workers' addresses, e.g. 127.0.0.1:7341,127.0.0.1:7342"
            )
        text = env.get("COMPASS_TIMEOUT", "30")
        try:
            timeout = float(text)
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise ConfigError(f"COMPASS_TIMEOUT must be a number of seconds > 0, got {text!r}")
        return cls(workers, env.get("COMPASS_TOKEN") or None, timeout)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = Settings.from_env(os.environ)
    client = Client(
        settings.workers,
        token=settings.token,
        name="webapp",
        timeouts=Timeouts(request=settings.timeout),
    )
    async with client:  # connects now: a wrong address or token stops the app at startup
        app.state.client = client
        yield


app = FastAPI(title="compass web front end", lifespan=lifespan)


def _client(request: Request) -> Client:
    client = request.app.state.client
    assert isinstance(client, Client)
    return client


@app.get("/healthz", response_model=None)
async def healthz(request: Request) -> dict[str, Any] | Response:
    """The worker the app talks to and the round trip to it."""
    client = _client(request)
    try:
        rtt = await client.ping(timeout=5.0)
    except CompassError as exc:
        return _error_response(exc)
    return {"worker": client.address, "rtt_ms": round(rtt * 1000, 3)}


@app.post("/jobs/{workflow}", response_model=None)
async def submit_job(
    workflow: str,
    request: Request,
    inputs: Annotated[dict[str, Any], Body(description="The job's inputs by name.")],
    timeout: Annotated[float | None, Query(gt=0, le=3600, description="Seconds.")] = None,
) -> dict[str, Any] | Response:
    """Run one job of ``workflow`` and answer its result."""
    client = _client(request)
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    # inputs= carries any name, "timeout" too: it cannot be taken for the option
    job = asyncio.ensure_future(client.submit(workflow, inputs, **kwargs))
    hangup = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({job, hangup}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        hangup.cancel()
        if not job.done():
            job.cancel()  # the caller left (or this handler was cancelled): drop the job
    if not job.done():
        await asyncio.wait({job})  # its cancellation has reached the worker
        log.info("job of %r cancelled: the caller hung up", workflow)
        return Response(status_code=CLIENT_CLOSED)
    try:
        result = job.result()
    except CompassError as exc:
        return _error_response(exc)
    return {"workflow": workflow, "result": _jsonable(result)}


@app.post("/streams/{workflow}", response_model=None)
async def stream_job(
    workflow: str,
    request: Request,
    inputs: Annotated[dict[str, Any], Body(description="The job's inputs by name.")],
) -> Response:
    """Run one job of ``workflow`` streaming: server-sent events (see the module docstring)."""
    items = _client(request).stream(workflow, inputs)
    try:
        first = await items.__anext__()  # an error before any output is a status
    except CompassError as exc:
        return _error_response(exc)

    async def events() -> AsyncIterator[str]:
        out = first
        try:
            while True:
                if out.final:
                    yield _event("result", {"workflow": workflow, "result": _jsonable(out.value)})
                    return
                yield _event(
                    "output", {"task": out.task, "seq": out.seq, "value": _jsonable(out.value)}
                )
                out = await items.__anext__()
        except CompassError as exc:
            yield _event("error", {"error": exc.code, "message": exc.message})
        finally:
            await items.aclose()  # type: ignore[attr-defined]  # a caller gone: the job too

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


async def _disconnected(request: Request) -> None:
    """Return when the caller hangs up. The body is already read, so the next ASGI message is
    ``http.disconnect``; waiting for it costs nothing while the job runs."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error_response(exc: CompassError) -> JSONResponse:
    body: dict[str, Any] = {"error": exc.code, "message": exc.message}
    headers: dict[str, str] = {}
    if isinstance(exc, UnknownWorkflow):
        status = 404
    elif isinstance(exc, InvalidInputs):
        status = 422
    elif isinstance(exc, JobTooLarge):
        status = 413  # retrying cannot help: smaller inputs, or a larger --max-job-mb
    elif isinstance(exc, WorkerUnavailable | CompassConnectionError):
        status = 503
        headers["Retry-After"] = str(RETRY_AFTER_S)
    elif isinstance(exc, CompassTimeout):
        status = 504
    elif isinstance(exc, JobFailed):
        status = 500
        body["workflow"], body["task"] = exc.workflow, exc.task
        log.warning("job failed in task %r:\n%s", exc.task, exc.remote_traceback)
    else:
        status = 502
    return JSONResponse(body, status_code=status, headers=headers)


def _jsonable(value: Any) -> Any:
    """A result as JSON: arrays and tensors become nested lists, bytes a latin-1 string."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("latin-1")
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        return tolist()
    return value
