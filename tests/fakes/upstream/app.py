"""The loopback upstream's ASGI app: the real-time endpoints, control endpoints, and the Files/Batches mixin.

The process and the handle tests hold are in `tests.fakes.upstream.server`; replies in `tests.fakes.upstream.replies`.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.fakes.upstream.batches import FilesAndBatches
from tests.fakes.upstream.replies import (
    _BUILDERS,
    _RETRY_HEADERS,
    ApiError,
    _loads,
    _sse,
    error_body,
    request_text,
)
from tests.fakes.upstream.state import (
    JSON,
    BatchJob,
    Counters,
    Options,
    RawHeaders,
    RawReply,
    Reply,
    StoredFile,
    _json,
    _raw,
)
from tests.fakes.upstream.structured import Structured

OPS = {
    "chat/completions": "chat",
    "completions": "completions",
    "embeddings": "embeddings",
    "responses": "responses",
    "rerank": "rerank",
    "score": "score",
    "moderations": "moderations",
    "images/generations": "images",
    "images/edits": "image_edits",
}
# path -> kind for every real-time endpoint but Azure's deployment form (matched by _DEPLOYMENT_RE)
REALTIME_PATHS = {f"{prefix}/{op}": kind for prefix in ("/v1", "/openai/v1", "") for op, kind in OPS.items()}
REALTIME_PATHS.update({"/openai/responses": "responses", "/v2/rerank": "rerank"})
_DEPLOYMENT_RE = re.compile(r"^/openai/deployments/([^/]+)/(" + "|".join(re.escape(op) for op in OPS) + r")$")

_FAIL_RE = re.compile(r"#fail:(\d{3})(?:x(\d+))?")
_USAGE_RE = re.compile(r"#usage:(\w+)")
# `#usage:NAME`: the reply's `usage` is one a broken or hostile provider might send.
BAD_USAGE: dict[str, object] = {
    "negative": {"prompt_tokens": -1_000_000, "completion_tokens": -5, "total_tokens": -1_000_005},
    "huge": {"prompt_tokens": 10**15, "completion_tokens": 10**15, "total_tokens": 2 * 10**15},
    "float": {"prompt_tokens": 2.5, "completion_tokens": 1e12, "total_tokens": 1e12},
    "string": {"prompt_tokens": "999999", "completion_tokens": "7", "total_tokens": "1000006"},
    "bool": {"prompt_tokens": True, "completion_tokens": True, "total_tokens": 2},
    "nested": {"prompt_tokens": {"n": 5}, "completion_tokens": [5], "total_tokens": 10,
               "prompt_tokens_details": "lots"},
    "list": [1, 2, 3],
}
_SLEEP_RE = re.compile(r"#sleep:(\d+(?:\.\d+)?)")
# `#tier:NAME`: a success reply reports it ran at service tier NAME (OpenAI's top-level `service_tier`)
_TIER_RE = re.compile(r"#tier:(\w+)")
# `#toolong:MODEL` / `#unsafe:MODEL`: a request for that model is refused as OpenAI refuses a prompt over the
# context window / one its safety system rejects (400), so a fallback to another model can answer it.
_REFUSE_RE = re.compile(r"#(toolong|unsafe):([\w.\-]+)")
_REFUSALS = {
    "toolong": ("This model's maximum context length is 16 tokens. However, your messages resulted in 99 tokens.",
                "context_length_exceeded"),
    "unsafe": ("Your request was rejected as a result of our safety system.", "content_policy_violation"),
}
_HANG_RE = re.compile(r"#hang(?:x(\d+))?")
# How long a `#hang` request is held: longer than any test's route timeout, short enough that a server stopped
# with requests still held exits soon (uvicorn waits for open requests up to its graceful timeout anyway).
HANG_SECONDS = 3600.0


class UpstreamServer(FilesAndBatches):
    """The server side: in-memory state and the endpoints (`Upstream` is the handle tests hold)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.counters = Counters()
        self.attempts: Counter[str] = Counter()  # calls per text that carries a #fail directive
        self.structured = Structured()  # replies to requests that name a schema (their #schema directives)
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, BatchJob] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- the one handler

    def execute(self, kind: str, body: JSON, model: str, text: str) -> Reply:
        """Answer one request (real-time or batch line): directives, then the deterministic reply."""
        if "#" in text:
            if "#count" in text:
                self.counters.by_custom[text] += 1
            for refusal, refused_model in _REFUSE_RE.findall(text):
                if refused_model == model:
                    message, code = _REFUSALS[refusal]
                    error = {"message": message, "type": "invalid_request_error", "param": "messages", "code": code}
                    return 400, {"error": error}, None
            match = _FAIL_RE.search(text)
            if match:
                self.attempts[text] += 1
                times = match.group(2)
                if times is None or self.attempts[text] <= int(times):
                    status = int(match.group(1))
                    headers = _RETRY_HEADERS if status == 429 or status >= 500 else None
                    return status, error_body(status, f"Injected failure {status} (#fail directive)."), headers
        try:
            reply = _BUILDERS[kind](body, model, text)
        except ApiError as exc:
            return exc.status, exc.body(), None
        if kind == "chat" and ("response_format" in body or "tools" in body):
            self.structured.chat(body, text, reply)
        elif kind == "responses" and "text" in body:
            self.structured.responses(body, text, reply)
        if "#extra" in text:  # fields a provider may add that OpenAI's types (and LiteLLM's) don't know
            reply["x_provider"] = {"region": "loopback", "cached": False}
            reply["prompt_logprobs"] = None
        tier = _TIER_RE.search(text)
        if tier is not None:
            reply["service_tier"] = tier.group(1)
        usage = _USAGE_RE.search(text)
        if usage is not None and usage.group(1) in BAD_USAGE:
            reply["usage"] = BAD_USAGE[usage.group(1)]
        return 200, reply, None

    # ----------------------------------------------------------------- real-time

    def key_ok(self, headers: RawHeaders) -> bool:
        """True if no key is required or the request carries it (`Authorization: Bearer K` or `api-key: K`)."""
        key = self.options.api_key
        if key is None:
            return True
        wanted = {(b"api-key", key.encode()), (b"authorization", b"Bearer " + key.encode())}
        return any((name, value) in wanted for name, value in headers)

    def authorized(self, request: Request) -> bool:
        return self.key_ok(request.scope["headers"])

    async def realtime(self, scope: Scope, receive: Receive, send: Send, kind: str, deployment: str | None) -> None:
        """Serve one real-time request straight on ASGI (the hot path: no Request or Response objects)."""
        counters = self.counters
        counters.requests += 1
        counters.by_path[scope["path"]] += 1
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        status, data, headers = await self.answer(kind, deployment, scope["headers"], b"".join(chunks))
        counters.by_status[str(status)] += 1
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def answer(self, kind: str, deployment: str | None, headers: RawHeaders, raw: bytes) -> RawReply:
        """Status, body bytes and headers for one real-time request."""
        if not self.key_ok(headers):
            return _raw(401, error_body(401))
        self.counters.traceparents += [v.decode() for k, v in headers if k == b"traceparent"]
        self.counters.trace_headers += [f"{k.decode()}: {v.decode()}" for k, v in headers
                                        if k.lower() in (b"tracestate", b"baggage")]
        try:
            body = _loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _raw(400, error_body(400, "We could not parse the JSON body of your request."))
        model = deployment or body.get("model")
        if not isinstance(model, str) or not model:
            exc = ApiError(400, "You must provide a model parameter.", param="model", code="missing_required_parameter")
            return _raw(400, exc.body())
        self.counters.by_model[model] += 1
        try:
            text = request_text(kind, body)
        except ApiError as exc:
            return _raw(exc.status, exc.body())
        if "#hang" in text and (hang := _HANG_RE.search(text)):
            self.attempts[text] += 1  # `#hangxN`: the first N calls with this exact text hang, then it answers
            if hang.group(1) is None or self.attempts[text] <= int(hang.group(1)):
                if "#count" in text:  # counted here: a hung call never reaches `execute`, which counts the others
                    self.counters.by_custom[text] += 1
                await asyncio.sleep(HANG_SECONDS)  # the connection stays open; no byte of a reply is sent
        delay = self.options.latency_ms
        if "#sleep:" in text and (match := _SLEEP_RE.search(text)):
            delay += float(match.group(1))
        if delay:
            await asyncio.sleep(delay / 1000)
        status, reply, extra = self.execute(kind, body, model, text)
        if status == 200 and body.get("stream") is True and kind in ("chat", "completions"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return _raw(200, _sse(kind, reply, include_usage), content_type=b"text/event-stream")
        return _raw(status, reply, extra)

    # ----------------------------------------------------------------- control

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def stats(self, request: Request) -> Response:
        return _json(self.counters.to_json())

    async def reset(self, request: Request) -> Response:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()
        self.counters = Counters()
        self.attempts.clear()
        self.structured = Structured()
        self.files.clear()
        self.batches.clear()
        return _json({"status": "reset"})

    async def models(self, request: Request) -> Response:
        if not self.authorized(request):
            return _json(error_body(401), 401)
        models = self.counters.by_model
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "batchyard-tests"} for m in models]
        return _json({"object": "list", "data": data})

    # ----------------------------------------------------------------- app

    def routes(self) -> list[Route]:
        routes = [
            Route("/_health", self.health, methods=["GET"]),
            Route("/_stats", self.stats, methods=["GET"]),
            Route("/_reset", self.reset, methods=["POST"]),
        ]
        # the real-time endpoints are served by RealtimeFastPath, in front of the router
        routes += self.file_routes()
        routes.append(Route("/v1/models", self.models, methods=["GET"]))
        return routes


class RealtimeFastPath:
    """ASGI middleware: real-time POSTs go straight to the server's hot path; the rest to Starlette's router."""

    def __init__(self, app: ASGIApp, server: UpstreamServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            kind = REALTIME_PATHS.get(path)
            deployment = None
            if kind is None and path.startswith("/openai/deployments/") and (match := _DEPLOYMENT_RE.match(path)):
                deployment, kind = match.group(1), OPS[match.group(2)]
            if kind is not None:
                await self.server.realtime(scope, receive, send, kind, deployment)
                return
        await self.app(scope, receive, send)


def build_app(options: Options | None = None) -> Starlette:
    """The ASGI app (one in-memory state per app)."""
    server = UpstreamServer(options or Options())
    app = Starlette(routes=server.routes(), middleware=[Middleware(RealtimeFastPath, server=server)])
    app.state.upstream = server
    return app


