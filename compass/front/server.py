"""The front door's asyncio adapter: aiohttp's low-level server on the worker's event loop.

Why aiohttp's low-level server (``aiohttp.web.Server``), not a framework or h11: its HTTP
parser is llhttp in C (the one Node.js uses), it streams responses (``StreamResponse``, what
server-sent events need) and request bodies, it keeps connections alive, and it adds no
routing or middleware layer per request: the routes here are a few string matches. It runs
on the loop the worker already runs, so a request is a coroutine that calls
:meth:`~compass.worker.server.Worker.submit_job`, the call the native ``submit`` makes: the
job is planned by this worker as its ingress, under the same admission, deadlines,
priorities, traces and metrics.

Bounds: a body past ``max_body_bytes`` (the worker's ``--max-job-mb``) is refused with 413
before it is read; a connection that sends no complete request head within ``idle_s``
(aiohttp's keep-alive timer starts when it connects and is only cleared by a whole request)
is closed, which bounds idle and slow-loris connections; a body must arrive within
``read_s``, else 408 and the connection is closed. A body is read into one buffer by
:func:`compass.front.body.read_body` (a large one's bytes past aiohttp's reader).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

import compass
from compass.errors import CompassError, ConfigError, UnknownWorkflow
from compass.front import jsonio, openai, tensors
from compass.front.body import BodyConnection, read_body
from compass.front.declare import OpenAIModel
from compass.front.errors import RETRY_AFTER_S, HttpError, openai_body, status_of, v2_body
from compass.front.metrics import CLIENT_GONE, NO_ROUTE, HttpMetrics
from compass.objective import Objective
from compass.worker.streaming import stream_job

if TYPE_CHECKING:
    from compass.config import WorkerConfig
    from compass.worker.server import Worker

__all__ = ["FrontDoor", "FrontOptions", "front_options"]

log = logging.getLogger("compass.front")

#: seconds a connection may stay without a whole request head (idle, or a slow client)
IDLE_S = 15.0
#: seconds a request's body may take to arrive
READ_S = 30.0
#: bytes of a request head's line and of one header at most
MAX_LINE = 16 * 1024
#: seconds a connection answered before its body was read (413, 408) still reads what the
#: client sends, so that it sees the answer rather than a reset (aiohttp's default: 10 s)
LINGER_S = 1.0
#: bytes a connection buffers before aiohttp pauses reading it: its default, so that little of
#: a large body goes through aiohttp's copies before the rest is received straight into its
#: buffer (:mod:`compass.front.body`; with 1 MiB, aiohttp had read two of a 3 MB body's
#: megabytes before its handler ran)
READ_BUFFER = 64 * 1024
_JSON = "application/json"
_OCTETS = "application/octet-stream"
#: bytes of a binary answer from which its parts (head, JSON, each tensor's memory) are written
#: one by one, not joined into one bytes first (aiohttp joins a Response's head and body)
STREAM_OUT = 64 * 1024
_HEALTH = ("/v2/health/live", "/v2/health/ready")
#: statuses after which the connection is closed: what is left of the body is not read
_CLOSE = (408, 413)


@dataclass(frozen=True, slots=True)
class FrontOptions:
    """Where and how the front door serves. ``token``: the bearer token every route but the
    health routes needs (None: none); ``private_health``: the health routes need it too."""

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    private_health: bool = False
    max_body_bytes: int = 64 * 1024 * 1024
    idle_s: float = IDLE_S
    read_s: float = READ_S
    #: connections open at most; past it a new one is closed at once
    max_connections: int = 4096
    ssl: ssl.SSLContext | None = None


def front_options(config: WorkerConfig) -> FrontOptions:
    """The front door of the worker ``config`` describes (``config.http_port`` is set)."""
    assert config.http_port is not None
    return FrontOptions(
        host=config.host,
        port=config.http_port,
        token=config.token,
        private_health=config.http_private_health,
        max_body_bytes=config.job_bytes,
        idle_s=config.http_idle_s,
        read_s=2 * config.http_idle_s,  # a body may take twice what a request head may
        max_connections=config.limits.max_connections,
        ssl=config.tls.server_context() if config.tls is not None else None,
    )


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=jsonio.dumps(body), status=status, content_type=_JSON,
                        headers=headers)  # fmt: skip


Handler = Callable[[web.BaseRequest, str], Awaitable[web.StreamResponse]]
#: a route: its template (the metrics' label), the method it takes, what answers it
Route = tuple[str, str, Handler]


class _Connection(BodyConnection):
    """aiohttp's connection, counted against the server's cap, answering what its parser
    refuses (not HTTP, a head too long) in one JSON line, logged at debug level: a stranger's
    junk must not fill the worker's log."""

    counted: _Server | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._manager
        assert isinstance(server, _Server)
        if server.open >= server.max_connections:
            log.debug("front door: %d connections open, closing a new one", server.open)
            self._manager = None  # never started: its connection_lost has nothing to undo
            transport.close()
            return
        server.open += 1
        self.counted = server
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.counted is not None:
            self.counted.open -= 1
            self.counted = None
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        log.debug("front door: refused a request from %s: %s", request.remote, exc or message)
        if isinstance(self._manager, _Server):
            self._manager.metrics.refused(status)
        if request.writer.output_size > 0:
            raise ConnectionError("the response is sent already; the connection is closed")
        lines = [line.strip() for line in str(message or exc or "").splitlines() if line.strip()]
        text = lines[0].rstrip(":") if lines else "malformed request"
        response = _json({"error": f"malformed HTTP request: {text}"}, status)
        response.force_close()
        return response


