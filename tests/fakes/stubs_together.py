"""A stand-in for Together AI's Batch API on loopback (`python -m tests.fakes.stubs_together`).

Written from Together's reference (docs.together.ai: "Upload a file", "Create a batch job", "Manage batch jobs",
the batch overview's limits), strict where it is:
- `Authorization: Bearer <key>`; errors `{"error": {"message", "type", "param", "code"}}` with 400, 401, 404.
- `POST /v1/files/upload`, multipart: `purpose` (one of Together's: `batch-api` for a batch), `file_name` and
  `file` required, `file_type` `jsonl` (default), `csv` or `parquet`; at most 100 MB. It answers a file object
  (`id`, `object`, `created_at`, `filename`, `bytes`, `purpose`, `Processed`, `FileType`, `LineCount`).
  OpenAI's `POST /v1/files` is not Together's upload: 404. `GET /v1/files/{id}/content`: the file's bytes.
- `POST /v1/batches` `{endpoint, input_file_id}` required, `completion_window` (only `24h`), `priority` (an int),
  `model_id`; anything else 400. Answered 201 with the job wrapped: `{"job": {...}, "warning": null}`.
  `GET /v1/batches/{id}` answers the job itself (no wrapper); `GET /v1/batches` a JSON list of jobs;
  `POST /v1/batches/{id}/cancel` while `VALIDATING` or `IN_PROGRESS` (else 400).
- A job: `id` (a UUID), `user_id`, `input_file_id`, `file_size_bytes`, `status` in upper case (`VALIDATING` ->
  `IN_PROGRESS` -> `COMPLETED`; `FAILED`, `EXPIRED`, `CANCELLED`), `job_deadline`, `created_at`, `endpoint`,
  `progress` (0 to 100), `model_id`, `output_file_id`, `error_file_id`, `error`, `completed_at`.
- Input lines: `{custom_id, body}` only (custom_id a string of at most 64 characters, unique in the file;
  body a chat request with `model` and `messages`); at most 50,000 lines (`--max-requests` lowers it) and one
  endpoint, `/v1/chat/completions`. A file that breaks these fails its job in validation (`FAILED`, `error`).
- Output lines (answered requests, in no particular order): `{"id", "custom_id", "response": {"status_code",
  "body"}}`, the body a `chat.completion`; error lines (a file of their own): `{"id", "custom_id", "error":
  {"message", "code"}}`.

A job ends `--batch-delay` seconds after validation, each request answered "echo: <last user text>" (tokens:
whitespace words). Directives in a request's text: `#fail:CODE` puts that request in the error file with CODE;
`#batch:fail` fails the job (`FAILED`, no results), `#batch:expire` expires it (`EXPIRED`, no results).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections import Counter
from dataclasses import dataclass
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

MAX_REQUESTS = 50_000
MAX_BYTES = 100 * 1024 * 1024
PURPOSES = ("fine-tune", "eval", "eval-sample", "eval-output", "eval-summary", "batch-generated", "batch-api")
FILE_TYPES = ("jsonl", "csv", "parquet")
CREATE_FIELDS = {"endpoint", "input_file_id", "completion_window", "priority", "model_id"}
ENDPOINTS = ("/v1/chat/completions",)


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse({"error": {"message": exc.message, "type": exc.type, "param": None, "code": None}},
                        status_code=exc.status)


def _iso(offset_hours: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(hours=offset_hours)).isoformat().replace("+00:00", "Z")


@dataclass
class StoredFile:
    obj: dict[str, Any]
    data: bytes


class TogetherStub:
    def __init__(self, batch_delay: float, api_key: str | None, max_requests: int) -> None:
        self.batch_delay, self.api_key, self.max_requests = batch_delay, api_key, max_requests
        self.files: dict[str, StoredFile] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.counters: Counter[str] = Counter()

    def _check(self, request: Request) -> None:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:]:
            raise ApiError(401, "Missing or invalid Authorization header", "authentication_error")
        if self.api_key is not None and auth[7:] != self.api_key:
            raise ApiError(401, "Invalid API key provided", "authentication_error")

    async def dispatch(self, request: Request) -> Response:
        try:
            self._check(request)
            path, method = request.url.path.rstrip("/"), request.method
            if path == "/v1/files/upload" and method == "POST":
                return await self.upload(request)
            if path.startswith("/v1/files/") and path.endswith("/content") and method == "GET":
                return self.content(path.removeprefix("/v1/files/").removesuffix("/content"))
            if path == "/v1/batches":
                return await self.create(request) if method == "POST" else JSONResponse(
                    list(reversed(self.jobs.values())))
            if path.startswith("/v1/batches/") and path.endswith("/cancel") and method == "POST":
                return self.cancel(self._job(path.removeprefix("/v1/batches/").removesuffix("/cancel")))
            if path.startswith("/v1/batches/") and method == "GET":
                return JSONResponse(self._job(path.removeprefix("/v1/batches/")))
            raise ApiError(404, f"Not found: {method} {path}", "not_found")
        except ApiError as exc:
            return _error(exc)

    def _job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"Batch job {job_id} not found", "not_found")
        return job

    # -- files -------------------------------------------------------------------------------------

    async def upload(self, request: Request) -> Response:
        form = await request.form(max_part_size=MAX_BYTES + 1)
        purpose, name, file_type = form.get("purpose"), form.get("file_name"), form.get("file_type") or "jsonl"
        upload = form.get("file")
        if purpose not in PURPOSES:
            raise ApiError(400, f"purpose: must be one of {', '.join(PURPOSES)}")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "file_name: field required")
        if file_type not in FILE_TYPES:
            raise ApiError(400, f"file_type: must be one of {', '.join(FILE_TYPES)}")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "file: field required")
        data = await upload.read()
        if len(data) > MAX_BYTES:
            raise ApiError(400, f"file: larger than {MAX_BYTES} bytes")
        file_id = "file-" + str(uuid.uuid4())
        obj = {"id": file_id, "object": "file", "created_at": int(time.time()), "filename": name,
               "bytes": len(data), "purpose": purpose, "Processed": True, "FileType": file_type,
               "LineCount": sum(1 for line in data.splitlines() if line.strip())}
        self.files[file_id] = StoredFile(obj, data)
        self.counters["uploads"] += 1
        self.counters[f"purpose:{purpose}"] += 1
        return JSONResponse(obj)

    def content(self, file_id: str) -> Response:
        stored = self.files.get(file_id)
        if stored is None:
            raise ApiError(404, f"File {file_id} not found", "not_found")
        return Response(stored.data, media_type="application/octet-stream")

    def _output(self, lines: list[dict[str, Any]], kind: str) -> str | None:
        if not lines:
            return None
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        file_id = "file-" + str(uuid.uuid4())
        self.files[file_id] = StoredFile({"id": file_id, "object": "file", "created_at": int(time.time()),
                                          "filename": f"{kind}.jsonl", "bytes": len(data),
                                          "purpose": "batch-generated", "Processed": True, "FileType": "jsonl",
                                          "LineCount": len(lines)}, data)
        return file_id

    # -- jobs ----------------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise ApiError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be an object")
        unknown = sorted(set(body) - CREATE_FIELDS)
        if unknown:
            raise ApiError(400, f"{unknown[0]}: unknown field")
        for name in ("endpoint", "input_file_id"):
            if not isinstance(body.get(name), str):
                raise ApiError(400, f"{name}: field required")
        if body.get("completion_window", "24h") != "24h":
            raise ApiError(400, "completion_window: only 24h is supported")
        if "priority" in body and type(body["priority"]) is not int:
            raise ApiError(400, "priority: must be an integer")
        if body["endpoint"] not in ENDPOINTS:
            raise ApiError(400, f"endpoint: {body['endpoint']} is not supported for batches")
        stored = self.files.get(body["input_file_id"])
        if stored is None:
            raise ApiError(404, f"File {body['input_file_id']} not found", "not_found")
        if stored.obj["purpose"] != "batch-api":
            raise ApiError(400, f"input_file_id: the file's purpose is {stored.obj['purpose']}, not batch-api")
        job_id = str(uuid.uuid4())
        job = {"id": job_id, "user_id": "user_stub", "input_file_id": stored.obj["id"],
               "file_size_bytes": stored.obj["bytes"], "status": "VALIDATING", "job_deadline": _iso(24),
               "created_at": _iso(), "endpoint": body["endpoint"], "progress": 0,
               "model_id": body.get("model_id"), "output_file_id": None, "error_file_id": None, "error": None,
               "completed_at": None}
        self.jobs[job_id] = job
        self.counters["batches_created"] += 1
        self.tasks[job_id] = asyncio.get_running_loop().create_task(self._run(job, stored.data))
        return JSONResponse({"job": job, "warning": None}, status_code=201)

    def cancel(self, job: dict[str, Any]) -> Response:
        if job["status"] not in ("VALIDATING", "IN_PROGRESS"):
            raise ApiError(400, f"Batch job {job['id']} is {job['status']} and cannot be cancelled")
        task = self.tasks.pop(job["id"], None)
        if task is not None:
            task.cancel()
        self.counters["cancels"] += 1
        job.update(status="CANCELLED", completed_at=_iso())
        return JSONResponse(job)

    async def _run(self, job: dict[str, Any], data: bytes) -> None:
        await asyncio.sleep(min(0.1, self.batch_delay))
        try:
            requests = _validate(data, self.max_requests, job["model_id"])
        except ApiError as exc:
            job.update(status="FAILED", error=exc.message, completed_at=_iso())
            return
        job["status"] = "IN_PROGRESS"
        self.counters["batch_lines"] += len(requests)
        await asyncio.sleep(self.batch_delay)
        text = json.dumps(requests)
        if "#batch:fail" in text or "#batch:expire" in text:
            failed = "#batch:fail" in text
            job.update(status="FAILED" if failed else "EXPIRED", completed_at=_iso(),
                       error="The batch failed (#batch:fail directive)." if failed else None)
            return
        outputs, errors = [], []
        for item in requests:
            answer = _answer(item["body"])
            if "error" in answer:
                errors.append({"id": "req_" + secrets.token_hex(8), "custom_id": item["custom_id"], **answer})
            else:
                bill(self.counters, answer["usage"])
                outputs.append({"id": "req_" + secrets.token_hex(8), "custom_id": item["custom_id"],
                                "response": {"status_code": 200, "body": answer}})
        job.update(status="COMPLETED", progress=100, completed_at=_iso(),
                   output_file_id=self._output(outputs, "output"), error_file_id=self._output(errors, "errors"))
        self.tasks.pop(job["id"], None)

    def stats(self) -> dict[str, Any]:
        return dict(self.counters)

    def reset(self) -> None:
        self.counters.clear()


def _validate(data: bytes, max_requests: int, model_id: str | None) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:
            raise ApiError(400, f"line {number}: not JSON") from None
        if not isinstance(item, dict) or set(item) != {"custom_id", "body"}:
            raise ApiError(400, f"line {number}: a request line has exactly custom_id and body")
        custom_id, body = item["custom_id"], item["body"]
        if not isinstance(custom_id, str) or not 0 < len(custom_id) <= 64:
            raise ApiError(400, f"line {number}: custom_id must be a string of at most 64 characters")
        if custom_id in seen:
            raise ApiError(400, f"line {number}: duplicate custom_id {custom_id!r}")
        seen.add(custom_id)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not isinstance(
                body.get("messages"), list):
            raise ApiError(400, f"line {number}: body needs model and messages")
        if model_id is not None and body["model"] != model_id:
            raise ApiError(400, f"line {number}: model {body['model']} is not the job's {model_id}")
        requests.append(item)
    if not requests:
        raise ApiError(400, "the input file has no requests")
    if len(requests) > max_requests:
        raise ApiError(400, f"the input file has {len(requests)} requests; a batch takes at most {max_requests}")
    return requests


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    text = last_user_text(body["messages"])
    failure = directive(text, "fail")
    if failure is not None:
        return {"error": {"message": f"Request failed (#fail:{failure} directive).", "code": failure or "error"}}
    reply = f"echo: {text}"
    prompt = sum(words(text_of(m.get("content"))) for m in body["messages"])
    usage = {"prompt_tokens": prompt, "completion_tokens": words(reply), "total_tokens": prompt + words(reply)}
    return {"id": "chatcmpl-" + secrets.token_hex(8), "object": "chat.completion", "created": int(time.time()),
            "model": body["model"], "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                                 "finish_reason": "stop"}], "usage": usage}


def build_app(stub: TogetherStub) -> Starlette:
    return Starlette(routes=[
        *control_routes(stub),
        Route("/v1/{rest:path}", stub.dispatch, methods=["GET", "POST"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_together", "Together AI Batch API stand-in for tests.")
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS, help="requests per batch at most")
    args = parser.parse_args()
    serve(build_app(TogetherStub(args.batch_delay, args.api_key, args.max_requests)), args)


if __name__ == "__main__":
    main()
