"""The test suite's stand-in for OpenAI and Azure OpenAI: a real HTTP server on loopback.

Tests and benchmarks never mock HTTP. They start this server as a subprocess
(`start_upstream()`, or `python -m tests.upstream --port P`) and point LiteLLM,
the `openai` SDK or the gateway at it, exactly as they would at api.openai.com
or an Azure resource. It answers deterministically and cheaply (plain Starlette,
no pydantic), so thousands of requests a second fit on two cores.

Real-time endpoints, each under `/v1/…` (OpenAI, Bearer auth), `/openai/v1/…`
(Azure v1), `/openai/deployments/{deployment}/…?api-version=…` (Azure, header
`api-key`; the reply's model is the deployment) and the bare root (`/…`, for a
hosted vLLM whose api_base lacks `/v1`):

- `chat/completions`  "echo: <last user message>" (also `stream: true`, as SSE)
- `completions`       "echo: <prompt>", one choice per prompt
- `embeddings`        an 8-dim unit vector per input from a hash of its text
                      (`dimensions` honoured; `encoding_format: base64` too)
- `responses`         a minimal Responses API object (also `/openai/responses`)
- `rerank`, `score`   vLLM/Cohere shapes; relevance is word-set overlap
                      (rerank also at `/v2/rerank`)
- `moderations`       one result per input; flagged (category "violence") when
                      the text contains the word "attack"
- `images/generations` `n` images as `b64_json` (or `url`) from a hash of the prompt;
                      `usage` counts the prompt's words as input tokens

Token counts are whitespace word counts. `--api-key K` makes every request
without that key (Bearer or `api-key`) a 401; by default any key passes.

Directives in the request text (last user message, prompt, input, query):

- `#fail:CODE` answer CODE always (OpenAI error shape; 429 and 5xx carry
  `retry-after: 0` and `retry-after-ms: 10` so clients retry at once)
- `#fail:CODExN` answer CODE to the first N calls with this exact text, then succeed
- `#sleep:MS`  wait MS milliseconds before answering (real-time only)
- `#count`     count calls per exact text in `stats()["by_custom"]`

Files and Batches API under `/v1`, `/openai` (`?api-version=`) and `/openai/v1`.
A batch goes validating → in_progress → finalizing → completed within
`--batch-delay` seconds; its lines are answered by the same handler as the
real-time endpoints (directives apply per line, sleeps excepted; non-2xx lines
go to the error file). Input lines containing `#batch:fail` make the batch
`failed`, `#batch:expire` make it `expired`. Cancel: cancelling → cancelled.

Control endpoints (no auth): `GET /_health`, `GET /_stats`, `POST /_reset`.
Stats shape: {"requests", "by_path", "by_model", "by_status", "by_custom",
"batch_lines", "files_created", "batches_created"}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.upstream_replies import (
    _BUILDERS,
    _RETRY_HEADERS,
    EMBEDDING_DIM,
    ApiError,
    _dumps,
    _id,
    _invalid,
    _loads,
    _missing,
    _now,
    _sse,
    embedding_vector,
    error_body,
    relevance,
    request_text,
)

__all__ = ["EMBEDDING_DIM", "ApiError", "Upstream", "embedding_vector", "error_body", "relevance", "request_text",
           "start_upstream"]


JSON = dict[str, Any]
Reply = tuple[int, JSON, dict[str, str] | None]
Endpoint = Callable[[Request], Awaitable[Response]]
RawHeaders = Iterable[tuple[bytes, bytes]]
RawReply = tuple[int, bytes, list[tuple[bytes, bytes]]]

REPO_ROOT = Path(__file__).resolve().parent.parent
OPS = {
    "chat/completions": "chat",
    "completions": "completions",
    "embeddings": "embeddings",
    "responses": "responses",
    "rerank": "rerank",
    "score": "score",
    "moderations": "moderations",
    "images/generations": "images",
}
# path -> kind for every real-time endpoint but Azure's deployment form (matched by _DEPLOYMENT_RE)
REALTIME_PATHS = {f"{prefix}/{op}": kind for prefix in ("/v1", "/openai/v1", "") for op, kind in OPS.items()}
REALTIME_PATHS.update({"/openai/responses": "responses", "/v2/rerank": "rerank"})
_DEPLOYMENT_RE = re.compile(r"^/openai/deployments/([^/]+)/(" + "|".join(re.escape(op) for op in OPS) + r")$")
# batch endpoint (without a /v1 prefix) -> kind
BATCH_ENDPOINTS = {
    "/chat/completions": "chat",
    "/completions": "completions",
    "/embeddings": "embeddings",
    "/responses": "responses",
}
FILE_PURPOSES = {"batch", "batch_output", "fine-tune", "assistants", "vision", "user_data", "evals"}

_FAIL_RE = re.compile(r"#fail:(\d{3})(?:x(\d+))?")
_SLEEP_RE = re.compile(r"#sleep:(\d+(?:\.\d+)?)")

def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_dumps(payload), status_code=status, headers=headers, media_type="application/json")


def _raw(
    status: int, payload: JSON | bytes, extra: dict[str, str] | None = None, content_type: bytes = b"application/json"
) -> RawReply:
    data = payload if isinstance(payload, bytes) else _dumps(payload)
    headers = [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]
    if extra:
        headers += [(name.encode(), value.encode()) for name, value in extra.items()]
    return status, data, headers


def _error(exc: ApiError) -> Response:
    return _json(exc.body(), exc.status)



# --------------------------------------------------------------------------- server state


@dataclass(slots=True)
class Options:
    latency_ms: float = 0.0
    batch_delay: float = 0.5
    api_key: str | None = None


@dataclass(slots=True)
class StoredFile:
    obj: JSON
    content: bytes


@dataclass(slots=True)
class BatchLine:
    custom_id: str
    kind: str
    body: JSON
    model: str


@dataclass(slots=True)
class BatchJob:
    obj: JSON
    lines: list[BatchLine]
    poison: str | None  # "fail" or "expire" from a #batch: directive


@dataclass
class Counters:
    requests: int = 0
    batch_lines: int = 0
    files_created: int = 0
    batches_created: int = 0
    by_path: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_custom: Counter[str] = field(default_factory=Counter)

    def to_json(self) -> JSON:
        return {
            "requests": self.requests,
            "by_path": dict(self.by_path),
            "by_model": dict(self.by_model),
            "by_status": dict(self.by_status),
            "by_custom": dict(self.by_custom),
            "batch_lines": self.batch_lines,
            "files_created": self.files_created,
            "batches_created": self.batches_created,
        }


class UpstreamServer:
    """The server side: in-memory state and the endpoints (`Upstream` is the handle tests hold)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.counters = Counters()
        self.attempts: Counter[str] = Counter()  # calls per text that carries a #fail directive
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, BatchJob] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- the one handler

    def execute(self, kind: str, body: JSON, model: str, text: str) -> Reply:
        """Answer one request (real-time or batch line): directives, then the deterministic reply."""
        if "#" in text:
            if "#count" in text:
                self.counters.by_custom[text] += 1
            match = _FAIL_RE.search(text)
            if match:
                self.attempts[text] += 1
                times = match.group(2)
                if times is None or self.attempts[text] <= int(times):
                    status = int(match.group(1))
                    headers = _RETRY_HEADERS if status == 429 or status >= 500 else None
                    return status, error_body(status, f"Injected failure {status} (#fail directive)."), headers
        try:
            return 200, _BUILDERS[kind](body, model, text), None
        except ApiError as exc:
            return exc.status, exc.body(), None

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
        self.files.clear()
        self.batches.clear()
        return _json({"status": "reset"})

    async def models(self, request: Request) -> Response:
        if not self.authorized(request):
            return _json(error_body(401), 401)
        models = self.counters.by_model
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "batchyard-tests"} for m in models]
        return _json({"object": "list", "data": data})

    # ----------------------------------------------------------------- files

    def guarded(self, handler: Callable[[Request], Awaitable[Response]]) -> Endpoint:
        """Auth check and ApiError → OpenAI error reply, for the Files and Batches endpoints."""

        async def endpoint(request: Request) -> Response:
            if not self.authorized(request):
                return _json(error_body(401), 401)
            try:
                return await handler(request)
            except ApiError as exc:
                return _error(exc)

        return endpoint

    def _file(self, file_id: str) -> StoredFile:
        stored = self.files.get(file_id)
        if stored is None:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return stored

    def add_file(self, content: bytes, filename: str, purpose: str, expires_at: int | None = None) -> JSON:
        file_id = _id("file-")
        obj = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": _now(),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": expires_at,
            "status_details": None,
        }
        self.files[file_id] = StoredFile(obj, content)
        self.counters.files_created += 1
        return obj

    async def upload_file(self, request: Request) -> Response:
        async with request.form() as form:
            upload = form.get("file")
            purpose = form.get("purpose")
            seconds = form.get("expires_after[seconds]")
            if not isinstance(upload, UploadFile):
                raise _missing("file")
            if not isinstance(purpose, str) or purpose not in FILE_PURPOSES:
                raise _invalid("purpose", f"Invalid value for 'purpose': {purpose!r}.")
            content = await upload.read()
            filename = upload.filename or "upload.jsonl"
        expires_at = _now() + int(seconds) if isinstance(seconds, str) and seconds.isdigit() else None
        return _json(self.add_file(content, filename, purpose, expires_at))

    async def list_files(self, request: Request) -> Response:
        params = request.query_params
        items = [f.obj for f in self.files.values()]
        if purpose := params.get("purpose"):
            items = [f for f in items if f["purpose"] == purpose]
        if params.get("order", "desc") == "desc":
            items.reverse()
        return _json(_page(items, params.get("after"), _limit(params.get("limit"), 10000)))

    async def get_file(self, request: Request) -> Response:
        return _json(self._file(request.path_params["file_id"]).obj)

    async def delete_file(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        self._file(file_id)
        del self.files[file_id]
        return _json({"id": file_id, "object": "file", "deleted": True})

    async def file_content(self, request: Request) -> Response:
        stored = self._file(request.path_params["file_id"])
        return Response(stored.content, media_type="application/octet-stream")

    # ----------------------------------------------------------------- batches

    def _batch(self, batch_id: str) -> BatchJob:
        job = self.batches.get(batch_id)
        if job is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return job

    async def create_batch(self, request: Request) -> Response:
        try:
            body = _loads(await request.body())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiError(400, "We could not parse the JSON body of your request.")
        strict = request.url.path.startswith("/v1/")  # OpenAI proper: only the /v1/… endpoint forms
        endpoint, kind = _batch_endpoint(body.get("endpoint"), strict)
        if body.get("completion_window") != "24h":
            raise _invalid("completion_window", "Invalid value for 'completion_window': only '24h' is supported.")
        metadata = body.get("metadata")
        if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > 16):
            raise _invalid("metadata", "'metadata' must be an object with at most 16 pairs.")
        input_file_id = body.get("input_file_id")
        if not isinstance(input_file_id, str):
            raise _missing("input_file_id")
        stored = self.files.get(input_file_id)
        if stored is None:
            raise ApiError(404, f"No such File object: {input_file_id}", param="input_file_id")
        if stored.obj["purpose"] != "batch":
            raise _invalid("input_file_id", "The input file's purpose must be 'batch'.")
        lines = _parse_batch_lines(stored.content, endpoint, kind)
        poison = _poison(stored.content)
        job = BatchJob(_new_batch(body, endpoint, lines[0].model), lines, poison)
        self.batches[job.obj["id"]] = job
        self.counters.batches_created += 1
        self._spawn(self._run_batch(job))
        return _json(job.obj)

    async def list_batches(self, request: Request) -> Response:
        items = [job.obj for job in reversed(self.batches.values())]
        params = request.query_params
        return _json(_page(items, params.get("after"), _limit(params.get("limit"), 20, 100)))

    async def get_batch(self, request: Request) -> Response:
        return _json(self._batch(request.path_params["batch_id"]).obj)

    async def cancel_batch(self, request: Request) -> Response:
        job = self._batch(request.path_params["batch_id"])
        obj = job.obj
        if obj["status"] in ("completed", "failed", "expired"):
            raise ApiError(409, f"Cannot cancel a batch with status '{obj['status']}'.", code="conflict")
        if obj["status"] not in ("cancelling", "cancelled"):
            obj["status"] = "cancelling"
            obj["cancelling_at"] = _now()
            self._spawn(self._finish_cancel(job))
        return _json(obj)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_batch(self, job: BatchJob) -> None:
        obj = job.obj
        delay = self.options.batch_delay
        await asyncio.sleep(min(0.05, delay / 4))
        if obj["status"] != "validating":
            return
        if job.poison == "fail":
            line = next((i for i, ln in enumerate(job.lines, 1) if "#batch:fail" in json.dumps(ln.body)), 1)
            obj["errors"] = {
                "object": "list",
                "data": [
                    {
                        "code": "invalid_request",
                        "message": "Batch failed (#batch:fail directive).",
                        "param": None,
                        "line": line,
                    }
                ],
            }
            obj.update(status="failed", failed_at=_now())
            return
        obj.update(status="in_progress", in_progress_at=_now())
        obj["request_counts"]["total"] = len(job.lines)
        await asyncio.sleep(max(0.0, delay - min(0.05, delay / 4)))
        if obj["status"] != "in_progress":
            return
        if job.poison == "expire":
            self._close_unrun(
                job,
                "expired",
                "batch_expired",
                "This request could not be executed before the completion window expired.",
            )
            return
        obj.update(status="finalizing", finalizing_at=_now())
        self._finalize(job)
        obj.update(status="completed", completed_at=_now())

    def _finalize(self, job: BatchJob) -> None:
        """Answer every line with the real-time handler; write the output and error files."""
        obj = job.obj
        ok: list[bytes] = []
        failed: list[bytes] = []
        usage = obj["usage"]
        for line in job.lines:
            text = request_text(line.kind, line.body)
            status, reply, _ = self.execute(line.kind, line.body, line.model, text)
            self.counters.batch_lines += 1
            out = {
                "id": _id("batch_req_"),
                "custom_id": line.custom_id,
                "response": {"status_code": status, "request_id": _id("req_"), "body": reply},
                "error": None,
            }
            (ok if status < 300 else failed).append(_dumps(out))
            if status < 300:
                _add_usage(usage, reply.get("usage") or {})
        obj["request_counts"].update(completed=len(ok), failed=len(failed))
        batch_id = obj["id"]
        if ok:
            obj["output_file_id"] = self.add_file(_jsonl(ok), f"{batch_id}_output.jsonl", "batch_output")["id"]
        if failed:
            obj["error_file_id"] = self.add_file(_jsonl(failed), f"{batch_id}_error.jsonl", "batch_output")["id"]

    def _close_unrun(self, job: BatchJob, status: str, code: str, message: str) -> None:
        """End a batch with no line run: every line goes to the error file with `code`."""
        obj = job.obj
        lines = [
            _dumps(
                {
                    "id": _id("batch_req_"),
                    "custom_id": ln.custom_id,
                    "response": None,
                    "error": {"code": code, "message": message},
                }
            )
            for ln in job.lines
        ]
        if lines:
            obj["error_file_id"] = self.add_file(_jsonl(lines), f"{obj['id']}_error.jsonl", "batch_output")["id"]
        obj["request_counts"].update(total=len(lines), completed=0, failed=len(lines))
        obj.update({"status": status, f"{status}_at": _now()})

    async def _finish_cancel(self, job: BatchJob) -> None:
        await asyncio.sleep(min(0.1, self.options.batch_delay))
        if job.obj["status"] == "cancelling":
            self._close_unrun(job, "cancelled", "batch_cancelled", "The batch was cancelled before this request ran.")

    # ----------------------------------------------------------------- app

    def routes(self) -> list[Route]:
        routes = [
            Route("/_health", self.health, methods=["GET"]),
            Route("/_stats", self.stats, methods=["GET"]),
            Route("/_reset", self.reset, methods=["POST"]),
        ]
        # the real-time endpoints are served by RealtimeFastPath, in front of the router
        for prefix in ("/v1", "/openai", "/openai/v1"):
            routes += [
                Route(f"{prefix}/files", self.guarded(self.upload_file), methods=["POST"]),
                Route(f"{prefix}/files", self.guarded(self.list_files), methods=["GET"]),
                Route(f"{prefix}/files/{{file_id}}", self.guarded(self.get_file), methods=["GET"]),
                Route(f"{prefix}/files/{{file_id}}", self.guarded(self.delete_file), methods=["DELETE"]),
                Route(f"{prefix}/files/{{file_id}}/content", self.guarded(self.file_content), methods=["GET"]),
                Route(f"{prefix}/batches", self.guarded(self.create_batch), methods=["POST"]),
                Route(f"{prefix}/batches", self.guarded(self.list_batches), methods=["GET"]),
                Route(f"{prefix}/batches/{{batch_id}}", self.guarded(self.get_batch), methods=["GET"]),
                Route(f"{prefix}/batches/{{batch_id}}/cancel", self.guarded(self.cancel_batch), methods=["POST"]),
            ]
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


