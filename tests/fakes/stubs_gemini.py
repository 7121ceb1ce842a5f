"""A stand-in for the Gemini API's Batch Mode on loopback (`python -m tests.fakes.stubs_gemini`).

Written from Google's API reference (ai.google.dev/api/batch-mode, ai.google.dev/api/generate-content,
ai.google.dev/api/files) and the Batch Mode guide (ai.google.dev/gemini-api/docs/batch-mode), not from what
LiteLLM sends: auth by the `x-goog-api-key` header (none: 403 PERMISSION_DENIED; a wrong one with
`--api-key`: 400 INVALID_ARGUMENT "API key not valid", as Google answers);
`POST /v1beta/models/{model}:batchGenerateContent` with `{"batch": {"displayName", "inputConfig":
{"requests": {"requests": [{"request": GenerateContentRequest, "metadata": {...}}]}}}}` (inline) or
`{"batch": {"displayName", "inputConfig": {"fileName": "files/{id}"}}}` (a JSONL file of `{"key", "request"}`
lines) → an Operation `{name: "batches/{id}", metadata: GenerateContentBatch, done}`; `GET /v1beta/batches/{id}`
(the operation; once done, an inline batch's `response.inlinedResponses.inlinedResponses`: `{response | error,
metadata}` per request, in request order; a file batch's `response.responsesFile`: a file of `{"key",
"response" | "error"}` lines); `GET /v1beta/batches` (`pageSize`, `pageToken`: newest first);
`POST /v1beta/batches/{id}:cancel`. Files: `POST /upload/v1beta/files` resumable (`x-goog-upload-protocol:
resumable`, `x-goog-upload-command: start` with `{"file": {...}}` → the session URL in `x-goog-upload-url`; to
it, `upload, finalize` at offset 0 with the bytes → `{"file": File}`); `GET`/`DELETE /v1beta/files/{id}`;
`GET /download/v1beta/files/{id}:download?alt=media` (the content). States `BATCH_STATE_PENDING` → `RUNNING`
→ `SUCCEEDED` | `FAILED` | `CANCELLED` | `EXPIRED`. Errors: `{"error": {"code", "message", "status"}}`.

Strict on field names: a `GenerateContentRequest`, its `generationConfig` and each `Content` may hold only the
reference's fields (proto3 JSON: lowerCamelCase, or the proto's own snake_case name, which Google's JSON parser
also takes and LiteLLM sends: `system_instruction`, `max_output_tokens`); `contents` roles are `user` or `model`
(the system prompt is `systemInstruction`); a file's lines hold `key` and `request` only. Limits: 20 MB of inline
requests, 2 GB per file (`--max-requests` adds a count limit for tests).

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

from tests.fakes.stub_process import bill, directive, serve, stub_arguments, words

MAX_BYTES = 20 * 1024 * 1024
MAX_FILE_BYTES = 2 * 1024 * 1024 * 1024
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
    requests: list[dict[str, Any]]  # inline: `{request, metadata}`; from a file: `{key, request}`
    from_file: bool = False
    task: asyncio.Task[None] | None = None


@dataclass
class File:
    meta: dict[str, Any]
    content: bytes


class GeminiStub:
    def __init__(self, batch_delay: float, api_key: str | None, max_requests: int | None) -> None:
        self.batch_delay, self.api_key, self.max_requests = batch_delay, api_key, max_requests
        self.batches: dict[str, Batch] = {}
        self.files: dict[str, File] = {}
        self.uploads: dict[str, tuple[dict[str, Any], int]] = {}  # upload session -> (file metadata, its size)
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
            if request.method == "GET" and tail == "batches":
                return self.list_batches(request)
            if tail.startswith("files/"):
                return self.file(request, tail)
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
            return _error(exc)

    def list_batches(self, request: Request) -> Response:
        size = min(int(request.query_params.get("pageSize") or 50), 1000)
        start = int(request.query_params.get("pageToken") or 0)
        newest = list(reversed(self.batches.values()))
        page = [b.op for b in newest[start:start + size]]
        more = {"nextPageToken": str(start + size)} if start + size < len(newest) else {}
        return JSONResponse({"operations": page, **more})

    def file(self, request: Request, tail: str) -> Response:
        found = self.files.get(tail)
        if found is None:
            raise ApiError("NOT_FOUND", f"File {tail} not found.")
        if request.method == "DELETE":
            del self.files[tail]
            self.counters["files_deleted"] += 1
            return JSONResponse({})
        return JSONResponse(found.meta)

    async def upload(self, request: Request) -> Response:
        """The Files API's resumable upload: `start` opens a session, `upload, finalize` sends the bytes."""
        try:
            self._check(request)
            command = request.headers.get("x-goog-upload-command", "")
            session = request.query_params.get("upload_id")
            if session is None:
                if request.headers.get("x-goog-upload-protocol") != "resumable" or command != "start":
                    raise ApiError("INVALID_ARGUMENT", "Upload protocol: resumable, with a start command first")
                try:
                    meta = (json.loads(await request.body() or b"{}").get("file") or {})
                    size = int(request.headers["x-goog-upload-header-content-length"])
                except (ValueError, KeyError, AttributeError):
                    raise ApiError("INVALID_ARGUMENT", "A start needs a {\"file\": ...} body and "
                                                       "X-Goog-Upload-Header-Content-Length") from None
                if size > MAX_FILE_BYTES:
                    raise ApiError("INVALID_ARGUMENT", f"File size exceeds the limit: {MAX_FILE_BYTES} bytes.")
                session = secrets.token_hex(8)
                meta["mimeType"] = request.headers.get("x-goog-upload-header-content-type", "")
                self.uploads[session] = (meta, size)
                url = f"{request.url.scheme}://{request.url.netloc}/upload/v1beta/files?upload_id={session}"
                return Response(status_code=200, headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"})
            if session not in self.uploads:
                raise ApiError("NOT_FOUND", "No such upload session.")
            if command != "upload, finalize" or request.headers.get("x-goog-upload-offset") != "0":
                raise ApiError("INVALID_ARGUMENT", "Send the bytes with 'upload, finalize' at offset 0")
            meta, size = self.uploads.pop(session)
            content = await request.body()
            if len(content) != size:
                raise ApiError("INVALID_ARGUMENT", f"Expected {size} bytes, got {len(content)}")
            name = "files/" + secrets.token_hex(6)
            return JSONResponse({"file": self._store_file(name, content, meta)})
        except ApiError as exc:
            return _error(exc)

    def _store_file(self, name: str, content: bytes, meta: dict[str, Any]) -> dict[str, Any]:
        info = {"name": name, "displayName": meta.get("displayName", meta.get("display_name", "")),
                "mimeType": meta.get("mimeType", "application/jsonl"), "sizeBytes": str(len(content)),
                "createTime": _now(), "updateTime": _now(), "state": "ACTIVE", "source": "UPLOADED",
                "uri": f"https://generativelanguage.googleapis.com/v1beta/{name}"}
        self.files[name] = File(info, content)
        self.counters["files_uploaded" if meta else "files_written"] += 1
        return info

    async def download(self, request: Request) -> Response:
        try:
            self._check(request)
            name, _, verb = request.path_params["tail"].partition(":")
            found = self.files.get(name)
            if verb != "download" or request.query_params.get("alt") != "media":
                raise ApiError("NOT_FOUND", f"Method not found: {request.url.path}")
            if found is None:
                raise ApiError("NOT_FOUND", f"File {name} not found.")
            return Response(found.content, media_type="application/octet-stream")
        except ApiError as exc:
            return _error(exc)

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
        if not isinstance(config, dict) or len(config) != 1:
            raise ApiError("INVALID_ARGUMENT", "batch.input_config: exactly one of requests, file_name")
        file_name = config.get("fileName", config.get("file_name"))
        if file_name is not None:
            requests = self._file_requests(str(file_name))
        else:
            inline = config.get("requests")
            requests = inline.get("requests") if isinstance(inline, dict) else None
            if not isinstance(requests, list) or not requests:
                raise ApiError("INVALID_ARGUMENT", "batch.input_config.requests.requests: a non-empty list is required")
        if self.max_requests is not None and len(requests) > self.max_requests:
            raise ApiError("INVALID_ARGUMENT", f"A batch holds at most {self.max_requests} requests, "
                                               f"got {len(requests)}")
        for i, item in enumerate(requests):
            _validate(i, item, file_name is not None)
        name = "batches/" + secrets.token_hex(10)
        meta = {"@type": _BATCH_TYPE, "model": f"models/{model}", "displayName": batch.get("displayName"),
                "inputConfig": {"fileName": file_name} if file_name is not None else {"requests": {}},
                "createTime": _now(), "updateTime": _now(), "state": "BATCH_STATE_PENDING",
                "batchStats": {"requestCount": str(len(requests)), "pendingRequestCount": str(len(requests))}}
        entry = self.batches[name] = Batch({"name": name, "metadata": meta, "done": False}, requests,
                                           file_name is not None)
        self.counters["batches_created"] += 1
        self.counters["file_batches" if file_name is not None else "inline_batches"] += 1
        self.counters["batch_requests"] += len(requests)
        self.requests_seen.extend(item["request"] for item in requests)
        entry.task = asyncio.get_running_loop().create_task(self._run(entry, model))
        return JSONResponse(entry.op)

    def _file_requests(self, name: str) -> list[Any]:
        found = self.files.get(name)
        if found is None:
            raise ApiError("NOT_FOUND", f"File {name} not found.")
        try:
            requests = [json.loads(line) for line in found.content.splitlines() if line.strip()]
        except ValueError:
            raise ApiError("INVALID_ARGUMENT", f"{name}: every line must be a JSON object") from None
        if not requests:
            raise ApiError("INVALID_ARGUMENT", f"{name}: the file holds no requests")
        return requests

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
        elif batch.from_file:  # a file in, a file out: `{key, response | error}` lines
            lines = [json.dumps({"key": item["key"], **self._billed(_answer(item["request"], model))})
                     for item in batch.requests]
            written = self._store_file("files/batch-" + secrets.token_hex(6), "\n".join(lines).encode() + b"\n", {})
            batch.op["response"] = {"@type": _OUTPUT_TYPE, "responsesFile": written["name"]}
            batch.op["metadata"]["output"] = {"responsesFile": written["name"]}
            self._end(batch, "BATCH_STATE_SUCCEEDED")
        else:
            answers = [{**self._billed(_answer(item["request"], model)), "metadata": item.get("metadata") or {}}
                       for item in batch.requests]
            batch.op["response"] = {"@type": _OUTPUT_TYPE, "inlinedResponses": {"inlinedResponses": answers}}
            self._end(batch, "BATCH_STATE_SUCCEEDED")

    def _billed(self, answer: dict[str, Any]) -> dict[str, Any]:
        bill(self.counters, (answer.get("response") or {}).get("usageMetadata"))
        return answer

    def _end(self, batch: Batch, state: str) -> None:
        batch.op["metadata"].update(state=state, endTime=_now(), updateTime=_now())
        batch.op["done"] = True

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "requests_seen": self.requests_seen, "files": sorted(self.files)}


