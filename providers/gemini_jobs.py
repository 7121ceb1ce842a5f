"""The Gemini API's Batch Mode (`UpstreamJobs`): chat lines as inline `GenerateContentRequest`s.

A Gemini batch runs one model, named in its URL: `POST v1beta/models/{model}:batchGenerateContent` with
`{"batch": {"displayName", "inputConfig": {"requests": {"requests": [{"request", "metadata": {"key"}}]}}}}`
makes a long-running operation `batches/{id}`, polled with `GET v1beta/batches/{id}` (its
`metadata.state` is `BATCH_STATE_*`); once done, its `response.inlinedResponses.inlinedResponses` holds one
`{response | error, metadata}` per request (a job made from a file uploaded through the Files API would name a
`responsesFile` instead: not used here, every part goes inline); `POST v1beta/batches/{id}:cancel` cancels it.
Auth: the `x-goog-api-key` header.

What is LiteLLM's: each line's translation (`GoogleAIStudioGeminiConfig.map_openai_params` and
`transform_request_body`, the ones its real-time Gemini calls use: `contents` with roles user/model,
`systemInstruction`, `generationConfig`), each response's translation back into a `chat.completion` with
usage (`transform_google_generate_content_to_openai_model_response`), the auth header and API base
(`GeminiModelInfo`) and the state words (`litellm.llms.gemini.batches.transformation._STATUS_MAP`). What is
ours, over HTTP: create, poll, read back and cancel. LiteLLM 1.110.2's Gemini batch calls take an uploaded
file of OpenAI-shaped rows only, and its batch object keeps no inline responses.

Limits (Google's docs): inline requests up to 20 MB per batch (`max_bytes`); a batch ends within 48 hours,
else `BATCH_STATE_EXPIRED`. A request's error is a `google.rpc.Status`: its status word is the line's code.
"""

from __future__ import annotations

import json
import types
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from gateway.config.endpoints import NATIVE_JOBS
from gateway.domain import BatchRequest, Endpoint, Result
from providers.openai_batches import Part, call_with_retries, upstream_custom_id
from providers.upstream_jobs import JobState, Save, http_json, translation_refusal

_BODY_FIELDS = frozenset({"model", "messages"})
_NOT_IN_BATCHES = frozenset({"stream", "stream_options"})  # a batch answers each request whole
# google.rpc.Code: the HTTP status Google's REST mapping gives each (google/rpc/code.proto).
_RPC_CODES = {1: (499, "CANCELLED"), 2: (500, "UNKNOWN"), 3: (400, "INVALID_ARGUMENT"), 4: (504, "DEADLINE_EXCEEDED"),
              5: (404, "NOT_FOUND"), 7: (403, "PERMISSION_DENIED"), 8: (429, "RESOURCE_EXHAUSTED"),
              9: (400, "FAILED_PRECONDITION"), 13: (500, "INTERNAL"), 14: (503, "UNAVAILABLE"),
              16: (401, "UNAUTHENTICATED")}


