"""Together AI's Batch API (`UpstreamJobs`): an uploaded JSONL file of `{custom_id, body}` lines, one job over it.

Together's API is OpenAI's batch API with differences, each handled here (docs/native.md names them):
- the upload is `POST /v1/files/upload` (multipart `file`, `file_name`, `purpose=batch-api`, `file_type=jsonl`),
  not `POST /v1/files` with `purpose=batch`;
- a line is `{custom_id, body}` (no `method`, no `url`), the body naming the model;
- the create (`POST /v1/batches`: `endpoint`, `input_file_id`, `completion_window: 24h`, `model_id`) answers the job
  wrapped in `{"job": ..., "warning": ...}`; the retrieve answers it bare;
- statuses are upper case (`VALIDATING`, `IN_PROGRESS`, `COMPLETED`, `FAILED`, `EXPIRED`, `CANCELLED`), and a
  failed job's reason is its `error` string;
- `GET /v1/batches` lists every job as one JSON list (no paging): a restart finds a part's job by its input file.
Output lines are OpenAI's (`custom_id`, `response: {status_code, body}`); the error file's pair a custom_id with
an `error` (`message`, `code`). Both are read streamed from `GET /v1/files/{id}/content`.

LiteLLM 1.110.2 has no Together files or batches, so every call is plain HTTP; the base URL and the key are
LiteLLM's (`get_llm_provider`: `api_base`, else `TOGETHER_AI_API_BASE`, else `https://api.together.ai/v1`;
`api_key`, else `TOGETHER_API_KEY`...).

Limits (Together's batch overview): 50,000 requests and 100 MB per input file; a 24-hour window that cannot be
changed; the chat completions endpoint. Only some models are discounted in batches ("models not listed run at
standard rates"), so a real-time price is never halved into a batch price here (`batch_discount = None`).
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from gateway.domain import BatchRequest, Endpoint, Result
from gateway.log_safe import escaped
from providers.native.contract import (
    JobState,
    Save,
    UpstreamHTTPError,
    UpstreamJobs,
    http_json,
    http_lines,
    provider_client,
)
from providers.native.openai_format import Part, call_with_retries, upstream_custom_id
from providers.upstream_errors import error_message

log = logging.getLogger("batchyard.native")

# Together's job statuses in OpenAI's words (what the runner's TERMINAL and the missing-line errors read).
STATUSES = {"VALIDATING": "validating", "IN_PROGRESS": "in_progress", "COMPLETED": "completed", "FAILED": "failed",
            "EXPIRED": "expired", "CANCELLED": "cancelled"}


class TogetherJobs(UpstreamJobs):
    """`together_ai/` deployments: chat completions as Together batch jobs."""

    providers = ("together_ai",)
    endpoints = frozenset({Endpoint.CHAT})
    batch_discount = None  # some models only: a batch price is the map's or the config's, never a halved one

    def _http(self) -> tuple[str, dict[str, str]]:
        """(the API base, ending in /v1; the headers) as LiteLLM resolves them for a Together deployment."""
        _, _, key, base = self._litellm.get_llm_provider(
            model=f"together_ai/{self._model}", api_base=self._kwargs.get("api_base"),
            api_key=self._kwargs.get("api_key"))
        return str(base).rstrip("/"), {"Authorization": f"Bearer {key or ''}"}

    # -- lines ----------------------------------------------------------------------------------------

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def line(self, req: BatchRequest) -> bytes:
        entry = {"custom_id": upstream_custom_id(req.line), "body": {**req.body, "model": self._model}}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def reject(self, req: BatchRequest) -> Result | None:
        return None  # the body is Together's chat request as it is (the runner checked its fields)

    # -- the job ----------------------------------------------------------------------------------------

    async def _upload(self, name: str, data: bytes) -> str:
        base, headers = self._http()
        async with provider_client(self._kwargs.get("timeout")) as client:
            reply = await client.post(f"{base}/files/upload", headers=headers, files={"file": (name, data)},
                                      data={"purpose": "batch-api", "file_name": name, "file_type": "jsonl"})
        if reply.status_code >= 400:
            raise UpstreamHTTPError(reply.status_code, error_message(reply))
        return str(reply.json()["id"])

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        if part.file_id is None:
            part.file_id = await call_with_retries(lambda: self._upload(name, data))
            await save()
        base, headers = self._http()
        body = json.dumps({"endpoint": part.endpoint, "input_file_id": part.file_id, "completion_window": "24h",
                           "model_id": self._model}).encode()
        reply = await call_with_retries(lambda: http_json(
            "POST", f"{base}/batches", {**headers, "Content-Type": "application/json"}, self._kwargs.get("timeout"),
            content=body))
        job = reply.get("job") if isinstance(reply, dict) else None  # the create wraps the job
        part.batch_id = str((job or reply)["id"])
        if isinstance(reply, dict) and reply.get("warning"):
            log.info("Together batch %s: %s", escaped(part.batch_id), escaped(str(reply["warning"])))

    async def find(self, part: Part) -> bool:
        """The job made from the part's uploaded file, among every job Together lists."""
        base, headers = self._http()
        try:
            jobs = await http_json("GET", f"{base}/batches", headers, self._kwargs.get("timeout"))
        except Exception:
            return False
        for job in jobs if isinstance(jobs, list) else []:
            if isinstance(job, dict) and job.get("input_file_id") == part.file_id:
                part.batch_id = str(job["id"])
                return True
        return False

    async def retrieve(self, batch_id: str) -> JobState:
        base, headers = self._http()
        quoted = urllib.parse.quote(batch_id, safe="")
        job = await http_json("GET", f"{base}/batches/{quoted}", headers, self._kwargs.get("timeout"))
        raw = str(job.get("status") or "")
        status = STATUSES.get(raw, raw.lower())
        # A cancelled job still returns what it answered before the cancel: its files are read like any.
        files = [str(f) for f in (job.get("output_file_id"), job.get("error_file_id")) if f]
        why = str(job.get("error") or raw) if status in ("failed", "expired") else ""
        return JobState(status=status, files=files, why=why)

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        base, headers = self._http()
        for file_id in state.files:
            url = f"{base}/files/{urllib.parse.quote(file_id, safe='')}/content"
            async for raw in http_lines(url, headers, self._kwargs.get("timeout")):
                try:
                    obj = json.loads(raw)
                except ValueError:
                    log.warning("native: Together file %s: a result line is not JSON", escaped(file_id))
                    continue
                if isinstance(obj, dict):
                    yield obj

    async def cancel(self, batch_id: str) -> None:
        base, headers = self._http()
        quoted = urllib.parse.quote(batch_id, safe="")
        await http_json("POST", f"{base}/batches/{quoted}/cancel", headers, self._kwargs.get("timeout"))


__all__ = ["STATUSES", "TogetherJobs"]
