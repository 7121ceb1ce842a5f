"""A stand-in for the Gemini API's Batch Mode on loopback (`python -m tests.fakes.stubs_gemini`).

Written from Google's API reference (ai.google.dev/api/batch-mode, ai.google.dev/api/generate-content), not
from what LiteLLM sends: auth by the `x-goog-api-key` header (none: 403 PERMISSION_DENIED; a wrong one with
`--api-key`: 400 INVALID_ARGUMENT "API key not valid", as Google answers);
`POST /v1beta/models/{model}:batchGenerateContent` with `{"batch": {"displayName", "inputConfig":
{"requests": {"requests": [{"request": GenerateContentRequest, "metadata": {...}}]}}}}` → an Operation
`{name: "batches/{id}", metadata: GenerateContentBatch, done}`; `GET /v1beta/batches/{id}` (the operation;
once done, `response.inlinedResponses.inlinedResponses`: `{response | error, metadata}` per request, in
request order); `POST /v1beta/batches/{id}:cancel`. States `BATCH_STATE_PENDING` → `RUNNING` → `SUCCEEDED` |
`FAILED` | `CANCELLED` | `EXPIRED`. Errors: `{"error": {"code", "message", "status"}}`.

Strict on field names: a `GenerateContentRequest`, its `generationConfig` and each `Content` may hold only the
reference's fields (proto3 JSON: lowerCamelCase, or the proto's own snake_case name, which Google's JSON parser
also takes and LiteLLM sends: `system_instruction`, `max_output_tokens`); `contents` roles are `user` or `model`
(the system prompt is `systemInstruction`). Limits: 20 MB of inline requests (`--max-requests` adds a count
limit for tests).

A batch ends `--batch-delay` seconds after creation: each request answered "echo: <last user text>" (tokens:
whitespace words). Directives in a request's text: `#fail:STATUS` makes it an error `google.rpc.Status` of that
code word (`RESOURCE_EXHAUSTED`, `INVALID_ARGUMENT`...); `#batch:expire` / `#batch:fail` anywhere end the whole
batch `BATCH_STATE_EXPIRED` / `BATCH_STATE_FAILED` with no responses.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import directive, serve, stub_arguments, words

MAX_BYTES = 20 * 1024 * 1024
_OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput"
_BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch"
_RPC = {"CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4, "NOT_FOUND": 5,
        "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8, "INTERNAL": 13, "UNAVAILABLE": 14}
_HTTP = {"INVALID_ARGUMENT": 400, "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _names(*camel: str) -> frozenset[str]:
    """A message's fields as proto3 JSON takes them: lowerCamelCase or the proto's snake_case name."""
    return frozenset(camel) | frozenset(_snake(c) for c in camel)


_REQUEST_FIELDS = _names("model", "contents", "tools", "toolConfig", "safetySettings", "systemInstruction",
                         "generationConfig", "cachedContent", "serviceTier", "store")
_GENERATION_FIELDS = _names(
    "stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema", "responseModalities",
    "candidateCount", "maxOutputTokens", "temperature", "topP", "topK", "seed", "presencePenalty",
    "frequencyPenalty", "responseLogprobs", "logprobs", "enableEnhancedCivicAnswers", "speechConfig",
    "thinkingConfig", "imageConfig", "mediaResolution")
_CONTENT_FIELDS = frozenset({"parts", "role"})
_PART_FIELDS = _names("text", "inlineData", "functionCall", "functionResponse", "fileData", "executableCode",
                      "codeExecutionResult", "thought", "thoughtSignature", "videoMetadata", "partMetadata")


class ApiError(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Batch:
    op: dict[str, Any]
    requests: list[dict[str, Any]]
    task: asyncio.Task[None] | None = None


class GeminiStub:
    def __init__(self, batch_delay: float, api_key: str | None, max_requests: int | None) -> None:
        self.batch_delay, self.api_key, self.max_requests = batch_delay, api_key, max_requests
        self.batches: dict[str, Batch] = {}
        self.counters: Counter[str] = Counter()
        self.requests_seen: list[dict[str, Any]] = []

    def _check(self, request: Request) -> None:
        key = request.headers.get("x-goog-api-key")
        if not key:
            raise ApiError("PERMISSION_DENIED", "Method doesn't allow unregistered callers (callers without "
                                                "established identity). Please use API Key or other form of API "
                                                "consumer identity to call this API.")
        if self.api_key is not None and key != self.api_key:
            raise ApiError("INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.")

    async def dispatch(self, request: Request) -> Response:
        try:
            self._check(request)
            tail = request.path_params["tail"]
            if request.method == "POST" and tail.startswith("models/") and tail.endswith(":batchGenerateContent"):
                return await self.create(request, tail.removeprefix("models/").removesuffix(":batchGenerateContent"))
            if tail.startswith("batches/"):
                name, _, verb = tail.partition(":")
                batch = self.batches.get(name)
                if batch is None:
                    raise ApiError("NOT_FOUND", f"Batch {name} not found.")
                if request.method == "POST" and verb == "cancel":
                    return self.cancel(batch)
                if request.method == "GET" and not verb:
                    return JSONResponse(batch.op)
            raise ApiError("NOT_FOUND", f"Method not found: {request.method} {request.url.path}")
        except ApiError as exc:
            code = _HTTP.get(exc.status, 500)
            return JSONResponse({"error": {"code": code, "message": exc.message, "status": exc.status}},
                                status_code=code)

    async def create(self, request: Request, model: str) -> Response:
        raw = await request.body()
        if len(raw) > MAX_BYTES:
            raise ApiError("INVALID_ARGUMENT", f"Request payload size exceeds the limit: {MAX_BYTES} bytes.")
        try:
            body = json.loads(raw)
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", "Invalid JSON payload received.") from None
        batch = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(batch, dict) or set(body) != {"batch"}:
            raise ApiError("INVALID_ARGUMENT", "batch: Field required (the only field of the request body)")
        unknown = set(batch) - _names("displayName", "inputConfig", "priority")
        if unknown:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. Unknown name {sorted(unknown)[0]!r} "
                                               "at 'batch': Cannot find field.")
        if not isinstance(batch.get("displayName", batch.get("display_name")), str):
            raise ApiError("INVALID_ARGUMENT", "batch.display_name is required")
        config = batch.get("inputConfig", batch.get("input_config"))
        inline = (config or {}).get("requests") if isinstance(config, dict) else None
        requests = inline.get("requests") if isinstance(inline, dict) else None
        if not isinstance(requests, list) or not requests:
            raise ApiError("INVALID_ARGUMENT", "batch.input_config.requests.requests: a non-empty list is required")
        if self.max_requests is not None and len(requests) > self.max_requests:
            raise ApiError("INVALID_ARGUMENT", f"A batch holds at most {self.max_requests} requests, "
                                               f"got {len(requests)}")
        for i, item in enumerate(requests):
            _validate(i, item)
        name = "batches/" + secrets.token_hex(10)
        meta = {"@type": _BATCH_TYPE, "model": f"models/{model}", "displayName": batch.get("displayName"),
                "createTime": _now(), "updateTime": _now(), "state": "BATCH_STATE_PENDING",
                "batchStats": {"requestCount": str(len(requests)), "pendingRequestCount": str(len(requests))}}
        entry = self.batches[name] = Batch({"name": name, "metadata": meta, "done": False}, requests)
        self.counters["batches_created"] += 1
        self.counters["batch_requests"] += len(requests)
        self.requests_seen.extend(item["request"] for item in requests)
        entry.task = asyncio.get_running_loop().create_task(self._run(entry, model))
        return JSONResponse(entry.op)

    def cancel(self, batch: Batch) -> Response:
        if not batch.op["done"]:
            self.counters["cancels"] += 1
            if batch.task is not None:
                batch.task.cancel()
            self._end(batch, "BATCH_STATE_CANCELLED")
        return JSONResponse({})

    async def _run(self, batch: Batch, model: str) -> None:
        batch.op["metadata"]["state"] = "BATCH_STATE_RUNNING"
        await asyncio.sleep(self.batch_delay)
        text = json.dumps(batch.requests)
        if "#batch:expire" in text:
            self._end(batch, "BATCH_STATE_EXPIRED")
        elif "#batch:fail" in text:
            batch.op["error"] = {"code": 3, "message": "Batch failed (#batch:fail directive)."}
            self._end(batch, "BATCH_STATE_FAILED")
        else:
            answers = [{**_answer(item["request"], model), "metadata": item.get("metadata") or {}}
                       for item in batch.requests]
            batch.op["response"] = {"@type": _OUTPUT_TYPE, "inlinedResponses": {"inlinedResponses": answers}}
            self._end(batch, "BATCH_STATE_SUCCEEDED")

    def _end(self, batch: Batch, state: str) -> None:
        batch.op["metadata"].update(state=state, endTime=_now(), updateTime=_now())
        batch.op["done"] = True

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "requests_seen": self.requests_seen}


def _validate(i: int, item: Any) -> None:
    where = f"batch.input_config.requests.requests[{i}]"
    if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
        raise ApiError("INVALID_ARGUMENT", f"{where}.request: Field required")
    unknown = set(item) - {"request", "metadata"}
    if unknown:
        raise ApiError("INVALID_ARGUMENT", f"Unknown name {sorted(unknown)[0]!r} at '{where}': Cannot find field.")
    request = item["request"]
    for fields, obj, at in ((_REQUEST_FIELDS, request, "request"),
                            (_GENERATION_FIELDS, request.get("generationConfig", request.get("generation_config"))
                             or {}, "request.generation_config")):
        stray = set(obj) - fields
        if stray:
            raise ApiError("INVALID_ARGUMENT", f"Invalid JSON payload received. Unknown name {sorted(stray)[0]!r} at "
                                               f"'{where}.{at}': Cannot find field.")
    contents = request.get("contents")
    if not isinstance(contents, list) or not contents:
        raise ApiError("INVALID_ARGUMENT", f"{where}.request.contents: contents is not specified")
    system = request.get("systemInstruction", request.get("system_instruction"))
    for content in contents + ([system] if system is not None else []):
        if not isinstance(content, dict) or set(content) - _CONTENT_FIELDS \
                or not isinstance(content.get("parts"), list):
            raise ApiError("INVALID_ARGUMENT", f"{where}.request.contents: a Content is {{parts, role}}")
        if content is not system and content.get("role") not in ("user", "model"):
            raise ApiError("INVALID_ARGUMENT", f"{where}.request.contents: Please use a valid role: user, model.")
        for part in content["parts"]:
            if not isinstance(part, dict) or set(part) - _PART_FIELDS:
                raise ApiError("INVALID_ARGUMENT", f"{where}.request.contents.parts: Unknown name in a Part")


def _text(content: dict[str, Any] | None) -> str:
    return " ".join(str(p.get("text", "")) for p in (content or {}).get("parts") or [] if "text" in p)


def _answer(request: dict[str, Any], model: str) -> dict[str, Any]:
    contents = request["contents"]
    text = next((_text(c) for c in reversed(contents) if c.get("role") == "user"), "")
    failure = directive(text, "fail")
    if failure is not None:
        return {"error": {"code": _RPC.get(failure, 2), "message": f"Request failed (#fail:{failure} directive)."}}
    reply = f"echo: {text}"
    system = request.get("systemInstruction", request.get("system_instruction"))
    prompt = sum(words(_text(c)) for c in contents) + words(_text(system))
    return {"response": {
        "candidates": [{"content": {"role": "model", "parts": [{"text": reply}]}, "finishReason": "STOP",
                        "index": 0}],
        "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": words(reply),
                          "totalTokenCount": prompt + words(reply)},
        "modelVersion": model, "responseId": secrets.token_hex(8)}}


def build_app(stub: GeminiStub) -> Starlette:
    async def stats(request: Request) -> Response:
        return JSONResponse(stub.stats())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def reset(request: Request) -> Response:
        stub.batches.clear()
        stub.counters.clear()
        stub.requests_seen.clear()
        return JSONResponse({"ok": True})

    return Starlette(routes=[
        Route("/_health", health), Route("/_stats", stats), Route("/_reset", reset, methods=["POST"]),
        Route("/v1beta/{tail:path}", stub.dispatch, methods=["GET", "POST"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_gemini", "Gemini Batch Mode stand-in for tests.")
    parser.add_argument("--max-requests", type=int, default=None, help="requests per batch at most (tests)")
    args = parser.parse_args()
    serve(build_app(GeminiStub(args.batch_delay, args.api_key, args.max_requests)), args)


if __name__ == "__main__":
    main()
