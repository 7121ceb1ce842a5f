"""OpenAI's and Azure's batch jobs (`UpstreamJobs`): LiteLLM's file and batch functions, end to end.

A part is uploaded (`acreate_file`), then run (`acreate_batch`); the file id is recorded before the batch is
created, so a crash in between is found again by the file (`alist_batches`). Output and error files are
already in OpenAI's result shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway.domain import BatchRequest, Endpoint, Result
from gateway.log_safe import escaped
from providers.native.contract import QUIET_POLL, JobState, Save, UpstreamJobs
from providers.native.openai_format import (
    Part,
    call_with_retries,
    detached,
    upstream_file_lines,
    upstream_line,
    upstream_url,
)
from providers.upstream_errors import batch_error_message

log = logging.getLogger("batchyard.native")



class OpenAIJobs(UpstreamJobs):
    """`openai/` and `azure/` deployments: OpenAI's Batch API (Azure's is the same, under its own URLs)."""

    providers = ("openai", "azure")
    endpoints = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.EMBEDDINGS, Endpoint.RESPONSES})

    def url(self, endpoint: Endpoint) -> str:
        return upstream_url(endpoint, self.provider)

    def line(self, req: BatchRequest) -> bytes:
        return upstream_line(req, self.provider, self._model)

    def reject(self, req: BatchRequest) -> Result | None:
        return None

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        litellm, kwargs = self._litellm, self._kwargs
        if part.file_id is None:
            upload = await call_with_retries(lambda: litellm.acreate_file(file=(name, data), purpose="batch", **kwargs))
            part.file_id = str(upload.id)
            await save()
        file_id = part.file_id
        batch = await call_with_retries(lambda: litellm.acreate_batch(
            completion_window="24h", endpoint=part.endpoint, input_file_id=file_id, metadata=metadata, **kwargs))
        part.batch_id = str(batch.id)

    async def find(self, part: Part) -> bool:
        try:
            page = await self._litellm.alist_batches(limit=100, **self._kwargs)
        except Exception:
            return False
        for batch in getattr(page, "data", None) or []:
            if getattr(batch, "input_file_id", None) == part.file_id:
                part.batch_id = str(batch.id)
                return True
        return False

    async def retrieve(self, batch_id: str) -> JobState:
        batch = await detached(self._litellm.aretrieve_batch(
            batch_id=batch_id, litellm_metadata=QUIET_POLL, **self._kwargs))
        status = str(batch.status)
        files = [str(f) for f in (getattr(batch, "output_file_id", None), getattr(batch, "error_file_id", None)) if f]
        return JobState(status=status, files=files, why=batch_error_message(batch) if status == "failed" else "")

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        for file_id in state.files:
            async for raw in upstream_file_lines(self._litellm, file_id, self._kwargs):
                try:
                    yield json.loads(raw)
                except ValueError:
                    log.warning("native: upstream file %s: a result line is not JSON", escaped(file_id))

    async def cancel(self, batch_id: str) -> None:
        await self._litellm.acancel_batch(batch_id=batch_id, **self._kwargs)
