"""A stand-in for Anthropic's Message Batches API on loopback (`python -m tests.fakes.stubs_anthropic`).

The shape follows Anthropic's public API reference: headers `x-api-key` and `anthropic-version`;
`POST /v1/messages/batches` with `{"requests": [{"custom_id", "params"}]}` (params: a Messages API body:
`model`, `max_tokens`, `messages` required); `GET /v1/messages/batches[/{id}]`; `POST .../{id}/cancel`;
`GET .../{id}/results` (JSONL, once the batch has `ended`); and the real-time `POST /v1/messages` (one
Messages API body in, one `message` out, answered as a batch request is). A Message Batch has `processing_status`
in_progress → (canceling →) ended, `request_counts` {processing, succeeded, errored, canceled, expired},
RFC 3339 times and `results_url`. Errors: `{"type": "error", "error": {"type", "message"}}` with
400 invalid_request_error, 401 authentication_error, 404 not_found_error, 413 request_too_large.
Limits: 100,000 requests and 256 MB per batch (`--max-requests` lowers the first for tests); custom_id
matches `^[a-zA-Z0-9_-]{1,64}$` and is unique in its batch.

A batch ends `--batch-delay` seconds after creation: each request answered "echo: <last user text>"
(tokens: whitespace words).

Prompt caching, as Anthropic's docs describe it: a request's prefix up to its last `cache_control` breakpoint
(`tools`, then `system`, then the messages' content blocks, `tool_choice` with them) is read from the cache
when an earlier request wrote that same prefix (`usage.cache_read_input_tokens`), else written
(`usage.cache_creation_input_tokens`); the rest is `input_tokens`. An entry lives 5 minutes, or an hour with
`"ttl": "1h"`. A real-time request's write is there for the next request; a Message Batch's requests read only
what was written before the batch was created (they run at once: none reads another's write), and their
writes land when the batch ends. `/_stats` has `cache_read_tokens`, `cache_write_tokens` and `arrivals` (each
real-time message and batch create, in order: `message:<model>`, `batch:<requests>`).

Directives in a request's text: `#fail:TYPE` makes it `errored` with that error type (`overloaded_error`,
`invalid_request_error`...); `#batch:expire` anywhere makes the whole batch end with every request `expired`
(what a batch that outlives its 24 hours does). Cancel: canceling, then ended with the unanswered requests `canceled`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import (
    bill,
    control_routes,
    directive,
    last_user_text,
    serve,
    stub_arguments,
    text_of,
    words,
)

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type_, message


def _error(status: int, type_: str, message: str) -> JSONResponse:
    body = {"type": "error", "error": {"type": type_, "message": message},
            "request_id": "req_" + secrets.token_hex(12)}
    return JSONResponse(body, status_code=status)


def _now(hours: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


class PromptCache:
    """Cached prefixes: a hash of the model and the prefix -> when the entry expires (monotonic seconds)."""

    def __init__(self, entries: dict[str, float] | None = None) -> None:
        self.entries: dict[str, float] = entries or {}

    def snapshot(self) -> PromptCache:
        return PromptCache(dict(self.entries))

    def holds(self, key: str) -> bool:
        return self.entries.get(key, 0.0) > time.monotonic()


@dataclass
class Batch:
    obj: dict[str, Any]
    requests: list[dict[str, Any]]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # custom_id -> result
    task: asyncio.Task[None] | None = None
    readable: PromptCache = field(default_factory=PromptCache)  # the cache when the batch was created


class AnthropicStub:
    def __init__(self, batch_delay: float, api_key: str | None, max_requests: int) -> None:
        self.batch_delay, self.api_key, self.max_requests = batch_delay, api_key, max_requests
        self.batches: dict[str, Batch] = {}
        self.counters: Counter[str] = Counter()
        self.by_model: Counter[str] = Counter()
        self.params_seen: list[dict[str, Any]] = []  # every request's params, in arrival order
        self.cache = PromptCache()
        self.arrivals: list[str] = []

    # -- the HTTP surface ---------------------------------------------------------------------------

    def _check(self, request: Request) -> None:
        key = request.headers.get("x-api-key")
        if not key:
            raise ApiError(401, "authentication_error", "x-api-key header is required")
        if self.api_key is not None and key != self.api_key:
            raise ApiError(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            raise ApiError(400, "invalid_request_error", "anthropic-version: header is required")

    def _batch(self, request: Request) -> Batch:
        batch = self.batches.get(request.path_params["batch_id"])
        if batch is None:
            raise ApiError(404, "not_found_error", f"Message batch {request.path_params['batch_id']} not found.")
        return batch

    async def handle(self, request: Request) -> Response:
        try:
            self._check(request)
            path, method = request.url.path.rstrip("/"), request.method
            if path == "/v1/messages/batches":
                return await self.create(request) if method == "POST" else self.list()
            if path.endswith("/cancel"):
                return self.cancel(self._batch(request))
            if path.endswith("/results"):
                return self.results(self._batch(request))
            return JSONResponse(self._batch(request).obj)
        except ApiError as exc:
            return _error(exc.status, exc.type, exc.message)

    async def message(self, request: Request) -> Response:
        """The real-time Messages API: the same answer a batch request gets, or its error."""
        try:
            self._check(request)
            params = json.loads(await request.body())
            _validate(0, {"custom_id": "realtime", "params": params}, set())
        except ApiError as exc:
            return _error(exc.status, exc.type, exc.message)
        except ValueError:
            return _error(400, "invalid_request_error", "the body is not JSON")
        self.counters["messages"] += 1
        self.by_model[params["model"]] += 1
        self.params_seen.append(params)
        self.arrivals.append(f"message:{params['model']}")
        answer = _answer(params, self.cache, self.counters)
        if answer["type"] != "succeeded":
            error = answer["error"]["error"]
            return _error(529 if error["type"] == "overloaded_error" else 400, error["type"], error["message"])
        return JSONResponse(answer["message"])

    async def create(self, request: Request) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BYTES:
            raise ApiError(413, "request_too_large", f"Request exceeds the maximum allowed size of {MAX_BYTES} bytes")
        try:
            body = json.loads(raw)
        except ValueError:
            raise ApiError(400, "invalid_request_error", "The request body is not valid JSON.") from None
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            raise ApiError(400, "invalid_request_error", "requests: Field required (a non-empty list)")
        if len(requests) > self.max_requests:
            raise ApiError(400, "invalid_request_error",
                           f"requests: a batch holds at most {self.max_requests} requests, got {len(requests)}")
        seen: set[str] = set()
        for i, item in enumerate(requests):
            _validate(i, item, seen)
        batch_id = "msgbatch_" + secrets.token_hex(12)
        now = _now()
        obj = {"id": batch_id, "type": "message_batch", "processing_status": "in_progress",
               "request_counts": {"processing": len(requests), "succeeded": 0, "errored": 0, "canceled": 0,
                                  "expired": 0},
               "ended_at": None, "created_at": now, "expires_at": _now(24), "archived_at": None,
               "cancel_initiated_at": None, "results_url": None}
        batch = self.batches[batch_id] = Batch(obj, requests)
        self.counters["batches_created"] += 1
        self.counters["batch_requests"] += len(requests)
        self.arrivals.append(f"batch:{len(requests)}")
        batch.readable = self.cache.snapshot()
        for item in requests:
            self.by_model[item["params"]["model"]] += 1
        self.params_seen.extend(item["params"] for item in requests)
        batch.task = asyncio.get_running_loop().create_task(self._run(batch))
        return JSONResponse(obj)

    def list(self) -> Response:
        data = [b.obj for b in reversed(self.batches.values())]
        return JSONResponse({"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None})

    def cancel(self, batch: Batch) -> Response:
        if batch.obj["processing_status"] == "ended":
            raise ApiError(400, "invalid_request_error", f"Message batch {batch.obj['id']} has already ended.")
        if batch.obj["processing_status"] == "in_progress":
            self.counters["cancels"] += 1
            batch.obj.update(processing_status="canceling", cancel_initiated_at=_now())
            if batch.task is not None:
                batch.task.cancel()
            asyncio.get_running_loop().call_later(0.1, self._end, batch, "canceled")
        return JSONResponse(batch.obj)

    def results(self, batch: Batch) -> Response:
        if batch.obj["processing_status"] != "ended":
            raise ApiError(404, "not_found_error", f"Results of message batch {batch.obj['id']} are not available "
                                                   "until processing ends.")
        lines = [json.dumps({"custom_id": cid, "result": r}) + "\n" for cid, r in batch.results.items()]
        return Response("".join(lines), media_type="application/binary")

    # -- running a batch ---------------------------------------------------------------------------

    async def _run(self, batch: Batch) -> None:
        await asyncio.sleep(self.batch_delay)
        if any("#batch:expire" in json.dumps(item["params"]) for item in batch.requests):
            self._end(batch, "expired")
            return
        written: list[tuple[str, float]] = []
        for item in batch.requests:
            answer = batch.results[item["custom_id"]] = _answer(item["params"], batch.readable, self.counters,
                                                                written)
            bill(self.counters, (answer.get("message") or {}).get("usage"))
        self.cache.entries.update(written)
        self._end(batch, "canceled")

    def _end(self, batch: Batch, unanswered: str) -> None:
        if batch.obj["processing_status"] == "ended":
            return
        for item in batch.requests:
            batch.results.setdefault(item["custom_id"], {"type": unanswered})
        counts = Counter(r["type"] for r in batch.results.values())
        batch.obj["request_counts"] = {k: counts.get(k, 0) for k in ("succeeded", "errored", "canceled", "expired")}
        batch.obj["request_counts"]["processing"] = 0
        batch.obj.update(processing_status="ended", ended_at=_now(),
                         results_url=f"/v1/messages/batches/{batch.obj['id']}/results")

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "by_model": dict(self.by_model), "params_seen": self.params_seen,
                "arrivals": self.arrivals}

    def reset(self) -> None:
        self.batches.clear()
        self.counters.clear()
        self.by_model.clear()
        self.cache.entries.clear()
        self.arrivals.clear()


def _segments(params: dict[str, Any]) -> list[tuple[Any, int, dict[str, Any] | None]]:
    """A request's prompt in cache order: (the block, its tokens, its `cache_control`) for each tool, system
    block and message content block."""
    found: list[tuple[Any, int, dict[str, Any] | None]] = []
    for tool in params.get("tools") or []:
        found.append((tool, words(json.dumps(tool.get("input_schema") or {})) + words(str(tool.get("description")
                                                                                        or "")),
                      tool.get("cache_control")))
    system = params.get("system")
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system or []
    for block in blocks:
        found.append((block, words(text_of([block])), block.get("cache_control")))
    for message in params["messages"]:
        content = message.get("content")
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
            found.append(({"role": message["role"], **block}, words(text_of([block])), block.get("cache_control")))
    return found


def _cache_use(params: dict[str, Any], cache: PromptCache, counters: Counter[str],
               written: list[tuple[str, float]] | None) -> tuple[int, int, int]:
    """(input tokens outside the cache, tokens read from it, tokens written to it) of one request; a write goes
    into `cache` at once (a real-time request) or into `written` (a batch's, landing when it ends)."""
    segments = _segments(params)
    total = sum(tokens for _, tokens, _ in segments)
    last = max((i for i, (_, _, marked) in enumerate(segments) if marked), default=-1)
    if last < 0:
        return total, 0, 0
    prefix = [block for block, _, _ in segments[:last + 1]]
    key = hashlib.sha256(json.dumps([params["model"], params.get("tool_choice"), prefix],
                                    sort_keys=True).encode()).hexdigest()
    tokens = sum(t for _, t, _ in segments[:last + 1])
    if cache.holds(key):
        counters["cache_read_tokens"] += tokens
        return total - tokens, tokens, 0
    ttl = 3600.0 if (segments[last][2] or {}).get("ttl") == "1h" else 300.0
    entry = (key, time.monotonic() + ttl)
    if written is None:
        cache.entries[entry[0]] = entry[1]
    else:
        written.append(entry)
    counters["cache_write_tokens"] += tokens
    return total - tokens, 0, tokens


def _validate(i: int, item: Any, seen: set[str]) -> None:
    where = f"requests.{i}"
    if not isinstance(item, dict):
        raise ApiError(400, "invalid_request_error", f"{where}: Input should be an object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
        raise ApiError(400, "invalid_request_error", f"{where}.custom_id: String should match pattern "
                                                     "'^[a-zA-Z0-9_-]{1,64}$'")
    if custom_id in seen:
        raise ApiError(400, "invalid_request_error", f"{where}.custom_id: duplicate custom_id {custom_id!r}")
    seen.add(custom_id)
    params = item.get("params")
    if not isinstance(params, dict):
        raise ApiError(400, "invalid_request_error", f"{where}.params: Field required")
    for name, kind in (("model", str), ("max_tokens", int), ("messages", list)):
        if not isinstance(params.get(name), kind):
            raise ApiError(400, "invalid_request_error", f"{where}.params.{name}: Field required")
    if any(m.get("role") not in ("user", "assistant") for m in params["messages"]):
        raise ApiError(400, "invalid_request_error", f"{where}.params.messages: roles must be user or assistant "
                                                     "(the system prompt is the top-level `system`)")


def _answer(params: dict[str, Any], cache: PromptCache, counters: Counter[str],
            written: list[tuple[str, float]] | None = None) -> dict[str, Any]:
    text = last_user_text(params["messages"])
    failure = directive(text, "fail")
    if failure is not None:
        return {"type": "errored", "error": {"type": "error", "error": {
            "type": failure or "api_error", "message": f"Request failed (#fail:{failure} directive)."}}}
    reply = f"echo: {text}"
    prompt, read, wrote = _cache_use(params, cache, counters, written)
    usage = {"input_tokens": prompt, "output_tokens": words(reply), "cache_read_input_tokens": read,
             "cache_creation_input_tokens": wrote}
    message = {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
               "model": params["model"], "content": [{"type": "text", "text": reply}],
               "stop_reason": "end_turn",
               "stop_sequence": None, "usage": usage}
    searched = directive(text, "searches")  # `#searches:N`: as if a web_search server tool ran N times
    if searched:
        message["usage"]["server_tool_use"] = {"web_search_requests": int(searched)}
    return {"type": "succeeded", "message": message}


def build_app(stub: AnthropicStub) -> Starlette:
    return Starlette(routes=[
        *control_routes(stub),
        Route("/v1/messages", stub.message, methods=["POST"]),
        Route("/v1/messages/batches", stub.handle, methods=["GET", "POST"]),
        Route("/v1/messages/batches/{batch_id}", stub.handle, methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}/cancel", stub.handle, methods=["POST"]),
        Route("/v1/messages/batches/{batch_id}/results", stub.handle, methods=["GET"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_anthropic", "Anthropic Message Batches stand-in for tests.")
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS, help="requests per batch at most")
    args = parser.parse_args()
    serve(build_app(AnthropicStub(args.batch_delay, args.api_key, args.max_requests)), args)


if __name__ == "__main__":
    main()
