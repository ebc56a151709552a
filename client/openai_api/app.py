"""The OpenAI-compatible HTTP API as an ASGI app (Starlette): ``/v1/models``,
``/v1/chat/completions`` and ``/v1/completions``, streamed as server-sent events or not; ``/health``,
``/version`` and ``/metrics`` beside them (docs/openai.md).

Every ``/v1`` request and ``/metrics`` needs ``Authorization: Bearer <oven token>``: the token is
the API key, so each key is one client of the oven server. A completion runs as one
chat-completion instance in that client's name (:mod:`.session`); its status, before the first
byte, is the run's: a refused key 401, a request past the server's limits 400 (:mod:`.limits`), a
quota 429, an inferlet that fails 500. A failure after the stream has begun arrives as a last
``data: {"error": ...}`` event, which OpenAI's clients raise. ``/health`` and ``/version`` take no
key (load balancers' probes carry none); ``/health`` asks the control server with the operator's
token, which the front end keeps in memory for that alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from importlib.metadata import PackageNotFoundError, version

import h11
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from oven.client.rpc import OvenClient
from oven.proto.auth import AuthError, Token
from oven.proto.control import UPLOAD_CHUNK_BYTES

from .errors import INVALID_REQUEST, SERVER, ApiError, bad_key, bad_request, not_answering, refused_key
from .limits import Limits
from .metrics import FrontEndMetrics, MetricsMiddleware
from .reply import Reply, failure
from .requests import parse_body, parse_job
from .session import InferletFailed, Session


class Api:
    """The routes' shared state: where the oven server is and what it serves."""

    def __init__(self, endpoint: str, program: str, models: list[str], limits: Limits, operator_token: str,
                 metrics: FrontEndMetrics):
        self.endpoint, self.program, self.models, self.limits = endpoint, program, models, limits
        self.operator_token, self.metrics = operator_token, metrics
        self.created = int(time.time())

    # -- routes ---------------------------------------------------------------------------------

    async def list_models(self, request: Request) -> JSONResponse:
        token = api_key(request)
        await asyncio.to_thread(self._check_key, token)
        return JSONResponse({"object": "list", "data": [self._model(name) for name in self.models]})

    async def get_model(self, request: Request) -> JSONResponse:
        token = api_key(request)
        await asyncio.to_thread(self._check_key, token)
        name = request.path_params["model"]
        if name not in self.models:
            raise self._unknown_model(name)
        return JSONResponse(self._model(name))

    async def health(self, _request: Request) -> JSONResponse:
        """200 while an inference process serves the model; 503 while none does (loading, or started again
        after it died) or the control server does not answer."""
        try:
            stats = await asyncio.to_thread(self._stats)
        except Exception as exc:  # noqa: BLE001 - any failure to ask is "not serving", said in one line
            return JSONResponse({"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}"}, 503)
        replicas, serving = len(stats.replicas), sum(r.serving for r in stats.replicas)
        body = {"replicas": replicas, "replicas_serving": serving}
        if replicas and not serving:
            return JSONResponse({"status": "loading", **body}, 503)
        return JSONResponse({"status": "ok", **body})

    async def version(self, _request: Request) -> JSONResponse:
        try:
            oven = version("oven")
        except PackageNotFoundError:  # run from a source tree that was never installed
            oven = "unknown"
        return JSONResponse({"version": oven, "models": self.models})

    async def prometheus(self, request: Request) -> Response:
        """The front end's series, then the control process's (read with the request's key)."""
        token = api_key(request)
        control = await asyncio.to_thread(self._control_metrics, token)
        return Response(self.metrics.render() + control.encode(), media_type=CONTENT_TYPE_LATEST)

    async def chat_completions(self, request: Request):
        return await self._complete(request, chat=True)

    async def completions(self, request: Request):
        return await self._complete(request, chat=False)

    # -- completions ----------------------------------------------------------------------------

    async def _complete(self, request: Request, chat: bool):
        token = api_key(request)
        job = parse_job(parse_body(await read_body(request)), chat)
        self.limits.check_max_tokens(job.max_tokens)
        if job.model not in self.models:
            raise self._unknown_model(job.model)
        session = Session(self.endpoint, token, self.program, [job.inferlet_request(self.limits.inferlet_fields())])
        messages = aiter(session)
        try:
            first = await anext(messages)  # the prompts' sizes: the key, the quota and the launch passed
        except InferletFailed as exc:
            raise failure(exc) from None
        except StopAsyncIteration:
            raise ApiError(500, "the chat-completion inferlet ended without an answer", SERVER) from None
        if "error" in first:  # a request the inferlet cannot serve (a grammar that does not compile, ...)
            session.close()
            raise bad_request(first["error"]["message"], first["error"]["param"])
        try:  # nothing is forwarded yet; past max_context the inferlet has stopped by itself
            self.limits.check(first["prompts"], job.max_tokens, job.n, chat)
        except ApiError:
            session.close()
            raise
        reply = Reply(job, "chatcmpl-" if chat else "cmpl-", first["prompt_tokens"])
        if job.stream:
            return StreamingResponse(reply.events(messages), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            async for message in messages:
                reply.add(message)
        except InferletFailed as exc:
            raise failure(exc) from None
        return JSONResponse(reply.whole())

    # -- helpers --------------------------------------------------------------------------------

    def _check_key(self, token: Token) -> None:
        """Raise 401 unless the oven server admits ``token`` (one round trip on a connection of its own)."""
        with OvenClient(self.endpoint, timeout_s=10, token=token) as client:
            try:
                client.info()
            except AuthError:
                raise refused_key() from None
            except TimeoutError:
                raise not_answering() from None

    def _stats(self):
        with OvenClient(self.endpoint, timeout_s=HEALTH_TIMEOUT_S, token=self.operator_token or None) as client:
            return client.stats()

    def _control_metrics(self, token: Token) -> str:
        with OvenClient(self.endpoint, timeout_s=10, token=token) as client:
            try:
                return client.metrics()
            except AuthError:
                raise refused_key() from None
            except TimeoutError:
                raise not_answering() from None

    def _model(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "oven"}

    def _unknown_model(self, name: str) -> ApiError:
        return ApiError(404, f"The model `{name}` does not exist or you do not have access to it "
                             f"(this server serves {', '.join(self.models)}).", INVALID_REQUEST, "model",
                        "model_not_found")


HEALTH_TIMEOUT_S = 5.0

# A request's inferlet argument travels in one control message, which holds no more: anyone who
# reaches the port, with a well-formed key or not, costs the front end this much memory at most.
MAX_BODY_BYTES = UPLOAD_CHUNK_BYTES


# Slowloris: uvicorn counts a connection against its limit (503 past it, frontend.MAX_CONNECTIONS) from its
# accept, and gives none a deadline for its request; 256 connections that never finish one locked everyone
# out. So a connection has REQUEST_TIMEOUT_S for each whole request (headers and body, from its accept or its
# previous response), and one address keeps MAX_WAITING_PER_PEER connections waiting for a request at most:
# one more closes its oldest. Every local user is 127.0.0.1, so a cap that refused the newest would let one
# user lock out the others; closing the oldest lets through a new connection, which sends its request at once.
REQUEST_TIMEOUT_S = 5.0
MAX_WAITING_PER_PEER = 32


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol (``uvicorn.Config(http=...)``) with the deadline and the cap above."""

    _waiting: defaultdict[str, dict["DeadlineH11Protocol", asyncio.TimerHandle]] = defaultdict(dict)  # oldest first

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._peer = self.client[0] if self.client else ""
        self._wait_for_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._unless_waiting()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may go on to a pipelined request
        if not self.transport.is_closing():
            self._wait_for_request()
            self._unless_waiting()

    def connection_lost(self, exc) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _wait_for_request(self) -> None:
        waiting = self._waiting[self._peer]
        if self not in waiting:
            waiting[self] = self.loop.call_later(REQUEST_TIMEOUT_S, self._drop)
        if len(waiting) > MAX_WAITING_PER_PEER:
            next(iter(waiting))._drop()

    def _unless_waiting(self) -> None:
        if self.conn.their_state is h11.DONE and self.conn.our_state is not h11.DONE:  # a whole request, unanswered
            self._stop_waiting()

    def _stop_waiting(self) -> None:
        waiting = self._waiting.get(self._peer, {})
        if (timer := waiting.pop(self, None)) is not None:
            timer.cancel()
        if not waiting:
            self._waiting.pop(self._peer, None)

    def _drop(self) -> None:
        self._stop_waiting()
        self.transport.close()


async def read_body(request: Request) -> bytes:
    """The request's body; 413 past MAX_BODY_BYTES, as declared or as read (a chunked body declares none)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _too_large()
    return bytes(body)


def _too_large() -> ApiError:
    return ApiError(413, f"The request body is larger than this server takes ({MAX_BODY_BYTES >> 20} MiB).")


def api_key(request: Request) -> Token:
    """The request's oven token, from ``Authorization: Bearer``; 401 if missing or malformed."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "You didn't provide an API key. You need to provide your API key in an Authorization "
                            "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY); an API key of this "
                            "server is an oven token (`oven token add NAME`).", INVALID_REQUEST)
    try:
        return Token.parse(key)  # never find_token: a key is not a file to read
    except AuthError as exc:
        raise bad_key(f"Incorrect API key provided: {exc}") from None


async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}"
    else:
        message = str(exc.detail)
    return ApiError(exc.status_code, message).response()


async def _server_error(_request: Request, exc: Exception) -> JSONResponse:
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", SERVER).response()


def create_app(endpoint: str, program: str, models: list[str], limits: Limits, operator_token: str = ""):
    """The ASGI app for the oven server at ``endpoint``, running ``program`` (chat-completion's digest)
    within ``limits``; ``operator_token`` answers ``/health``."""
    paths = {"/v1/models": "list_models", "/v1/models/{model}": "get_model",
             "/v1/chat/completions": "chat_completions", "/v1/completions": "completions",
             "/health": "health", "/version": "version", "/metrics": "prometheus"}
    metrics = FrontEndMetrics(list(paths))
    api = Api(endpoint, program, models, limits, operator_token, metrics)
    routes = [Route(path.replace("{model}", "{model:path}"), getattr(api, name),
                    methods=["POST"] if "completions" in path else ["GET"]) for path, name in paths.items()]
    app = Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                                       Exception: _server_error})
    return MetricsMiddleware(app, metrics)