def _error(exc: ApiError) -> Response:
    code = _HTTP.get(exc.status, 500)
    return JSONResponse({"error": {"code": code, "message": exc.message, "status": exc.status}}, status_code=code)


def _validate(i: int, item: Any, from_file: bool) -> None:
    where = f"input file line {i + 1}" if from_file else f"batch.input_config.requests.requests[{i}]"
    if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
        raise ApiError("INVALID_ARGUMENT", f"{where}.request: Field required")
    if from_file and not isinstance(item.get("key"), str):
        raise ApiError("INVALID_ARGUMENT", f"{where}.key: a string is required")
    unknown = set(item) - ({"key", "request"} if from_file else {"request", "metadata"})
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
        stub.files.clear()
        stub.uploads.clear()
        stub.counters.clear()
        stub.requests_seen.clear()
        return JSONResponse({"ok": True})

    return Starlette(routes=[
        Route("/_health", health), Route("/_stats", stats), Route("/_reset", reset, methods=["POST"]),
        Route("/upload/v1beta/files", stub.upload, methods=["POST"]),
        Route("/download/v1beta/{tail:path}", stub.download, methods=["GET"]),
        Route("/v1beta/{tail:path}", stub.dispatch, methods=["GET", "POST", "DELETE"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_gemini", "Gemini Batch Mode stand-in for tests.")
    parser.add_argument("--max-requests", type=int, default=None, help="requests per batch at most (tests)")
    args = parser.parse_args()
    serve(build_app(GeminiStub(args.batch_delay, args.api_key, args.max_requests)), args)


if __name__ == "__main__":
    main()
