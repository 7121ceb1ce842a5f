"""Anthropic's Message Batches (`UpstreamJobs`): Messages lines as they are; chat lines translated by LiteLLM.

Anthropic takes no file: one `POST /v1/messages/batches` carries `requests: [{custom_id, params}]`, where
`params` is a Messages API body. LiteLLM 1.110.2 polls (`aretrieve_batch`) but does not create or cancel,
and reads results (`GET .../results`, Anthropic's JSONL) only whole, so those three go over HTTP with
LiteLLM's own URL and header helpers, the results streamed. Each line is translated with LiteLLM's
Anthropic chat transformation (the one its real-time calls use), and each result back into a
`chat.completion` body with usage, so callers see OpenAI's shape. A `/v1/messages` line (Anthropic's own
request, a Message Batch's) goes as it is, only its model named as the deployment's, and its result comes
back as Anthropic sent it: the `message`, or the `{"type": "error", "error": {...}}` of an errored request.
Its upstream custom_id says which it was (`m<line>` for a Messages line, `l<line>` for a chat line), so a
restarted process reads a job's results back the same way.

Limits (Anthropic's docs): 100,000 requests or 256 MB per batch; a batch ends within 24 hours, and the
requests it did not reach come back `expired`. Per-request outcomes keep Anthropic's words as codes:
`errored` lines carry the error's type (`invalid_request_error`, `overloaded_error`...), `canceled` and
`expired` lines those words.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint, Result, Usage
from gateway.log_safe import escaped
from gateway.message_batches.wire import ERROR_TYPES
from providers.native.cache_priming import priming_request, shared_prefixes
from providers.native.contract import (
    QUIET_POLL,
    JobState,
    Save,
    TranslatedLines,
    http_json,
    http_lines,
    stand_in_reply,
)
from providers.native.openai_format import Part, call_with_retries, detached, line_of, upstream_custom_id
from providers.upstream_errors import describe_error

ANTHROPIC_STATUS = {type_: status for status, type_ in ERROR_TYPES.items()}  # Anthropic's own (529)

# OpenAI chat fields that are the request itself, not parameters to map.
_BODY_FIELDS = frozenset({"model", "messages"})
_MESSAGES_ID = "m"  # the upstream custom_id's prefix of a Messages line (`l`: a chat line, `upstream_custom_id`)
_PRIMING_CONCURRENCY = 8  # priming requests at once (a job's distinct shared prefixes are usually few)

log = logging.getLogger("batchyard.native")


def chat_completion_body(message: dict[str, Any], config: Any) -> dict[str, Any]:
    """An Anthropic message (a batch result's, or Bedrock's Claude `modelOutput`) as a `chat.completion` body with
    usage: LiteLLM's reply translation (`AnthropicConfig.transform_parsed_response`), called as LiteLLM's
    `AnthropicFilesHandler._transform_anthropic_message_to_openai_format` calls it for a batch result, without
    what that wrapper builds per message and never reads (a logging object, the message re-encoded as a stand-in
    reply's body: a third of its CPU); on a failure that wrapper answers, with its own fallback body."""
    import litellm
    from litellm.types.utils import ModelResponse

    try:
        model_response = ModelResponse()
        model_response.choices = [litellm.Choices(finish_reason="stop", index=0,
                                                  message=litellm.Message(content="", role="assistant"))]
        body: dict[str, Any] = config.transform_parsed_response(
            completion_response=message, raw_response=stand_in_reply(), model_response=model_response, json_mode=False,
            prefix_prompt=None).model_dump(exclude_none=True)
    except Exception:
        from litellm.llms.anthropic.files.handler import AnthropicFilesHandler

        return dict(AnthropicFilesHandler()._transform_anthropic_message_to_openai_format(
            anthropic_message=message, anthropic_config=config))
    if not body.get("id"):
        body["id"] = message.get("id", "")
    return body


def _origin(api_base: str | None) -> str | None:
    """Anthropic's batch URLs hang off the origin; a real-time api_base may end in /v1 or /v1/messages."""
    if not api_base:
        return None
    return api_base.rstrip("/").removesuffix("/v1/messages").removesuffix("/v1")


class AnthropicJobs(TranslatedLines):
    """`anthropic/` deployments: chat completions as Message Batches."""

    providers = ("anthropic",)
    endpoints = frozenset({Endpoint.CHAT, Endpoint.MESSAGES})
    settings = frozenset({"prime_cache"})

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        from litellm.llms.anthropic.batches.transformation import AnthropicBatchesConfig
        from litellm.llms.anthropic.chat.transformation import AnthropicConfig

        super().__init__(litellm, provider, model, {**kwargs, "api_base": _origin(kwargs.get("api_base"))}, info)
        self._chat = AnthropicConfig()
        self._batches = AnthropicBatchesConfig()
        self._supported = set(self._chat.get_supported_openai_params(model))
        self._prime = info.prime_cache

    # -- lines --------------------------------------------------------------------------------------

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def _params(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Messages API body of an OpenAI chat body (LiteLLM's translation; a default max_tokens)."""
        asked = {k: v for k, v in body.items() if k not in _BODY_FIELDS and v is not None}
        optional = self._chat.map_openai_params(non_default_params=asked, optional_params={}, model=self._model,
                                                drop_params=False)
        params: dict[str, Any] = self._chat.transform_request(
            model=self._model, messages=list(body.get("messages") or []), optional_params=optional,
            litellm_params={}, headers={})
        return params

    def _translate(self, req: BatchRequest) -> bytes:
        if req.url is Endpoint.MESSAGES:  # already Anthropic's request: the deployment's model, nothing else
            entry = {"custom_id": f"{_MESSAGES_ID}{req.line}", "params": {**req.body, "model": self._model}}
        else:
            entry = {"custom_id": upstream_custom_id(req.line), "params": self._params(req.body)}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def reject(self, req: BatchRequest) -> Result | None:
        """A parameter Anthropic has no counterpart for, or messages it cannot take: a 400 for that line. A
        Messages line is Anthropic's own request (its fields checked against Anthropic's by the backend)."""
        if req.url is Endpoint.MESSAGES:
            return None
        unknown = sorted(k for k in req.body if k not in _BODY_FIELDS and k not in self._supported)
        param, message = (unknown[0], f"{unknown[0]} is not supported by {self._model} in Anthropic batches") \
            if unknown else (None, "")
        if not unknown:
            try:
                self.line(req)  # translated once: the line keeps it
                return None
            except Exception as exc:  # LiteLLM's translation refuses it: its own words
                param, message = "messages", str(getattr(exc, "message", None) or exc)
        body = {"error": {"message": message, "type": "invalid_request_error", "param": param,
                          "code": "unsupported_parameter" if unknown else "invalid_value"}}
        return Result(line=req.line, custom_id=req.custom_id, status_code=400, body=body, model=req.model)

    # -- the job ------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = self._batches.validate_environment(
            headers={}, model=self._model, messages=[], optional_params={}, litellm_params={},
            api_key=self._kwargs.get("api_key"), api_base=self._kwargs.get("api_base"))
        return headers

    def _url(self, suffix: str = "") -> str:
        base = self._batches.get_complete_batch_url(
            api_base=self._kwargs.get("api_base"), api_key=None, model=self._model, optional_params={},
            litellm_params={}, data={"completion_window": "24h", "endpoint": "/v1/chat/completions",
                                     "input_file_id": ""})
        return base + suffix

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        # The lines as they were sized against the limit: one request each, joined into `requests`.
        body = b'{"requests":[' + b",".join(line for line in data.splitlines() if line) + b"]}"
        reply = await call_with_retries(lambda: http_json(
            "POST", self._url(), self._headers(), self._kwargs.get("timeout"), content=body))
        part.batch_id = str(reply["id"])

    async def prime(self, data: bytes) -> list[Usage]:
        """One real-time request per cached prefix two lines or more of the job share (`cache_priming`), so that
        the job's requests read the cache rather than each write it. A failed one is logged and left: the job
        runs all the same, its requests writing the cache themselves."""
        prefixes = shared_prefixes(data) if self._prime else []
        gate = asyncio.Semaphore(_PRIMING_CONCURRENCY)
        url = self._url().removesuffix("/batches")

        async def one(prefix: dict[str, Any]) -> Usage | None:
            async with gate:
                try:
                    reply = await call_with_retries(lambda: http_json(
                        "POST", url, self._headers(), self._kwargs.get("timeout"),
                        content=priming_request(self._model, prefix)))
                except Exception as exc:
                    log.warning("priming the prompt cache of %s failed: %s", escaped(self._model),
                                escaped(describe_error(exc)))
                    return None
            return Usage.from_body(reply if isinstance(reply, dict) else None)

        answered = await asyncio.gather(*(one(prefix) for prefix in prefixes))
        return [usage for usage in answered if usage is not None]

    async def find(self, part: Part) -> bool:
        return False  # no file is uploaded first: a part has an id only once its batch exists

    async def retrieve(self, batch_id: str) -> JobState:
        batch = await detached(self._litellm.aretrieve_batch(batch_id=batch_id, litellm_metadata=QUIET_POLL,
                                                                    **self._kwargs))
        # LiteLLM reads `ended` as completed; the results say, request by request, what ended how.
        return JobState(status=str(batch.status), files=[batch_id])

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        from litellm.llms.anthropic.common_utils import ANTHROPIC_ERROR_STATUS_CODE_MAP
        from litellm.llms.anthropic.files.transformation import AnthropicFilesConfig

        for batch_id in state.files:
            # LiteLLM's `afile_content` reads this URL whole; streamed, memory stays flat (100,000 results).
            url, _ = AnthropicFilesConfig().transform_file_content_request(
                {"file_id": batch_id}, {}, {"api_base": self._kwargs.get("api_base")})
            async for raw in http_lines(url, self._headers(), self._kwargs.get("timeout")):
                item = json.loads(raw)
                custom_id, result = item.get("custom_id"), item.get("result") or {}
                kind = result.get("type")
                messages = isinstance(custom_id, str) and custom_id.startswith(_MESSAGES_ID)
                if messages:  # our line's number, as `line_of` reads it
                    custom_id = "l" + custom_id.removeprefix(_MESSAGES_ID)
                    messages = line_of(custom_id) is not None
                if messages and kind in ("succeeded", "errored"):  # as Anthropic sent it
                    message = result.get("message") or {}
                    body = message if kind == "succeeded" else (result.get("error") or {})
                    error_type = str((body.get("error") or {}).get("type") or "api_error")
                    status = 200 if kind == "succeeded" else ANTHROPIC_STATUS.get(
                        error_type, ANTHROPIC_ERROR_STATUS_CODE_MAP.get(error_type, 500))
                    yield {"custom_id": custom_id, "response": {"status_code": status, "body": body,
                                                                "request_id": message.get("id")}}
                elif kind == "succeeded":
                    message = result.get("message") or {}
                    body = chat_completion_body(message, self._chat)
                    yield {"custom_id": custom_id, "response": {"status_code": 200, "request_id": message.get("id"),
                                                                "body": body}}
                elif kind == "errored":
                    error = (result.get("error") or {}).get("error") or {}
                    type_ = str(error.get("type") or "api_error")
                    status = ANTHROPIC_ERROR_STATUS_CODE_MAP.get(type_, 500)
                    body = {"error": {"message": str(error.get("message") or ""), "type": type_, "param": None,
                                      "code": type_}}
                    yield {"custom_id": custom_id, "response": {"status_code": status, "body": body}}
                else:  # canceled, expired: never ran
                    yield {"custom_id": custom_id, "error": {
                        "code": str(kind), "message": f"The Anthropic message batch {batch_id} ended with this "
                                                      f"request {kind}."}}

    async def cancel(self, batch_id: str) -> None:
        quoted = urllib.parse.quote(batch_id, safe="")
        await http_json("POST", self._url(f"/{quoted}/cancel"), self._headers(), self._kwargs.get("timeout"))
