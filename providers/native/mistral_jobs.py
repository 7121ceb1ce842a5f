"""Mistral's batch jobs (`UpstreamJobs`): LiteLLM's file and batch functions, Mistral's line form.

A Mistral job runs one model, named on the job, over an uploaded JSONL file whose lines are
`{custom_id, body}` (no url, no method). LiteLLM 1.110.2 uploads (`acreate_file`), creates and polls
(`acreate_batch`/`aretrieve_batch`, which need the `model` to load Mistral's config); it does not cancel
or list Mistral jobs and reads their files only whole, so those go over HTTP with LiteLLM's own Mistral URL
and header helpers, the files streamed. Output and error files are already OpenAI-shaped.

Limits (Mistral's docs): up to 1,000,000 requests per job; uploads up to 512 MB. A job that fails or runs
past its timeout (`FAILED`, `TIMEOUT_EXCEEDED`) leaves the lines it did not answer with that status,
lower-cased, as their error code.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.log_safe import escaped
from providers.native.contract import QUIET_POLL, JobState, Save, UpstreamJobs, http_json, http_lines
from providers.native.openai_format import (
    Part,
    call_with_retries,
    detached,
    upstream_custom_id,
)
from providers.upstream_errors import batch_error_message

log = logging.getLogger("batchyard.native")

# Mistral's job statuses where it stopped short on its own (what LiteLLM reads as failed and expired).
_SHORT = {"failed": "failed", "expired": "timeout_exceeded"}


class MistralJobs(UpstreamJobs):
    """`mistral/` deployments: chat completions and embeddings as Mistral batch jobs."""

    providers = ("mistral",)
    endpoints = frozenset({Endpoint.CHAT, Endpoint.EMBEDDINGS})

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        super().__init__(litellm, provider, model, kwargs, info)
        self._job_kwargs = {**kwargs, "model": f"mistral/{model}"}

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def line(self, req: BatchRequest) -> bytes:
        body = {k: v for k, v in req.body.items() if k != "model"}  # the job names the model
        entry = {"custom_id": upstream_custom_id(req.line), "body": body}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def reject(self, req: BatchRequest) -> Result | None:
        return None

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        litellm = self._litellm
        if part.file_id is None:
            upload = await call_with_retries(lambda: litellm.acreate_file(
                file=(name, data), purpose="batch", **self._kwargs))
            part.file_id = str(upload.id)
            await save()
        file_id = part.file_id
        job = await call_with_retries(lambda: litellm.acreate_batch(
            completion_window="24h", endpoint=part.endpoint, input_file_id=file_id, metadata=metadata,
            **self._job_kwargs))
        part.batch_id = str(job.id)

    # -- plain HTTP for what LiteLLM does not do -----------------------------------------------------

    def _http(self) -> tuple[str, dict[str, str]]:
        from litellm.llms.mistral.common_utils import get_mistral_api_base, get_mistral_auth_headers

        return get_mistral_api_base(self._kwargs.get("api_base")), get_mistral_auth_headers({}, self._kwargs.get(
            "api_key"))

    async def find(self, part: Part) -> bool:
        """The newest jobs of this model: the one made from the part's file is the part's job."""
        base, headers = self._http()
        try:
            page = await http_json("GET", f"{base}/v1/batch/jobs", headers, self._kwargs.get("timeout"),
                                   params={"model": self._model, "page_size": "100"})
        except Exception:
            return False
        for job in page.get("data") or []:
            if part.file_id in (job.get("input_files") or []):
                part.batch_id = str(job["id"])
                return True
        return False

    async def cancel(self, batch_id: str) -> None:
        base, headers = self._http()
        quoted = urllib.parse.quote(batch_id, safe="")
        await http_json("POST", f"{base}/v1/batch/jobs/{quoted}/cancel", headers, self._kwargs.get("timeout"))

    # -- poll and read --------------------------------------------------------------------------------

    async def retrieve(self, batch_id: str) -> JobState:
        job = await detached(self._litellm.aretrieve_batch(batch_id=batch_id, litellm_metadata=QUIET_POLL,
                                                                  **self._job_kwargs))
        status = str(job.status)
        files = [str(f) for f in (job.output_file_id, job.error_file_id) if f]
        why = batch_error_message(job) if status in ("failed", "expired") else ""
        return JobState(status=status, files=files, why=why, code=_SHORT.get(status))

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        from litellm.llms.mistral.files.transformation import MistralFilesConfig

        _, headers = self._http()
        for file_id in state.files:
            # LiteLLM's `afile_content` reads a Mistral file whole; streamed, memory stays flat (1,000,000 lines).
            url, _ = MistralFilesConfig().transform_file_content_request(
                {"file_id": file_id}, {}, {"api_base": self._kwargs.get("api_base")})
            async for raw in http_lines(url, headers, self._kwargs.get("timeout")):
                try:
                    obj = json.loads(raw)
                except ValueError:
                    log.warning("native: Mistral file %s: a result line is not JSON", escaped(file_id))
                    continue
                yield _openai_error_shape(obj)


def _openai_error_shape(obj: dict[str, Any]) -> dict[str, Any]:
    """Mistral's error replies are flat (`{object: "error", message, type, param, code}`): OpenAI nests them
    under `error`, which is what callers of an OpenAI-shaped batch read."""
    response = obj.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    failed = isinstance(response, dict) and int(response.get("status_code") or 200) >= 400
    if failed and isinstance(body, dict) and "error" not in body:
        code = body.get("code")
        error = {"message": str(body.get("message") or body.get("detail") or ""),
                 "type": str(body.get("type") or "invalid_request_error"), "param": body.get("param"),
                 "code": None if code is None else str(code)}
        obj = {**obj, "response": {**(response or {}), "body": {"error": error}}}
    return obj
