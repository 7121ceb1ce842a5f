"""A stand-in for xAI's Batch API on loopback (`python -m tests.fakes.stubs_xai`).

Written from xAI's batch guide and REST reference (docs.x.ai: "Batch API", files), strict where they are:
- `Authorization: Bearer <key>`; errors `{"code", "error"}` with 400, 401, 404.
- `POST /v1/files`, multipart: `file` required, `purpose` optional (stored as given); at most 48 MB. A file object
  `{id, bytes, created_at, filename, purpose}`; `GET /v1/files/{id}/content` its bytes.
- `POST /v1/batches` `{name}` required, `input_file_id` optional: a batch (with the file's requests when given:
  OpenAI's lines, `{custom_id, method: POST, url: /v1/chat/completions, body}`, the custom_id becoming the
  request's `batch_request_id`). A file xAI cannot read cancels the batch itself: `cancel_time` and
  `cancel_by_xai_message` set, nothing run. One batch created a second at most per team: 429 past it (the
  stand-in counts creates within `--create-window` seconds, 0 to turn off).
- `POST /v1/batches/{id}/requests` `{batch_requests: [{batch_request_id, batch_request: {chat_get_completion:
  {...}}}]}`: requests added to a named batch; at most 25 MB a call.
- A batch: `{batch_id, name, create_time, expire_time, cancel_time, cancel_by_xai_message, state: {num_requests,
  num_pending, num_success, num_error, num_cancelled}, input_file_id}`: counters, no status.
- `GET /v1/batches/{id}`; `GET /v1/batches?limit&pagination_token` `{batches, pagination_token}` (newest first);
  `GET /v1/batches/{id}/results?limit&pagination_token` `{results: [{batch_request_id, batch_result: {response:
  {chat_get_completion: <chat.completion>}} | {error: {code, message}}}], pagination_token}` (the answered ones,
  pages of `limit`, at most 1,000 or `--max-page`); `POST /v1/batches/{id}:cancel`: the pending requests cancelled.

Requests are answered `--batch-delay` seconds after they are added, "echo: <last user text>" (tokens: whitespace
words). `#fail:CODE` in a request's text makes it an error result with that code; `#batch:unreadable` anywhere in
a file makes xAI refuse it (the batch cancelled by xAI).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
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

MAX_FILE_BYTES = 48 * 1024 * 1024
MAX_ADD_BYTES = 25 * 1024 * 1024
MAX_PAGE = 1000


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _iso(offset_hours: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(hours=offset_hours)).isoformat().replace("+00:00", "Z")


@dataclass
class Batch:
    obj: dict[str, Any]
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch_request_id -> chat request
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # batch_request_id -> batch_result
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class XAIStub:
    def __init__(self, batch_delay: float, api_key: str | None, create_window: float, max_page: int) -> None:
        self.batch_delay, self.api_key, self.create_window = batch_delay, api_key, create_window
        self.max_page = max_page
        self.files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.batches: dict[str, Batch] = {}
        self.counters: Counter[str] = Counter()
        self.created_at: list[float] = []

    async def dispatch(self, request: Request) -> Response:
        try:
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer ") or (self.api_key is not None and auth[7:] != self.api_key):
                raise ApiError(401, "Incorrect API key provided")
            path, method = request.url.path.rstrip("/"), request.method
            if path == "/v1/files" and method == "POST":
                return await self.upload(request)
            if path.startswith("/v1/files/") and path.endswith("/content") and method == "GET":
                return self.content(path.removeprefix("/v1/files/").removesuffix("/content"))
            if path == "/v1/batches":
                return await self.create(request) if method == "POST" else self.list(request)
            rest = path.removeprefix("/v1/batches/")
            if rest != path and method == "POST" and rest.endswith(":cancel"):
                return self.cancel(self._batch(rest.removesuffix(":cancel")))
            if rest != path and method == "POST" and rest.endswith("/requests"):
                return await self.add(request, self._batch(rest.removesuffix("/requests")))
            if rest != path and method == "GET" and rest.endswith("/results"):
                return self.results(request, self._batch(rest.removesuffix("/results")))
            if rest != path and method == "GET":
                return JSONResponse(self._view(self._batch(rest)))
            raise ApiError(404, f"No route for {method} {path}")
        except ApiError as exc:
            return JSONResponse({"code": "Client specified an invalid argument" if exc.status == 400 else
                                 str(exc.status), "error": exc.message}, status_code=exc.status)

    def _batch(self, batch_id: str) -> Batch:
        batch = self.batches.get(batch_id)
        if batch is None:
            raise ApiError(404, f"Batch {batch_id} not found")
        return batch

    def _view(self, batch: Batch) -> dict[str, Any]:
        pending = sum(1 for rid in batch.requests if rid not in batch.results)
        kinds = Counter("error" if "error" in r else "cancelled" if r.get("cancelled") else "success"
                        for r in batch.results.values())
        state = {"num_requests": len(batch.requests), "num_pending": pending, "num_success": kinds["success"],
                 "num_error": kinds["error"], "num_cancelled": kinds["cancelled"]}
        return {**batch.obj, "state": state}

    # -- files ----------------------------------------------------------------------------------------

    async def upload(self, request: Request) -> Response:
        form = await request.form(max_part_size=MAX_FILE_BYTES + 1)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "file: field required")
        data = await upload.read()
        if len(data) > MAX_FILE_BYTES:
            raise ApiError(400, f"file: larger than {MAX_FILE_BYTES} bytes")
        purpose = form.get("purpose")
        obj = {"id": "file_" + str(uuid.uuid4()), "bytes": len(data), "created_at": int(time.time()),
               "filename": upload.filename or "", "purpose": purpose if isinstance(purpose, str) else ""}
        self.files[obj["id"]] = (obj, data)
        self.counters["uploads"] += 1
        return JSONResponse(obj)

    def content(self, file_id: str) -> Response:
        if file_id not in self.files:
            raise ApiError(404, f"File {file_id} not found")
        return Response(self.files[file_id][1], media_type="application/octet-stream")

    # -- batches ----------------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        body = await _json(request)
        if not isinstance(body.get("name"), str) or not body["name"]:
            raise ApiError(400, "name: field required")
        unknown = sorted(set(body) - {"name", "input_file_id"})
        if unknown:
            raise ApiError(400, f"{unknown[0]}: unknown field")
        now = time.monotonic()
        self.created_at = [t for t in self.created_at if now - t < self.create_window]
        if self.create_window and self.created_at:
            raise ApiError(429, "Batch creation is limited to 1 per second per team")
        self.created_at.append(now)
        file_id = body.get("input_file_id")
        if file_id is not None and file_id not in self.files:
            raise ApiError(404, f"File {file_id} not found")
        batch_id = "batch_" + str(uuid.uuid4())
        batch = self.batches[batch_id] = Batch({
            "batch_id": batch_id, "name": body["name"], "create_time": _iso(), "expire_time": _iso(24),
            "cancel_time": None, "cancel_by_xai_message": None, "input_file_id": file_id})
        self.counters["batches_created"] += 1
        if file_id is not None:
            try:
                self._enqueue(batch, _file_requests(self.files[file_id][1]))
            except ApiError as exc:
                batch.obj.update(cancel_time=_iso(), cancel_by_xai_message=exc.message)
        return JSONResponse(self._view(batch))

    async def add(self, request: Request, batch: Batch) -> Response:
        raw = await request.body()
        if len(raw) > MAX_ADD_BYTES:
            raise ApiError(400, f"the payload is larger than {MAX_ADD_BYTES} bytes")
        items = (await _json(request)).get("batch_requests")
        if not isinstance(items, list):
            raise ApiError(400, "batch_requests: field required")
        requests = {}
        for item in items:
            chat = ((item or {}).get("batch_request") or {}).get("chat_get_completion")
            if not isinstance(item.get("batch_request_id"), str) or not isinstance(chat, dict):
                raise ApiError(400, "batch_requests: each needs batch_request_id and batch_request.chat_get_completion")
            requests[item["batch_request_id"]] = chat
        self._enqueue(batch, requests)
        return JSONResponse({})

    def _enqueue(self, batch: Batch, requests: dict[str, dict[str, Any]]) -> None:
        if batch.obj["cancel_time"] is not None:
            raise ApiError(400, f"Batch {batch.obj['batch_id']} is cancelled")
        dup = next((rid for rid in requests if rid in batch.requests), None)
        if dup is not None:
            raise ApiError(400, f"batch_request_id {dup!r} is already in the batch")
        batch.requests.update(requests)
        self.counters["batch_lines"] += len(requests)
        batch.tasks.append(asyncio.get_running_loop().create_task(self._run(batch, list(requests))))

    async def _run(self, batch: Batch, ids: list[str]) -> None:
        await asyncio.sleep(self.batch_delay)
        for rid in ids:
            if rid in batch.results:
                continue
            result = batch.results[rid] = _answer(batch.requests[rid])
            bill(self.counters, ((result.get("response") or {}).get("chat_get_completion") or {}).get("usage"))

    def cancel(self, batch: Batch) -> Response:
        if batch.obj["cancel_time"] is None:
            self.counters["cancels"] += 1
            batch.obj["cancel_time"] = _iso()
            for task in batch.tasks:
                task.cancel()
            for rid in batch.requests:
                batch.results.setdefault(rid, {"cancelled": True})
        return JSONResponse(self._view(batch))

    def list(self, request: Request) -> Response:
        limit, start = _page(request, self.max_page)
        ordered = list(reversed(self.batches.values()))
        page = ordered[start:start + limit]
        token = str(start + limit) if start + limit < len(ordered) else None
        return JSONResponse({"batches": [self._view(b) for b in page], "pagination_token": token})

    def results(self, request: Request, batch: Batch) -> Response:
        limit, start = _page(request, self.max_page)
        answered = [(rid, r) for rid, r in batch.results.items() if not r.get("cancelled")]
        page = answered[start:start + limit]
        token = str(start + limit) if start + limit < len(answered) else None
        self.counters["result_pages"] += 1
        return JSONResponse({"results": [{"batch_request_id": rid, "batch_result": r} for rid, r in page],
                             "pagination_token": token})

    def stats(self) -> dict[str, Any]:
        return dict(self.counters)

    def reset(self) -> None:
        self.counters.clear()


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise ApiError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be an object")
    return body


def _page(request: Request, max_page: int) -> tuple[int, int]:
    try:
        limit = int(request.query_params.get("limit") or 100)
        start = int(request.query_params.get("pagination_token") or 0)
    except ValueError:
        raise ApiError(400, "limit and pagination_token must be what this API gave") from None
    return max(1, min(limit, max_page)), start


def _file_requests(data: bytes) -> dict[str, dict[str, Any]]:
    if b"#batch:unreadable" in data:
        raise ApiError(400, "The input file could not be read (#batch:unreadable directive).")
    requests: dict[str, dict[str, Any]] = {}
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        item = json.loads(raw)
        if item.get("method") != "POST" or item.get("url") != "/v1/chat/completions" or not isinstance(
                item.get("body"), dict) or not isinstance(item.get("custom_id"), str):
            raise ApiError(400, f"line {number}: a line is {{custom_id, method: POST, url: /v1/chat/completions, "
                                "body}")
        if item["custom_id"] in requests:
            raise ApiError(400, f"line {number}: duplicate custom_id")
        requests[item["custom_id"]] = item["body"]
    if not requests:
        raise ApiError(400, "the input file has no requests")
    return requests


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    text = last_user_text(body.get("messages"))
    failure = directive(text, "fail")
    if failure is not None:
        return {"error": {"code": failure or "error", "message": f"Request failed (#fail:{failure} directive)."}}
    reply = f"echo: {text}"
    prompt = sum(words(text_of(m.get("content"))) for m in body.get("messages") or [])
    usage = {"prompt_tokens": prompt, "completion_tokens": words(reply), "total_tokens": prompt + words(reply)}
    return {"response": {"chat_get_completion": {
        "id": "chatcmpl-" + secrets.token_hex(8), "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model"), "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                                "finish_reason": "stop"}], "usage": usage}}}


def build_app(stub: XAIStub) -> Starlette:
    return Starlette(routes=[
        *control_routes(stub),
        Route("/v1/{rest:path}", stub.dispatch, methods=["GET", "POST"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_xai", "xAI Batch API stand-in for tests.")
    parser.add_argument("--create-window", type=float, default=0.0,
                        help="seconds within which a second batch create is refused (xAI: 1; default 0: off)")
    parser.add_argument("--max-page", type=int, default=MAX_PAGE, help="results and batches per page at most")
    args = parser.parse_args()
    serve(build_app(XAIStub(args.batch_delay, args.api_key, args.create_window, args.max_page)), args)


if __name__ == "__main__":
    main()
