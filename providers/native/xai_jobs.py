"""xAI's Batch API (`UpstreamJobs`): an uploaded JSONL file in OpenAI's line form, one batch over it, its results
paged.

xAI's API is OpenAI's with differences (docs/native.md names them): the upload (`POST /v1/files`, multipart) takes
no purpose; the create (`POST /v1/batches`) names the batch (`name`) and its `input_file_id`; a batch has no status,
only counters (`state`: `num_requests`, `num_pending`, `num_success`, `num_error`, `num_cancelled`) and a
`cancel_time` (with `cancel_by_xai_message` when xAI itself refused the input); there is no output file: results
are paged from `GET /v1/batches/{id}/results` (`limit`, `pagination_token`), each `{batch_request_id,
batch_result: {response: {chat_get_completion: <chat.completion>}} or {error: {code, message}}}`, the request id
being the line's `custom_id`; cancel is `POST /v1/batches/{id}:cancel`; the list pages by `pagination_token`.

The pinned LiteLLM reaches xAI's files and batches: the upload, create, poll and cancel go through it (its
status rule: cancelled by xAI is `failed`, by us `cancelled`, no requests yet `validating`, some pending
`in_progress`, else `completed`). LiteLLM reads the results only whole (every page joined before it answers), so
they are paged here one page at a time with LiteLLM's own URL, header and line helpers, and the list (a restart's
search for a part's batch by its input file) is paged the same way.

Limits (xAI's docs): above 100,000 requests a batch may be throttled, and a file is at most 48 MB (xAI's pages say
48 or 50 MB: the lower); a batch runs within 24 hours.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

from gateway.domain import BatchRequest, Endpoint, Result
from providers.native.contract import QUIET_POLL, JobState, Save, UpstreamJobs, http_json
from providers.native.openai_format import Part, call_with_retries, detached, upstream_line
from providers.upstream_errors import batch_error_message

_RESULTS_PAGE = 1000  # results per page (xAI's and LiteLLM's page size)
_LIST_PAGES = 10  # pages of 100 batches a restart looks through for a part's batch


class XAIJobs(UpstreamJobs):
    """`xai/` deployments: chat completions as xAI batches."""

    providers = ("xai",)
    endpoints = frozenset({Endpoint.CHAT})

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def line(self, req: BatchRequest) -> bytes:
        return upstream_line(req, "xai", self._model)

    def reject(self, req: BatchRequest) -> Result | None:
        return None

    def _http(self, batch_id: str | None = None, suffix: str = "") -> tuple[str, dict[str, str]]:
        from litellm.llms.xai.batches.transformation import get_xai_auth_headers, xai_batches_url

        return (xai_batches_url(self._kwargs.get("api_base"), batch_id, suffix),
                get_xai_auth_headers(api_key=self._kwargs.get("api_key")))

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        litellm = self._litellm
        if part.file_id is None:
            upload = await call_with_retries(lambda: litellm.acreate_file(file=(name, data), purpose="batch",
                                                                          **self._kwargs))
            part.file_id = str(upload.id)
            await save()
        file_id = part.file_id
        job = await call_with_retries(lambda: litellm.acreate_batch(
            completion_window="24h", endpoint=part.endpoint, input_file_id=file_id,
            metadata={"name": name.removesuffix(".jsonl")}, **self._kwargs))
        part.batch_id = str(job.id)

    async def find(self, part: Part) -> bool:
        """The batch made from the part's uploaded file, among the newest batches xAI lists (paged)."""
        url, headers = self._http()
        token: str | None = None
        for _ in range(_LIST_PAGES):
            params = {"limit": "100", **({"pagination_token": token} if token else {})}
            try:
                page = await http_json("GET", url, headers, self._kwargs.get("timeout"), params=params)
            except Exception:
                return False
            for batch in page.get("batches") or []:
                if batch.get("input_file_id") == part.file_id:
                    part.batch_id = str(batch["batch_id"])
                    return True
            token = page.get("pagination_token")
            if not token:
                return False
        return False

    async def retrieve(self, batch_id: str) -> JobState:
        batch = await detached(self._litellm.aretrieve_batch(batch_id=batch_id, litellm_metadata=QUIET_POLL,
                                                                    **self._kwargs))
        status = str(batch.status)
        why = batch_error_message(batch) if status == "failed" else ""
        # a batch cancelled part-way keeps what it answered: its results are read like a completed one's
        return JobState(status=status, files=[batch_id] if status in ("completed", "cancelled") else [], why=why)

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        from litellm.llms.xai.batches.transformation import XAIBatchResultsPage, _result_to_openai_line

        timeout = self._kwargs.get("timeout")
        for batch_id in state.files:
            url, headers = self._http(batch_id, "/results")
            token: str | None = None
            while True:
                params = {"limit": str(_RESULTS_PAGE), **({"pagination_token": token} if token else {})}
                reply = await call_with_retries(functools.partial(http_json, "GET", url, headers, timeout,
                                                                  params=params))
                page = XAIBatchResultsPage.model_validate(reply)
                for result in page.results:
                    yield dict(_result_to_openai_line(result))
                token = page.pagination_token
                if not token or not page.results:
                    break

    async def cancel(self, batch_id: str) -> None:
        await call_with_retries(lambda: self._litellm.acancel_batch(batch_id=batch_id, **self._kwargs))


__all__ = ["XAIJobs"]
