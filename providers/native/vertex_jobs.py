"""Vertex AI batch prediction (`UpstreamJobs`): Gemini chat lines as `{"request": GenerateContentRequest}` in GCS.

A Vertex job runs one publisher model over a JSONL file in Cloud Storage: `POST v1/projects/{project}/locations/
{location}/batchPredictionJobs` with `{displayName, model: publishers/google/models/{model}, inputConfig:
{instancesFormat: jsonl, gcsSource: {uris}}, outputConfig: {predictionsFormat: jsonl, gcsDestination:
{outputUriPrefix}}}` makes `projects/../batchPredictionJobs/{id}`, polled with a GET (`state`: `JOB_STATE_*`) and
cancelled with `POST ..:cancel`. Google writes `predictions.jsonl` under the job's `outputInfo.gcsOutputDirectory`:
one `{request, response | status}` row per input row (`status`: the row's error text), in no promised order.
Rows carry no id of their own: each request's `labels` (a `GenerateContentRequest` field on Vertex, echoed back
with the request) hold `batchyard_line: l<line>`, as LiteLLM's own Vertex batch files smuggle `custom_id`.

What is LiteLLM's: each line's translation (`VertexGeminiConfig.map_openai_params` and `transform_request_body`,
the ones its real-time Vertex calls use) and each response's translation into a `chat.completion` with usage
(`providers.native.gemini_content`, shared with Gemini API batches); credentials and project (`VertexBase`:
`vertex_credentials` as a JSON string, path or mapping, else ADC through google-auth; `vertex_project`/
`vertex_location` or `VERTEXAI_*`); the API host (`get_vertex_base_url`) and the state words
(`VertexAIBatchTransformation`). What is ours, over HTTP:
the GCS upload, download and deletes (LiteLLM's GCS calls are fixed to storage.googleapis.com, so they never
reach `STORAGE_EMULATOR_HOST`) and the job calls (LiteLLM 1.110.2's create takes one of its own uploaded files
and guesses the model from its GCS path).

Limits (Vertex's quotas for Gemini batch prediction): up to 200,000 requests per job and 1 GB per input file;
a job runs within 72 hours, else `JOB_STATE_EXPIRED`.
"""

from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint
from providers.native.contract import (
    JobState,
    Save,
    UpstreamHTTPError,
    UpstreamJobs,
    http_json,
    http_lines,
    provider_client,
)
from providers.native.gemini_content import GeminiContent
from providers.native.openai_format import Part, call_with_retries, upstream_custom_id
from providers.upstream_errors import error_message

LABEL = "batchyard_line"  # the request label that names a row's input line
_GCS = "https://storage.googleapis.com"