class _Server(web.Server):
    """aiohttp's server, making :class:`_Connection` s and holding at most ``max_connections``
    open (past it a new one is closed at once, as the wire's server does)."""

    def __init__(
        self, handler: Any, *, max_connections: int, metrics: HttpMetrics, **kwargs: Any
    ) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections
        self.metrics = metrics
        self.open = 0

    def __call__(self) -> RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class FrontDoor:
    """``async with FrontDoor(worker, options) as door:`` serves until closed."""

    def __init__(self, worker: Worker, options: FrontOptions) -> None:
        self.worker = worker
        self.options = options
        self.address = ""
        self.metrics = HttpMetrics()
        self._token = (options.token or "").encode()  # compared with what a request gives
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None
        self._streams = itertools.count(1)  # the ids of streamed answers
        #: path -> route, for the paths that are routes as they are
        self._exact: dict[str, Route] = {
            "/v2/health/live": ("/v2/health/live", "GET", self._live),
            "/v2/health/ready": ("/v2/health/ready", "GET", self._ready),
            "/v2": ("/v2", "GET", self._server_metadata),
            "/v1/models": ("/v1/models", "GET", self._openai_models),
            **{path: (path, "POST", self._openai) for path in openai.ENDPOINT_KIND},
        }
        #: what follows /v2/models/{model}[/versions/{version}] -> route
        self._model: dict[str, Route] = {
            "": ("/v2/models/{model}", "GET", self._model_metadata),
            "ready": ("/v2/models/{model}/ready", "GET", self._model_ready),
            "infer": ("/v2/models/{model}/infer", "POST", self._infer),
        }

    async def __aenter__(self) -> FrontDoor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        opts = self.options
        self._server = _Server(
            self._handle,
            max_connections=opts.max_connections,
            metrics=self.metrics,
            handler_cancellation=True,  # a client gone cancels its job
            access_log=None,
            keepalive_timeout=opts.idle_s,
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            read_bufsize=READ_BUFFER,
            lingering_time=LINGER_S,
        )
        loop = asyncio.get_running_loop()
        try:
            self._listener = await loop.create_server(
                self._server, opts.host, opts.port, ssl=opts.ssl, reuse_address=True
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve HTTP on {opts.host}:{opts.port} (--http-port): {exc.strerror or exc}"
            ) from exc
        host, port = self._listener.sockets[0].getsockname()[:2]
        scheme = "https" if opts.ssl is not None else "http"
        self.address = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
        log.info("front door listening on %s", self.address)

    async def aclose(self) -> None:
        """Stop listening, then close the connections (in-flight requests are cancelled)."""
        if self._listener is not None:
            self._listener.close()
        if self._server is not None:
            await self._server.shutdown(1.0)
            self._server = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None

    # -- the door ------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request, counted in :attr:`metrics` by its route's template."""
        started = time.perf_counter()
        metrics = self.metrics
        metrics.in_flight += 1
        path = request.path
        route, arg = self._route(path)
        status = CLIENT_GONE  # unless an answer is made: the handler was cancelled
        try:
            response = await self._answer(request, route, arg)
            status = response.status
            return response
        finally:
            metrics.in_flight -= 1
            metrics.answered(NO_ROUTE if route is None else route[0], status,
                             time.perf_counter() - started)  # fmt: skip

    async def _answer(
        self, request: web.BaseRequest, route: Route | None, arg: str
    ) -> web.StreamResponse:
        path = request.path
        v1 = path.startswith("/v1/")
        try:
            if self.options.token is not None and (
                self.options.private_health or path not in _HEALTH
            ):
                self._authenticate(request)
            if route is None:
                raise HttpError(404, f"no route {path} (see /v2 and /v1/models)")
            _, allowed, handler = route
            if request.method != allowed:
                raise HttpError(405, f"{request.method} is not allowed here; use {allowed}")
            return await handler(request, arg)
        except CompassError as exc:
            return self._error(exc, v1)
        except Exception as exc:  # a bug here must not take the worker down: log it, 500
            log.exception("front door: %s %s failed", request.method, path)
            return self._error(CompassError(f"internal error: {type(exc).__name__}"), v1)

    def _error(self, exc: CompassError, v1: bool) -> web.Response:
        status, retry = status_of(exc)
        headers = {} if retry is None else {"Retry-After": str(retry)}
        if status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        if exc.job_id is not None:
            headers["X-Compass-Job"] = exc.job_id
        body = openai_body(exc, status) if v1 else v2_body(exc, status)
        response = _json(body, status, headers)
        if status in _CLOSE:
            response.force_close()  # the body was not read (all of it): end the connection
        return response

    def _authenticate(self, request: web.BaseRequest) -> None:
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), self._token
        ):
            raise HttpError(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")

    def _route(self, path: str) -> tuple[Route | None, str]:
        """The route serving ``path`` (None: none) and its argument: the path, or the model's
        name in ``/v2/models/{model}/...``."""
        exact = self._exact.get(path)
        if exact is not None:
            return exact, path
        if path.startswith("/v2/models/"):
            rest = path[len("/v2/models/") :]
            name, _, tail = rest.partition("/")
            if "/versions/" in f"/{tail}":  # /v2/models/{m}/versions/{v}[/...]: one version
                _, _, after = tail.partition("versions/")
                tail = after.partition("/")[2]
            return self._model.get(tail), name
        return None, path

    async def _body(self, request: web.BaseRequest) -> bytes | memoryview:
        limit = self.options.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise HttpError(413, f"the request body is {length} bytes, over the limit of {limit}")
        content = request.content
        if content.is_eof():  # the whole body came with the head (most requests): no timer
            body = content.read_nowait()
            if length is not None and len(body) != length:
                raise HttpError(400, f"the body ended after {len(body)} of its {length} bytes")
            if len(body) > limit:
                raise HttpError(413, f"the request body is over the limit of {limit}")
            return body
        if request.headers.get("Expect", "").lower() == "100-continue":
            # the client (curl past 1 KB) holds the body back until told, else for a second
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the answer itself is still to come
        try:
            async with asyncio.timeout(self.options.read_s):
                if length is not None:
                    return await read_body(request, length)
                chunks: list[bytes] = []
                size = 0
                while True:
                    chunk, chunk_ended = await request.content.readchunk()
                    if not chunk:
                        if chunk_ended:  # an HTTP chunk's end heard after its bytes were read
                            continue
                        break  # the body's end
                    size += len(chunk)
                    if size > limit:
                        raise HttpError(413, f"the request body is over the limit of {limit}")
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError:
            raise HttpError(408, f"the request body took over {self.options.read_s} s") from None

    async def _submit(self, workflow: str, inputs: Any, fields: dict[str, Any],
                      request: web.BaseRequest) -> tuple[str, Any]:  # fmt: skip
        worker = self.worker
        objective = Objective.from_wire(fields, worker.config.time_scale)
        return await worker.submit_job(
            workflow, inputs, None, objective, traceparent=request.headers.get("traceparent")
        )

    # -- the Open Inference Protocol -----------------------------------------------------------
    async def _live(self, request: web.BaseRequest, _: str) -> web.StreamResponse:
        return web.Response(status=200)

    async def _ready(self, request: web.BaseRequest, _: str) -> web.StreamResponse:
        """200 while the worker takes work, as the metrics port's ``/ready``; else 503 with
        why (starting, draining, stopping, degraded, split off)."""
        ready, why = self.worker.metrics.is_ready()
        if ready and not self.worker.draining:
            return web.Response(status=200)
        body = {"error": f"not ready: {why if not ready else 'draining'}"}
        return _json(body, 503, {"Retry-After": str(RETRY_AFTER_S)})

    async def _server_metadata(self, request: web.BaseRequest, _: str) -> web.StreamResponse:
        extensions = ["binary_tensor_data", "openai"]
        return _json({"name": "compass", "version": compass.__version__, "extensions": extensions})

    def _known(self, name: str) -> None:
        self.worker.app.get_workflow(name)  # UnknownWorkflow: 404

    async def _model_metadata(self, request: web.BaseRequest, name: str) -> web.StreamResponse:
        workflow = self.worker.app.get_workflow(name)
        ins, outs = self.worker.app.front.tensors.get(name, ((), ()))
        declared = {t.name: t.to_json() for t in ins}
        inputs = [declared.get(n, {"name": n, "datatype": "BYTES", "shape": [-1]})
                  for n in workflow.inputs]  # fmt: skip
        inputs += [t for n, t in declared.items() if n not in workflow.inputs]
        outputs = [t.to_json() for t in outs] or [
            {"name": "output", "datatype": "BYTES", "shape": [-1]}
        ]
        return _json({"name": name, "versions": ["1"], "platform": "compass",
                      "inputs": inputs, "outputs": outputs})  # fmt: skip

    async def _model_ready(self, request: web.BaseRequest, name: str) -> web.StreamResponse:
        self._known(name)
        return await self._ready(request, name)

    async def _infer(self, request: web.BaseRequest, name: str) -> web.StreamResponse:
        self._known(name)  # 404 before reading a body for nothing
        header = request.headers.get("Inference-Header-Content-Length")
        header_length: int | None = None
        if header is not None:
            if not header.isdigit():
                raise HttpError(400, f"Inference-Header-Content-Length {header!r} is not a size")
            header_length = int(header)
        parsed = tensors.parse_infer(await self._body(request), header_length)
        fields = tensors.objective_fields(parsed.parameters)
        job_id, value = await self._submit(name, parsed.inputs, fields, request)
        _, outs = self.worker.app.front.tensors.get(name, ((), ()))
        default = outs[0].name if len(outs) == 1 else "output"
        doc, blobs = tensors.encode_answer(name, job_id, value, parsed, default)
        headers = {"X-Compass-Job": job_id}
        if not blobs:
            return web.Response(body=doc, content_type=_JSON, headers=headers)
        headers["Inference-Header-Content-Length"] = str(len(doc))
        parts = [doc, *blobs]
        size = sum(map(len, parts))
        if size < STREAM_OUT:
            return web.Response(body=b"".join(parts), content_type=_OCTETS, headers=headers)
        # large: each part written as it is (aiohttp's Response would join head and body)
        response = web.StreamResponse(headers={**headers, "Content-Type": _OCTETS})
        response.content_length = size
        await response.prepare(request)
        for part in parts:
            await response.write(part)
        await response.write_eof()
        return response

    # -- OpenAI --------------------------------------------------------------------------------
    async def _openai_stream(
        self, declared: OpenAIModel, inputs: Any, fields: dict[str, Any], request: web.BaseRequest
    ) -> web.StreamResponse:
        """``stream: true``: server-sent chunks as the job's partial outputs are made; an error
        before the first is the request's status, one on the way an error event. A caller that
        hangs up cancels the job (its handler is cancelled, and with it the stream)."""
        objective = Objective.from_wire(fields, self.worker.config.time_scale)
        outputs = stream_job(self.worker, declared.workflow, inputs, objective)
        first = await outputs.__anext__()  # an error before any output: the status
        name = f"{self.worker.name}-s{next(self._streams)}"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})  # fmt: skip
        await response.prepare(request)
        out = first
        try:
            while True:
                finish = out.value if out.final else None
                chunk = openai.chunk_body(declared, name, None if out.final else out.value, finish)
                await response.write(b"data: %s\n\n" % jsonio.dumps(chunk))
                if out.final:
                    break
                out = await outputs.__anext__()
        except CompassError as exc:
            error = {"error": {"message": exc.message, "type": exc.code, "code": exc.code}}
            await response.write(b"data: %s\n\n" % jsonio.dumps(error))
        finally:
            await outputs.aclose()  # the job, if it runs on
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _openai_models(self, request: web.BaseRequest, _: str) -> web.StreamResponse:
        return _json(openai.models_body(list(self.worker.app.front.openai.values())))

    async def _openai(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        raw = await self._body(request)
        try:
            body = jsonio.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            where = f" at byte {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
            raise HttpError(400, f"malformed JSON{where}: the body must be a JSON object") from None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise HttpError(400, "the body must be a JSON object with a model name")
        declared = self.worker.app.front.openai.get(body["model"])
        if declared is None:
            known = ", ".join(sorted(self.worker.app.front.openai)) or "none"
            raise UnknownWorkflow(f"unknown model {body['model']!r} (known: {known})")
        kind = openai.ENDPOINT_KIND[path]
        if declared.kind != kind:
            raise HttpError(400, f"model {declared.model!r} serves {declared.kind}, not {kind}")
        workflow = self.worker.app.get_workflow(declared.workflow)
        inputs = openai.job_inputs(kind, body, workflow.inputs)
        if body.get("stream") is True:
            return await self._openai_stream(
                declared, inputs, openai.objective_fields(body), request
            )
        job_id, value = await self._submit(
            declared.workflow, inputs, openai.objective_fields(body), request
        )
        answer = openai.answer_body(declared, job_id, value, body)
        return _json(answer, headers={"X-Compass-Job": job_id})
