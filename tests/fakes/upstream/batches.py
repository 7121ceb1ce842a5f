"""The loopback upstream's Files and Batches API (`FilesAndBatches`, mixed into the server).

Under `/v1`, `/openai` (`?api-version=`) and `/openai/v1`. A batch goes
validating -> in_progress -> finalizing -> completed within `--batch-delay`
seconds; its lines are answered by the server's one handler (`execute`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.fakes.upstream.replies import (
    ApiError,
    _dumps,
    _id,
    _invalid,
    _loads,
    _missing,
    _now,
    error_body,
    request_text,
)
from tests.fakes.upstream.state import (
    BATCH_ENDPOINTS,
    FILE_PURPOSES,
    JSON,
    BatchJob,
    Counters,
    Endpoint,
    Options,
    Reply,
    StoredFile,
    _add_usage,
    _batch_endpoint,
    _error,
    _json,
    _jsonl,
    _limit,
    _new_batch,
    _page,
    _parse_batch_lines,
    _poison,
)

_HANG_POLLS_RE = re.compile(rb"#batch:hangx(\d+)")
# How long a hung retrieve is held: longer than any test's route timeout (as the real-time `#hang`).
HANG_SECONDS = 3600.0


# batch endpoint (without a /v1 prefix) -> kind
class FilesAndBatches:
    """Files and Batches endpoints; the server class provides `execute` and `authorized`.

    What a host of OpenAI's format may do its own way (the Groq stand-in, `tests.fakes.stubs_groq`, sets them):
    `prefixes` (where the API is served), `batch_endpoints` (what a batch takes), `check_window` (the
    completion windows it takes) and `list_batches` (its paging)."""

    prefixes: tuple[str, ...] = ("/v1", "/openai", "/openai/v1")
    batch_endpoints: dict[str, str] = BATCH_ENDPOINTS

    def check_window(self, value: object) -> None:
        if value != "24h":
            raise _invalid("completion_window", "Invalid value for 'completion_window': only '24h' is supported.")

    options: Options
    counters: Counters
    files: dict[str, StoredFile]
    batches: dict[str, BatchJob]
    tasks: set[asyncio.Task[None]]

    def execute(self, kind: str, body: JSON, model: str, text: str) -> Reply:
        raise NotImplementedError

    def authorized(self, request: Request) -> bool:
        raise NotImplementedError


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
        endpoint, kind = _batch_endpoint(body.get("endpoint"), strict, self.batch_endpoints)
        self.check_window(body.get("completion_window"))
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
        if (hang := _HANG_POLLS_RE.search(stored.content)) is not None:
            job.hang_polls = int(hang.group(1))
        self.batches[job.obj["id"]] = job
        self.counters.batches_created += 1
        self._spawn(self._run_batch(job))
        return _json(job.obj)

    async def list_batches(self, request: Request) -> Response:
        items = [job.obj for job in reversed(self.batches.values())]
        params = request.query_params
        return _json(_page(items, params.get("after"), _limit(params.get("limit"), 20, 100)))

    async def get_batch(self, request: Request) -> Response:
        job = self._batch(request.path_params["batch_id"])
        if job.hang_polls > 0:  # a hung upstream: the request is read, no byte of a reply is sent
            job.hang_polls -= 1
            await asyncio.sleep(HANG_SECONDS)
        return _json(job.obj)

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
                billed = self.counters.billed.setdefault(line.model, {"input": 0, "output": 0})
                billed["input"] += int((reply.get("usage") or {}).get("prompt_tokens") or 0)
                billed["output"] += int((reply.get("usage") or {}).get("completion_tokens") or 0)
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

    def file_routes(self) -> list[Route]:
        routes: list[Route] = []
        for prefix in self.prefixes:
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
        return routes
