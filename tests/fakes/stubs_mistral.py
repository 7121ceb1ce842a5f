"""A stand-in for Mistral's Files and Batch APIs on loopback (`python -m tests.fakes.stubs_mistral`).

The shape follows Mistral's public API reference: `Authorization: Bearer`; `POST /v1/files` (multipart
`file`, `purpose` one of batch, fine-tune, ocr) and `GET /v1/files/{id}/content`; `POST /v1/batch/jobs`
with `{"input_files": [...], "endpoint", "model", "metadata", "timeout_hours"}`; `GET /v1/batch/jobs[/{id}]`
(the list: `{"data", "object": "list", "total"}`, filtered by `model`); `POST /v1/batch/jobs/{id}/cancel`.
A job's status goes QUEUED → RUNNING → SUCCESS (or FAILED, TIMEOUT_EXCEEDED; cancel:
CANCELLATION_REQUESTED → CANCELLED), with request counts, `output_file`, `error_file` and
`errors: [{"message", "count"}]`. Input lines are `{"custom_id", "body"}` (the job names the model);
output lines `{"id", "custom_id", "response": {"status_code", "body"}, "error"}`. Errors:
`{"object": "error", "message", "type", "param", "code"}` (401, 404, 422 for a bad body or input line).
Limits: 1,000,000 requests per job (`--max-requests` lowers it for tests), 512 MB per file.

A job ends `--batch-delay` seconds after creation: chat lines are answered "echo: <last user text>",
embeddings lines with an 8-dim vector (tokens: whitespace words). Directives in a line's text:
`#fail:CODE` answers that line with HTTP CODE (into the error file); `#batch:fail` makes the job FAILED,
`#batch:expire` TIMEOUT_EXCEEDED, with no line answered.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import bill, control_routes, directive, last_user_text, serve, stub_arguments, words

MAX_REQUESTS = 1_000_000
MAX_FILE_BYTES = 512 * 1024 * 1024
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/fim/completions", "/v1/moderations", "/v1/ocr")


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param


@dataclass
class Job:
    obj: dict[str, Any]
    lines: list[dict[str, Any]]
    task: asyncio.Task[None] | None = None


class MistralStub:
    def __init__(self, batch_delay: float, api_key: str | None, max_requests: int) -> None:
        self.batch_delay, self.api_key, self.max_requests = batch_delay, api_key, max_requests
        self.files: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.jobs: dict[str, Job] = {}
        self.counters: Counter[str] = Counter()
        self.by_model: Counter[str] = Counter()

    async def handle(self, request: Request) -> Response:
        try:
            auth = request.headers.get("authorization", "")
            if not auth.startswith("Bearer ") or (self.api_key is not None and auth[7:] != self.api_key):
                return JSONResponse({"message": "Unauthorized", "request_id": uuid.uuid4().hex}, status_code=401)
            path, method = request.url.path.rstrip("/"), request.method
            if path == "/v1/files":
                return await self.upload(request)
            if path.startswith("/v1/files/"):
                return Response(self._file(request.path_params["file_id"])[1], media_type="application/octet-stream")
            if path == "/v1/batch/jobs":
                return await self.create(request) if method == "POST" else self.list(request)
            job = self._job(request.path_params["job_id"])
            return self.cancel(job) if path.endswith("/cancel") else JSONResponse(job.obj)
        except ApiError as exc:
            body = {"object": "error", "message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}
            return JSONResponse(body, status_code=exc.status)

    def _file(self, file_id: str) -> tuple[dict[str, Any], bytes]:
        found = self.files.get(file_id)
        if found is None:
            raise ApiError(404, f"File {file_id} not found", code="3002")
        return found

    def _job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"Batch job {job_id} not found", code="3002")
        return job

    async def upload(self, request: Request) -> Response:
        form = await request.form(max_part_size=MAX_FILE_BYTES)
        upload, purpose = form.get("file"), form.get("purpose") or "fine-tune"
        if not isinstance(upload, UploadFile):
            raise ApiError(422, "file: Field required", param="file")
        if purpose not in ("batch", "fine-tune", "ocr"):
            raise ApiError(422, f"purpose: Input should be 'fine-tune', 'batch' or 'ocr', got {purpose!r}",
                           param="purpose")
        data = await upload.read()
        if len(data) > MAX_FILE_BYTES:
            raise ApiError(413, f"File exceeds the maximum size of {MAX_FILE_BYTES} bytes")
        file_id = str(uuid.uuid4())
        obj = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
               "filename": upload.filename or "upload.jsonl", "purpose": purpose, "sample_type": "batch_request",
               "source": "upload", "num_lines": data.count(b"\n"), "mimetype": "application/jsonl"}
        self.files[file_id] = (obj, data)
        self.counters["files_created"] += 1
        return JSONResponse(obj)

    async def create(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(422, "The request body is not valid JSON.") from None
        files, endpoint, model = body.get("input_files"), body.get("endpoint"), body.get("model")
        if not isinstance(files, list) or not files:
            raise ApiError(422, "input_files: Field required", param="input_files")
        if endpoint not in ENDPOINTS:
            raise ApiError(422, f"endpoint: Input should be one of {', '.join(ENDPOINTS)}", param="endpoint")
        if not isinstance(model, str) or not model:
            raise ApiError(422, "model: a model is required for this endpoint", param="model")
        lines: list[dict[str, Any]] = []
        for file_id in files:
            for number, raw in enumerate(self._file(file_id)[1].splitlines(), 1):
                if raw.strip():
                    lines.append(_input_line(file_id, number, raw))
        if len(lines) > self.max_requests:
            raise ApiError(422, f"A batch job holds at most {self.max_requests} requests, got {len(lines)}",
                           param="input_files")
        job_id = str(uuid.uuid4())
        obj = {"id": job_id, "object": "batch", "input_files": files, "metadata": body.get("metadata") or {},
               "endpoint": endpoint, "model": model, "output_file": None, "error_file": None, "errors": [],
               "status": "QUEUED", "created_at": int(time.time()), "total_requests": len(lines),
               "completed_requests": 0, "succeeded_requests": 0, "failed_requests": 0, "started_at": None,
               "completed_at": None}
        job = self.jobs[job_id] = Job(obj, lines)
        self.counters["batches_created"] += 1
        self.counters["batch_requests"] += len(lines)
        self.by_model[model] += len(lines)
        job.task = asyncio.get_running_loop().create_task(self._run(job))
        return JSONResponse(obj)

    def list(self, request: Request) -> Response:
        model = request.query_params.get("model")
        data = [j.obj for j in reversed(self.jobs.values()) if model is None or j.obj["model"] == model]
        return JSONResponse({"data": data[: int(request.query_params.get("page_size", 100))], "object": "list",
                             "total": len(data)})

    def cancel(self, job: Job) -> Response:
        if job.obj["status"] in ("QUEUED", "RUNNING"):
            self.counters["cancels"] += 1
            job.obj["status"] = "CANCELLATION_REQUESTED"
            if job.task is not None:
                job.task.cancel()
            asyncio.get_running_loop().call_later(0.1, self._end, job, "CANCELLED")
        return JSONResponse(job.obj)

    async def _run(self, job: Job) -> None:
        await asyncio.sleep(self.batch_delay / 3)
        job.obj.update(status="RUNNING", started_at=int(time.time()))
        await asyncio.sleep(self.batch_delay * 2 / 3)
        text = json.dumps([line["body"] for line in job.lines])
        if "#batch:fail" in text:
            job.obj["errors"] = [{"message": "Job failed (#batch:fail directive).", "count": 1}]
            self._end(job, "FAILED")
            return
        if "#batch:expire" in text:
            self._end(job, "TIMEOUT_EXCEEDED")
            return
        ok, failed = [], []
        for line in job.lines:
            status, body = _answer(job.obj["endpoint"], job.obj["model"], line["body"])
            if status == 200:
                bill(self.counters, body.get("usage"))
            out = {"id": "batch-" + secrets.token_hex(6), "custom_id": line["custom_id"],
                   "response": {"status_code": status, "body": body}, "error": None}
            (ok if status == 200 else failed).append(json.dumps(out) + "\n")
        for lines, key in ((ok, "output_file"), (failed, "error_file")):
            if lines:
                file_id = str(uuid.uuid4())
                data = "".join(lines).encode()
                self.files[file_id] = ({"id": file_id, "object": "file", "bytes": len(data), "purpose": "batch",
                                        "filename": f"{job.obj['id']}_{key}.jsonl", "created_at": int(time.time())},
                                       data)
                job.obj[key] = file_id
        job.obj.update(completed_requests=len(job.lines), succeeded_requests=len(ok), failed_requests=len(failed))
        self._end(job, "SUCCESS")

    def _end(self, job: Job, status: str) -> None:
        if job.obj["status"] in ("SUCCESS", "FAILED", "TIMEOUT_EXCEEDED", "CANCELLED"):
            return
        job.obj.update(status=status, completed_at=int(time.time()))

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "by_model": dict(self.by_model)}

    def reset(self) -> None:
        self.files.clear()
        self.jobs.clear()
        self.counters.clear()
        self.by_model.clear()


def _input_line(file_id: str, number: int, raw: bytes) -> dict[str, Any]:
    try:
        line = json.loads(raw)
    except ValueError:
        raise ApiError(422, f"File {file_id}, line {number}: not valid JSON", param="input_files") from None
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str) or not isinstance(
            line.get("body"), dict):
        raise ApiError(422, f"File {file_id}, line {number}: each line needs a string custom_id and a body object",
                       param="input_files")
    return line


def _answer(endpoint: str, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    text = last_user_text(body.get("messages")) if endpoint == "/v1/chat/completions" else str(body.get("input"))
    code = directive(text, "fail")
    if code is not None and code.isdigit():
        return int(code), {"object": "error", "message": f"Request failed (#fail:{code} directive).",
                           "type": "invalid_request_error" if int(code) < 500 else "api_error", "param": None,
                           "code": code}
    if endpoint == "/v1/embeddings":
        inputs = body.get("input") if isinstance(body.get("input"), list) else [body.get("input")]
        data = [{"object": "embedding", "index": i, "embedding": _vector(str(t))} for i, t in enumerate(inputs)]
        tokens = sum(words(str(t)) for t in inputs)
        return 200, {"id": uuid.uuid4().hex, "object": "list", "model": model, "data": data,
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}
    reply = f"echo: {text}"
    prompt = sum(words(str(m.get("content"))) for m in body.get("messages") or [] if isinstance(m, dict))
    return 200, {"id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()), "model": model,
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": reply, "tool_calls": None},
                              "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": words(reply),
                           "total_tokens": prompt + words(reply)}}


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()[:8]
    raw = [b - 127.5 for b in digest]
    norm = sum(x * x for x in raw) ** 0.5 or 1.0
    return [round(x / norm, 6) for x in raw]


def build_app(stub: MistralStub) -> Starlette:
    return Starlette(routes=[
        *control_routes(stub),
        Route("/v1/files", stub.handle, methods=["POST"]),
        Route("/v1/files/{file_id}/content", stub.handle, methods=["GET"]),
        Route("/v1/batch/jobs", stub.handle, methods=["GET", "POST"]),
        Route("/v1/batch/jobs/{job_id}", stub.handle, methods=["GET"]),
        Route("/v1/batch/jobs/{job_id}/cancel", stub.handle, methods=["POST"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_mistral", "Mistral Files and Batch API stand-in for tests.")
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS, help="requests per job at most")
    args = parser.parse_args()
    serve(build_app(MistralStub(args.batch_delay, args.api_key, args.max_requests)), args)


if __name__ == "__main__":
    main()