class VertexJobs(GeminiContent):
    """`vertex_ai/gemini-*` deployments: chat completions as Vertex AI batch prediction jobs over GCS."""

    providers = ("vertex_ai",)
    endpoints = frozenset({Endpoint.CHAT})
    settings = frozenset({"native_gcs_bucket", "native_gcs_prefix", "native_keep_files"})
    required_settings = ("native_gcs_bucket",)
    settings_purpose = "the Cloud Storage bucket of Vertex AI's batch prediction jobs"
    credentials = (*UpstreamJobs.credentials, "vertex_project", "vertex_location", "vertex_credentials")

    @classmethod
    def model_refusal(cls, model: str) -> str | None:
        return None if model.rsplit("/", 1)[-1].startswith("gemini-") else f"runs gemini-* models only, not {model}"

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        from litellm.llms.vertex_ai.gemini.vertex_and_google_ai_studio_gemini import VertexGeminiConfig
        from litellm.llms.vertex_ai.vertex_llm_base import VertexBase

        if not info.native_gcs_bucket:
            raise ValueError("a native Vertex AI deployment needs model_info.native_gcs_bucket")
        # `publishers/google/models/x` or `x`
        super().__init__(VertexGeminiConfig(), model.rsplit("/", 1)[-1], "vertex_ai", "Vertex AI")
        self.provider = provider
        self._litellm = litellm
        self._kwargs = kwargs
        self._bucket = info.native_gcs_bucket
        self._prefix = info.native_gcs_prefix.strip("/")
        self._keep = info.native_keep_files
        self._vertex = VertexBase()
        params = dict(kwargs)  # VertexBase's getters pop what they read
        self._project = VertexBase.get_vertex_ai_project(params)
        self._location = VertexBase.get_vertex_ai_location(params) or "us-central1"
        self._credentials = VertexBase.get_vertex_ai_credentials(params)

    # -- lines --------------------------------------------------------------------------------------

    def _translate(self, req: BatchRequest) -> bytes:
        request = self._request(req.body)
        request["labels"] = {**(request.get("labels") or {}), LABEL: upstream_custom_id(req.line)}
        return json.dumps({"request": request}, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    # -- Google Cloud ---------------------------------------------------------------------------------

    async def _auth(self) -> dict[str, str]:
        """An OAuth access token of the deployment's credentials (LiteLLM's cache refreshes it)."""
        token, project = await self._vertex.get_access_token_async(credentials=self._credentials,
                                                                   project_id=self._project)
        self._project = self._project or project
        return {"authorization": f"Bearer {token}", "content-type": "application/json"}

    def _api(self, path: str) -> str:
        """`v1/<path>` on the deployment's `api_base` (or `VERTEXAI_API_BASE`), else Vertex's host for the location."""
        from litellm.llms.vertex_ai.common_utils import get_vertex_base_url
        from litellm.secret_managers.main import get_secret_str

        base = self._kwargs.get("api_base") or get_secret_str("VERTEXAI_API_BASE") \
            or get_vertex_base_url(self._location)
        return f"{str(base).rstrip('/').removesuffix('/v1')}/v1/{path}"

    def _jobs_path(self) -> str:
        if not self._project:
            raise ValueError("a Vertex AI batch needs a project (litellm_params.vertex_project or VERTEXAI_PROJECT)")
        return f"projects/{self._project}/locations/{self._location}/batchPredictionJobs"

    @staticmethod
    def _gcs(path: str) -> str:
        """A Cloud Storage JSON API URL: Google's, or `STORAGE_EMULATOR_HOST` (google-cloud-storage's variable)."""
        host = os.environ.get("STORAGE_EMULATOR_HOST") or _GCS
        return f"{host if '://' in host else 'http://' + host}".rstrip("/") + path

    @staticmethod
    def _object(bucket: str, key: str) -> str:
        return f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/{urllib.parse.quote(key, safe='')}"

    async def _storage(self, method: str, url: str, content: bytes | None = None) -> httpx.Response:
        headers = {k: v for k, v in (await self._auth()).items() if k != "content-type"}
        if content is not None:
            headers["content-type"] = "application/octet-stream"
        async with provider_client(self._kwargs.get("timeout")) as client:
            reply = await client.request(method, url, headers=headers, content=content)
        if reply.status_code >= 400 and not (method == "DELETE" and reply.status_code == 404):
            raise UpstreamHTTPError(reply.status_code, error_message(reply))
        return reply

    def _key(self, *parts: str) -> str:
        return posixpath.join(*(p for p in (self._prefix, *parts) if p))

    # -- the job ------------------------------------------------------------------------------------

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        if part.file_id is None:
            key = self._key("input", name)
            upload = self._gcs(f"/upload/storage/v1/b/{urllib.parse.quote(self._bucket, safe='')}/o?"
                               + urllib.parse.urlencode({"uploadType": "media", "name": key}))
            await call_with_retries(lambda: self._storage("POST", upload, data))
            part.file_id = key
            await save()
        key = part.file_id
        display = posixpath.basename(key).removesuffix(".jsonl")
        job = {"displayName": display, "model": f"publishers/google/models/{self._model}",
               "inputConfig": {"instancesFormat": "jsonl", "gcsSource": {"uris": [f"gs://{self._bucket}/{key}"]}},
               "outputConfig": {"predictionsFormat": "jsonl", "gcsDestination": {
                   "outputUriPrefix": f"gs://{self._bucket}/{self._key('output', display)}"}}}
        reply = await call_with_retries(lambda: self._call("POST", self._jobs_path(), json.dumps(job).encode()))
        part.batch_id = str(reply["name"])

    async def _call(self, method: str, path: str, content: bytes | None = None,
                    params: dict[str, str] | None = None) -> Any:
        return await http_json(method, self._api(path), await self._auth(), self._kwargs.get("timeout"),
                               content=content, params=params)

    async def find(self, part: Part) -> bool:
        """A job made from the part's input before a crash could record it: Vertex's list, by display name."""
        if part.file_id is None:
            return False
        display = posixpath.basename(part.file_id).removesuffix(".jsonl")
        reply = await self._call("GET", self._jobs_path(), params={"filter": f'display_name="{display}"'})
        jobs = [j for j in reply.get("batchPredictionJobs") or [] if j.get("displayName") == display]
        if jobs:
            part.batch_id = str(jobs[0]["name"])
        return bool(jobs)

    async def retrieve(self, batch_id: str) -> JobState:
        from litellm.llms.vertex_ai.batches.transformation import VertexAIBatchTransformation

        job = await self._call("GET", batch_id)
        status = str(VertexAIBatchTransformation._get_batch_job_status_from_vertex_ai_batch_response(job))
        source = str(job["inputConfig"]["gcsSource"]["uris"][0])
        prefix = str(job["outputConfig"]["gcsDestination"]["outputUriPrefix"])
        directory = str((job.get("outputInfo") or {}).get("gcsOutputDirectory") or "")
        return JobState(status=status, files=[source, prefix, directory],
                        why=str((job.get("error") or {}).get("message") or ""))

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        source, prefix, directory = state.files
        if state.status == "completed" and directory:
            bucket, _, path = directory.removeprefix("gs://").partition("/")
            url = self._gcs(self._object(bucket, posixpath.join(path, "predictions.jsonl")) + "?alt=media")
            headers = await self._auth()
            async for raw in http_lines(url, headers, self._kwargs.get("timeout")):
                yield self._row(json.loads(raw))
        if not self._keep:  # the batch's input and everything Google wrote under its prefix leave the bucket
            await self._delete(source, prefix)

    async def _delete(self, source: str, prefix: str) -> None:
        bucket, _, key = source.removeprefix("gs://").partition("/")
        await self._storage("DELETE", self._gcs(self._object(bucket, key)))
        out_bucket, _, out = prefix.removeprefix("gs://").partition("/")
        listing = self._gcs(f"/storage/v1/b/{urllib.parse.quote(out_bucket, safe='')}/o?"
                            + urllib.parse.urlencode({"prefix": out.rstrip("/") + "/"}))
        for item in (await self._storage("GET", listing)).json().get("items") or []:
            await self._storage("DELETE", self._gcs(self._object(out_bucket, str(item["name"]))))

    def _row(self, row: dict[str, Any]) -> dict[str, Any]:
        """One `predictions.jsonl` row as an OpenAI batch output line: its `response` (a
        `GenerateContentResponse`), or its `status` text as the line's error."""
        labels = (row.get("request") or {}).get("labels") or {}
        custom_id = str(labels.get(LABEL))
        if isinstance(row.get("response"), dict) and not row.get("status"):
            return self._answer(custom_id, row["response"])
        text = str(row.get("status") or "the row has neither a response nor a status")
        status = _status_in(text)
        body = {"error": {"message": text, "type": "invalid_request_error" if status == 400 else "api_error",
                          "param": None, "code": str(status)}}
        return {"custom_id": custom_id, "response": {"status_code": status, "body": body}}

    async def cancel(self, batch_id: str) -> None:
        await self._call("POST", f"{batch_id}:cancel", b"{}")


def _status_in(text: str) -> int:
    """The HTTP status a row's error text carries (`... {"error": {"code": 429, ...}}`), else 500."""
    start = text.find("{")
    if start >= 0:
        try:
            code = (json.loads(text[start:]).get("error") or {}).get("code")
        except (ValueError, AttributeError):
            code = None
        if isinstance(code, int) and 400 <= code < 600:
            return code
    return 500