class GeminiJobs:
    """`gemini/` deployments: chat completions as Gemini Batch Mode jobs of inline requests."""

    endpoints = NATIVE_JOBS["gemini"].endpoints
    max_lines = 100_000
    max_bytes = 20_000_000  # inline requests: 20 MB per batch

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any]) -> None:
        from litellm.llms.gemini.chat.transformation import GoogleAIStudioGeminiConfig

        self.provider = provider
        self._litellm = litellm
        self._model = model.removeprefix("models/")
        self._kwargs = kwargs
        self._chat = GoogleAIStudioGeminiConfig()
        self._supported = set(self._chat.get_supported_openai_params(self._model)) - _NOT_IN_BATCHES

    # -- lines --------------------------------------------------------------------------------------

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Gemini's `GenerateContentRequest` of an OpenAI chat body (LiteLLM's translation)."""
        from litellm.llms.vertex_ai.gemini.transformation import transform_request_body

        asked = {k: v for k, v in body.items() if k not in _BODY_FIELDS and v is not None}
        optional = self._chat.map_openai_params(non_default_params=asked, optional_params={}, model=self._model,
                                                drop_params=False)
        request: dict[str, Any] = dict(transform_request_body(
            messages=list(body.get("messages") or []), model=self._model, optional_params=optional,
            custom_llm_provider="gemini", litellm_params={}, cached_content=None))
        return request

    def line(self, req: BatchRequest) -> bytes:
        entry = {"request": self._request(req.body), "metadata": {"key": upstream_custom_id(req.line)}}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def reject(self, req: BatchRequest) -> Result | None:
        """A parameter Gemini has no counterpart for, or messages LiteLLM cannot translate: a 400 for that line."""
        return translation_refusal(req, self._supported, f"{self._model} in Gemini", self._request)

    # -- the job ------------------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        from litellm.litellm_core_utils.url_utils import join_api_base
        from litellm.llms.gemini.common_utils import GeminiModelInfo

        return str(join_api_base(GeminiModelInfo.get_api_base(self._kwargs.get("api_base")), path))

    def _headers(self) -> dict[str, str]:
        from litellm.llms.gemini.common_utils import GeminiModelInfo

        key = GeminiModelInfo.get_api_key(self._kwargs.get("api_key"))
        if not key:
            raise ValueError("a Gemini batch needs an api_key (litellm_params.api_key or GEMINI_API_KEY)")
        return {"x-goog-api-key": key, "content-type": "application/json"}

    def _batch_url(self, batch_id: str, verb: str = "") -> str:
        return self._url(f"v1beta/batches/{urllib.parse.quote(batch_id.removeprefix('batches/'), safe='')}{verb}")

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        requests = b",".join(line for line in data.splitlines() if line)
        head = json.dumps({"displayName": name.removesuffix(".jsonl")})[:-1].encode()
        body = b'{"batch":' + head + b',"inputConfig":{"requests":{"requests":[' + requests + b"]}}}}"
        model = urllib.parse.quote(self._model, safe="")
        reply = await call_with_retries(lambda: http_json(
            "POST", self._url(f"v1beta/models/{model}:batchGenerateContent"), self._headers(),
            self._kwargs.get("timeout"), content=body))
        part.batch_id = str(reply["name"]).removeprefix("batches/")

    async def find(self, part: Part) -> bool:
        return False  # nothing is uploaded first: a part has an id only once its batch exists

    async def _operation(self, batch_id: str) -> dict[str, Any]:
        reply: dict[str, Any] = await http_json("GET", self._batch_url(batch_id), self._headers(),
                                                self._kwargs.get("timeout"))
        return reply

    async def retrieve(self, batch_id: str) -> JobState:
        from litellm.llms.gemini.batches.transformation import _STATUS_MAP

        operation = await self._operation(batch_id)
        state = str((operation.get("metadata") or {}).get("state") or "BATCH_STATE_UNSPECIFIED")
        status = str(_STATUS_MAP.get(state, "in_progress"))  # type: ignore[call-overload]
        error = operation.get("error") or {}
        return JobState(status=status, files=[batch_id], why=str(error.get("message") or ""))

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        for batch_id in state.files:
            response = (await self._operation(batch_id)).get("response") or {}
            inlined = (response.get("inlinedResponses") or {}).get("inlinedResponses") or []
            for item in inlined:  # a job of inline requests answers inline (a file job: `responsesFile`)
                yield self._result(str((item.get("metadata") or {}).get("key")), item)

    def _result(self, custom_id: str, item: dict[str, Any]) -> dict[str, Any]:
        """One request's outcome (`response`: a `GenerateContentResponse`; `error`: a `google.rpc.Status`) as an
        OpenAI batch output line."""
        import httpx
        from litellm.types.utils import ModelResponse

        if isinstance(item.get("response"), dict):
            # LiteLLM's reply translation reads the call's parameters off its logging object: none here
            logging = types.SimpleNamespace(optional_params={}, litellm_params={}, model_call_details={})
            reply = self._chat.transform_google_generate_content_to_openai_model_response(
                item["response"], ModelResponse(), self._model, logging, httpx.Response(200))  # type: ignore[arg-type]
            body = reply.model_dump(exclude_none=True)
            for extra in ("vertex_ai_grounding_metadata", "vertex_ai_url_context_metadata",
                          "vertex_ai_safety_results", "vertex_ai_citation_metadata"):
                body.pop(extra, None)
            return {"custom_id": custom_id, "response": {"status_code": 200, "body": body,
                                                         "request_id": item["response"].get("responseId")}}
        error = item.get("error") or {}
        code = error.get("code")
        status, word = _RPC_CODES.get(code if isinstance(code, int) else 2, (500, "UNKNOWN"))
        body = {"error": {"message": str(error.get("message") or ""), "type": "invalid_request_error"
                          if status == 400 else "api_error", "param": None, "code": word}}
        return {"custom_id": custom_id, "response": {"status_code": status, "body": body}}

    async def cancel(self, batch_id: str) -> None:
        await http_json("POST", self._batch_url(batch_id, ":cancel"), self._headers(), self._kwargs.get("timeout"),
                        content=b"{}")
