"""Fireworks AI's batch inference jobs (`UpstreamJobs`): a dataset of `{custom_id, body}` lines, one job over it.

Fireworks runs batches over datasets, not files (its batch inference guide and API reference: Create Dataset,
Upload Dataset Files, Create/Get/Delete Batch Inference Job, Get Dataset Download Endpoint). docs/native.md names
what differs from OpenAI's batch API:
- the control plane is `https://api.fireworks.ai/v1/accounts/{account}` (`native_account_id`), not the inference
  base (`.../inference/v1`) a chat call uses;
- the input is a dataset: `POST .../datasets` (`datasetId`, `dataset: {userUploaded: {}, exampleCount}`), then
  `POST .../datasets/{id}:upload` (multipart `file`, at most 150 MB that way);
- a line is `{custom_id, body}`; the body names no model: the job does (`model`, the account-qualified name);
- the create (`POST .../batchInferenceJobs?batchInferenceJobId=ID`) names its own id, the input and the output
  dataset: the job's id is the dataset's, so a restart that lost the reply finds the job by that id;
- the job has a `state` (`JOB_STATE_VALIDATING`, `..._PENDING`, `..._RUNNING`, `..._COMPLETED`, `..._FAILED`,
  `..._EXPIRED`...), a failed job's reason in `status.message`;
- results are the output dataset's files (`BIJOutputSet.jsonl`, answered lines `{custom_id, response:
  <chat.completion>}`, no `status_code`; `error-data`, lines that failed), each read from a short-lived signed
  URL that `:getDownloadEndpoint` lists (sent no key);
- there is no cancel: `DELETE` on the job stops it.

Limits (the guide): an input dataset under 500 MB (the one-request upload takes 150 MB: the byte bound), no cap on
requests; a job runs within 24 hours; batch prices are 50% of serverless ones, for every model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from gateway.config.entries import NativeModelInfo

log = logging.getLogger("batchyard.native")

_STATES = {
    "validating": ("UNSPECIFIED", "VALIDATING", "CREATING_INPUT_DATASET"),
    "in_progress": ("PENDING", "CREATING", "RUNNING", "RE_QUEUEING", "IDLE", "PAUSED", "WRITING_RESULTS"),
    "completed": ("COMPLETED",),
    "failed": ("FAILED",),
    "expired": ("EXPIRED", "EARLY_STOPPED"),  # rows answered before the end are kept in the output dataset
    "cancelling": ("CANCELLING",),
    "cancelled": ("CANCELLED", "DELETING", "DELETING_CLEANING_UP", "DELETED", "ARCHIVED"),
}
# Fireworks' job states in OpenAI's words (what the runner's TERMINAL and the missing-line errors read).
STATES = {f"JOB_STATE_{raw}": status for status, raws in _STATES.items() for raw in raws}


def dataset_id(name: str) -> str:
    """A Fireworks resource id for the part named `name` (lower-case letters, digits and hyphens, at most 63):
    the same name gives the same id, so a rerun of `create` meets what the first one made."""
    return "batchyard-" + hashlib.sha256(name.encode()).hexdigest()[:32]


class FireworksJobs(UpstreamJobs):
    """`fireworks_ai/` deployments: chat completions as Fireworks batch inference jobs."""

    providers = ("fireworks_ai",)
    endpoints = frozenset({Endpoint.CHAT})
    settings = frozenset({"native_account_id"})
    required_settings = ("native_account_id",)
    settings_purpose = "the Fireworks account whose datasets and batch inference jobs these are"

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        super().__init__(litellm, provider, model, kwargs, info)
        self._account = str(info.native_account_id or "")

    def _http(self) -> tuple[str, dict[str, str]]:
        """(the account's control-plane base, the headers): LiteLLM's base and key for a Fireworks deployment,
        the base's inference path (`/inference/v1`) replaced by `/v1/accounts/{account}`."""
        _, _, key, base = self._litellm.get_llm_provider(
            model=f"fireworks_ai/{self._model}", api_base=self._kwargs.get("api_base"),
            api_key=self._kwargs.get("api_key"))
        root = str(base).rstrip("/").removesuffix("/v1").removesuffix("/inference")
        account = urllib.parse.quote(self._account, safe="")
        return f"{root}/v1/accounts/{account}", {"Authorization": f"Bearer {key or ''}"}

    def _resource(self, kind: str, rid: str) -> str:
        return f"accounts/{self._account}/{kind}/{rid}"

    # -- lines ----------------------------------------------------------------------------------------

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def line(self, req: BatchRequest) -> bytes:
        body = {k: v for k, v in req.body.items() if k != "model"}  # the job names the model
        entry = {"custom_id": upstream_custom_id(req.line), "body": body}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def reject(self, req: BatchRequest) -> Result | None:
        return None  # the body is Fireworks' chat request as it is (the runner checked its fields)

    # -- the job ----------------------------------------------------------------------------------------

    async def _dataset(self, rid: str, data: bytes, name: str) -> None:
        """The input dataset `rid` with `data` uploaded; one made by an earlier try is reused."""
        base, headers = self._http()
        timeout = self._kwargs.get("timeout")
        spec = {"datasetId": rid, "dataset": {"userUploaded": {}, "exampleCount": str(data.count(b"\n"))}}
        try:
            await http_json("POST", f"{base}/datasets", {**headers, "Content-Type": "application/json"}, timeout,
                            content=json.dumps(spec).encode())
        except UpstreamHTTPError as exc:
            if exc.status_code != 409:
                raise
            existing = await http_json("GET", f"{base}/datasets/{rid}", headers, timeout)
            if existing.get("state") == "READY":
                return  # uploaded before a crash could record it
        async with provider_client(timeout) as client:
            reply = await client.post(f"{base}/datasets/{rid}:upload", headers=headers, files={"file": (name, data)})
        if reply.status_code >= 400:
            raise UpstreamHTTPError(reply.status_code, error_message(reply))

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        rid = dataset_id(name)
        if part.file_id is None:
            await call_with_retries(lambda: self._dataset(rid, data, name))
            part.file_id = rid
            await save()
        source = part.file_id
        base, headers = self._http()
        body = json.dumps({"model": self._litellm_model(), "displayName": name.removesuffix(".jsonl"),
                           "inputDatasetId": self._resource("datasets", source),
                           "outputDatasetId": self._resource("datasets", f"{source}-out")}).encode()
        try:
            await call_with_retries(lambda: http_json(
                "POST", f"{base}/batchInferenceJobs", {**headers, "Content-Type": "application/json"},
                self._kwargs.get("timeout"), content=body, params={"batchInferenceJobId": source}))
        except UpstreamHTTPError as exc:
            if exc.status_code != 409:  # 409: made by an earlier try whose reply was lost; its id is ours
                raise
        part.batch_id = source

    def _litellm_model(self) -> str:
        """The model as Fireworks names it (`accounts/fireworks/models/...`), by LiteLLM's rule."""
        from litellm.llms.fireworks_ai.common_utils import resolve_fireworks_resource_name

        return str(resolve_fireworks_resource_name(self._model))

    async def find(self, part: Part) -> bool:
        """The job made from the part's dataset: it has the dataset's id."""
        if part.file_id is None:
            return False
        base, headers = self._http()
        try:
            await http_json("GET", f"{base}/batchInferenceJobs/{urllib.parse.quote(part.file_id, safe='')}",
                            headers, self._kwargs.get("timeout"))
        except Exception:
            return False
        part.batch_id = part.file_id
        return True

    async def retrieve(self, batch_id: str) -> JobState:
        base, headers = self._http()
        job = await http_json("GET", f"{base}/batchInferenceJobs/{urllib.parse.quote(batch_id, safe='')}",
                              headers, self._kwargs.get("timeout"))
        raw = str(job.get("state") or "")
        status = STATES.get(raw, "in_progress")
        output = str(job.get("outputDatasetId") or "").rsplit("/", 1)[-1]
        # an expired or deleted job keeps the rows it answered: its output dataset is read like a completed one's
        files = [output] if output and status in ("completed", "expired", "cancelled") else []
        reason = (job.get("status") or {}).get("message") if isinstance(job.get("status"), dict) else None
        why = str(reason or raw) if status in ("failed", "expired") else ""
        return JobState(status=status, files=files, why=why)

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        base, headers = self._http()
        timeout = self._kwargs.get("timeout")
        for rid in state.files:
            try:
                listing = await call_with_retries(functools.partial(
                    http_json, "GET", f"{base}/datasets/{urllib.parse.quote(rid, safe='')}:getDownloadEndpoint",
                    headers, timeout))
            except UpstreamHTTPError as exc:
                if exc.status_code != 404:
                    raise
                log.warning("native: Fireworks dataset %s has no files (%s)", escaped(rid), escaped(exc.message))
                continue
            for filename, signed in sorted((listing.get("filenameToSignedUrls") or {}).items()):
                async for raw in http_lines(str(signed), {}, timeout):  # a signed URL: no key goes with it
                    line = _openai_line(raw)
                    if line is None:
                        log.warning("native: Fireworks file %s: a result line is not a result", escaped(filename))
                        continue
                    yield line

    async def cancel(self, batch_id: str) -> None:
        base, headers = self._http()
        await http_json("DELETE", f"{base}/batchInferenceJobs/{urllib.parse.quote(batch_id, safe='')}", headers,
                        self._kwargs.get("timeout"))


def _openai_line(raw: bytes) -> dict[str, Any] | None:
    """A Fireworks result line in OpenAI's output shape: an answered row's bare `chat.completion` becomes
    `response: {status_code: 200, body}`; an `error-data` row keeps its `error`."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "custom_id" not in obj:
        return None
    response = obj.get("response")
    if isinstance(response, dict) and "status_code" not in response:
        return {"custom_id": obj["custom_id"], "response": {"status_code": 200, "body": response}}
    if response is None and not isinstance(obj.get("error"), dict):
        return None
    return obj


__all__ = ["STATES", "FireworksJobs", "dataset_id"]
