"""OpenAI's and Azure's batch jobs (`UpstreamJobs`): LiteLLM's file and batch functions, end to end; and any
host serving OpenAI's Batch API as an `openai/` deployment with its own `api_base` (Parasail, Doubleword,
DeepInfra, Nebius, another batchyard).

A part is uploaded (`acreate_file`), then run (`acreate_batch`, its `completion_window` the deployment's
`native_completion_window`, else `24h`); the file id is recorded before the batch is created, so a crash in
between is found again by the file: the host's batch list, paged as each page says (`has_more` and `last_id`
lead to the next one), never by assuming a cursor the host did not offer. Output and error files are already
in OpenAI's result shape.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.log_safe import escaped
from providers.native.contract import QUIET_POLL, JobState, Save, UpstreamJobs, http_json
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

LIST_PAGES = 20  # batches listed to find one made before a crash: the newest 20 pages (2,000 on OpenAI)


class OpenAIJobs(UpstreamJobs):
    """`openai/` and `azure/` deployments: OpenAI's Batch API (Azure's is the same, under its own URLs), and any
    host of that API as an `openai/` deployment with its `api_base`."""

    providers: ClassVar[tuple[str, ...]] = ("openai", "azure")
    endpoints = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.EMBEDDINGS, Endpoint.RESPONSES,
                           Endpoint.MODERATIONS, Endpoint.IMAGES, Endpoint.IMAGE_EDITS})
    settings = frozenset({"native_completion_window"})
    default_base: ClassVar[str] = "https://api.openai.com/v1"
    key_variable: ClassVar[str] = "OPENAI_API_KEY"

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        super().__init__(litellm, provider, model, kwargs, info)
        self._window = info.native_completion_window or "24h"

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
            completion_window=self._window, endpoint=part.endpoint, input_file_id=file_id, metadata=metadata, **kwargs))
        part.batch_id = str(batch.id)

    async def find(self, part: Part) -> bool:
        """The batch made from the part's file, in the host's list (newest first), page by page as it pages."""
        cursor: str | None = None
        for _ in range(LIST_PAGES):
            try:
                page = await self._list_page(cursor)
            except Exception:
                return False
            for batch in page.get("data") or []:
                if isinstance(batch, Mapping) and batch.get("input_file_id") == part.file_id and batch.get("id"):
                    part.batch_id = str(batch["id"])
                    return True
            cursor = self.next_cursor(page)
            if cursor is None:
                return False
        return False

    async def _list_page(self, cursor: str | None) -> Mapping[str, Any]:
        if self.provider == "azure":  # Azure's URLs and `api-version`: LiteLLM's; it pages as OpenAI does
            extra = {"after": cursor} if cursor else {}
            page = await self._litellm.alist_batches(limit=100, **extra, **self._kwargs)
            dump = page.model_dump() if hasattr(page, "model_dump") else dict(page)
            return dump if isinstance(dump, dict) else {}
        kwargs = self._kwargs
        base = str(kwargs.get("api_base") or os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
                   or self.default_base) if self.provider == "openai" else str(kwargs["api_base"])
        key = kwargs.get("api_key") or os.environ.get(self.key_variable) or ""
        headers = {"Authorization": f"Bearer {key}"}
        if kwargs.get("organization"):
            headers["OpenAI-Organization"] = str(kwargs["organization"])
        page = await http_json("GET", f"{base.rstrip('/')}/batches", headers, kwargs.get("timeout"),
                               params=self.list_params(cursor))
        return page if isinstance(page, dict) else {}

    def list_params(self, cursor: str | None) -> dict[str, str]:
        """The query of one page of the host's batch list: the first asks nothing a host may not take (Groq's
        list documents no parameter); a next one, only when a page offered it, `after` its `last_id`."""
        return {"after": cursor} if cursor else {}

    def next_cursor(self, page: Mapping[str, Any]) -> str | None:
        """Where the host's next page starts, as the page says (None: the list ends here)."""
        last = page.get("last_id")
        return str(last) if page.get("has_more") is True and isinstance(last, str) and last else None

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