# --------------------------------------------------------------------------- batch helpers


def _batch_endpoint(value: Any, strict: bool) -> tuple[str, str]:
    """Check a batch's `endpoint`; OpenAI takes only `/v1/…`, Azure also the bare form."""
    if isinstance(value, str):
        bare = value[3:] if value.startswith("/v1/") else value
        if bare in BATCH_ENDPOINTS and (value.startswith("/v1/") or not strict):
            return value, BATCH_ENDPOINTS[bare]
    allowed = ", ".join(f"'/v1{e}'" for e in BATCH_ENDPOINTS)
    raise _invalid("endpoint", f"Invalid value for 'endpoint': {value!r}. Supported values are: {allowed}.")


def _parse_batch_lines(content: bytes, endpoint: str, kind: str) -> list[BatchLine]:
    """Validate an input file like OpenAI does; a bad line is a 400 naming the line."""

    def bad(line: int, code: str, message: str) -> ApiError:
        return ApiError(400, f"Line {line}: {message}", param="input_file_id", code=code)

    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            data = _loads(raw)
        except ValueError:
            raise bad(number, "invalid_json_line", "this line is not valid JSON.") from None
        if not isinstance(data, dict):
            raise bad(number, "invalid_json_line", "each line must be a JSON object.")
        for name in ("custom_id", "method", "url"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise bad(number, "missing_required_parameter", f"missing required parameter '{name}'.")
        custom_id: str = data["custom_id"]
        body = data.get("body")
        if not isinstance(body, dict):
            raise bad(number, "missing_required_parameter", "missing required parameter 'body'.")
        if data["method"] != "POST":
            raise bad(number, "invalid_request", "only the POST method is supported.")
        if data["url"] != endpoint:
            raise bad(number, "invalid_url", f"the url {data['url']!r} does not match the batch endpoint {endpoint!r}.")
        if custom_id in seen:
            raise bad(number, "duplicate_custom_id", f"the custom_id {custom_id!r} is not unique.")
        if body.get("stream"):
            raise bad(number, "streaming_unsupported", "streaming is not supported in batches.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise bad(number, "missing_required_parameter", "missing required parameter 'model'.")
        if lines and model != lines[0].model:
            raise bad(number, "mismatched_model", f"one model per batch; got {model!r} and {lines[0].model!r}.")
        try:
            request_text(kind, body)
        except ApiError as exc:
            raise bad(number, "invalid_request", exc.message) from None
        seen.add(custom_id)
        lines.append(BatchLine(custom_id, kind, body, model))
    if not lines:
        raise ApiError(400, "The input file is empty.", param="input_file_id", code="empty_file")
    return lines


def _poison(content: bytes) -> str | None:
    """A batch-level directive in the input file: "fail", "expire" or None."""
    if b"#batch:fail" in content:
        return "fail"
    return "expire" if b"#batch:expire" in content else None


def _new_batch(body: JSON, endpoint: str, model: str) -> JSON:
    now = _now()
    return {
        "id": _id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": body["input_file_id"],
        "completion_window": body["completion_window"],
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + 24 * 3600,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": body.get("metadata"),
        "model": model,
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }


def _add_usage(total: JSON, usage: JSON) -> None:
    inp = usage.get("prompt_tokens", usage.get("input_tokens")) or 0
    out = usage.get("completion_tokens", usage.get("output_tokens")) or 0
    total["input_tokens"] += inp
    total["output_tokens"] += out
    total["total_tokens"] += inp + out


def _jsonl(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def _limit(value: str | None, default: int, maximum: int | None = None) -> int:
    try:
        limit = int(value) if value is not None else default
    except ValueError:
        raise _invalid("limit", f"Invalid value for 'limit': {value!r}.") from None
    if limit < 1 or (maximum is not None and limit > maximum):
        raise _invalid("limit", f"'limit' must be between 1 and {maximum or 'any'}.")
    return limit


def _page(items: list[JSON], after: str | None, limit: int) -> JSON:
    """OpenAI's cursor page: {object, data, first_id, last_id, has_more}."""
    if after:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


# --------------------------------------------------------------------------- the process and its handle


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


class Upstream:
    """A running upstream server process, as tests and benchmarks hold it."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, api_key: str, log_path: str) -> None:
        self.process = process
        self.host = host
        self.port = port
        self.api_key = api_key  # a key clients can send (the required one when started with api_key)
        self.log_path = log_path

    @property
    def url(self) -> str:
        """Root URL: the Azure `azure_endpoint`, and `api_base` for a hosted vLLM."""
        return f"http://{self.host}:{self.port}"

    @property
    def v1_url(self) -> str:
        """OpenAI `base_url` / LiteLLM `api_base` for openai/… deployments."""
        return f"{self.url}/v1"

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with _OPENER.open(request, timeout=10) as reply:
            return json.loads(reply.read())

    def stats(self) -> JSON:
        """{"requests", "by_path", "by_model", "by_status", "by_custom", "batch_lines", "files_created",
        "batches_created"}."""
        return self._call("GET", "/_stats")

    def reset(self) -> None:
        """Clear counters, directive attempts, files and batches."""
        self._call("POST", "/_reset")

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        with contextlib.suppress(OSError):
            return Path(self.log_path).read_text(errors="replace")
        return ""

    def stop(self) -> None:
        """Terminate the process and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)

    def __enter__(self) -> Upstream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Upstream({self.url}, pid={self.process.pid})"


def start_upstream(
    latency_ms: float = 0,
    batch_delay: float = 0.5,
    extra_args: Sequence[str] = (),
    *,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
) -> Upstream:
    """Start the server as a subprocess on a free loopback port and wait until it answers.

    The listening socket is bound here and handed to the child, so the port is
    never raced. `api_key` makes the server require that key.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    port = sock.getsockname()[1]
    args = ["--fd", str(sock.fileno()), "--latency-ms", str(latency_ms), "--batch-delay", str(batch_delay)]
    if api_key is not None:
        args += ["--api-key", api_key]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    log_fd, log_path = tempfile.mkstemp(prefix="upstream-", suffix=".log")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.upstream", *args, *extra_args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(sock.fileno(),),
        )
    finally:
        sock.close()
        os.close(log_fd)
    upstream = Upstream(process, host, port, api_key or "sk-upstream-test", log_path)
    _wait_healthy(upstream, timeout)
    return upstream


def _wait_healthy(upstream: Upstream, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not upstream.alive():
            log = upstream.log()
            upstream.stop()
            raise RuntimeError(f"upstream server exited with {upstream.process.returncode}:\n{log}")
        try:
            if upstream._call("GET", "/_health").get("status") == "ok":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            log = upstream.log()
            upstream.stop()
            raise RuntimeError(f"upstream server did not answer within {timeout}s:\n{log}")
        time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.upstream", description="OpenAI/Azure stand-in for tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every real-time request")
    parser.add_argument("--batch-delay", type=float, default=0.5, help="seconds from batch creation to completion")
    parser.add_argument("--api-key", default=None, help="require this key (Bearer or api-key header)")
    args = parser.parse_args(argv)

    import uvicorn

    app = build_app(Options(latency_ms=args.latency_ms, batch_delay=args.batch_delay, api_key=args.api_key))
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
