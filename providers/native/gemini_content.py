"""Chat lines as Gemini `GenerateContentRequest`s and `GenerateContentResponse`s back as `chat.completion`s.

Shared by the two batch APIs that run Gemini models: the Gemini API's Batch Mode (`providers.native.gemini_jobs`) and
Vertex AI's batch prediction (`providers.native.vertex_jobs`). Both take the same request body per line and answer
with the same response body; they differ in how a job is made, named, polled and read back, which stays in
their own modules.

All of it is LiteLLM's: each line's translation (`map_openai_params` and `transform_request_body` of the
provider's chat config, the ones its real-time calls use: `contents` with roles user/model,
`systemInstruction`, `generationConfig`), and each response's translation back into a `chat.completion` with
usage (`transform_google_generate_content_to_openai_model_response`).
"""

from __future__ import annotations

import types
from typing import Any

from gateway.domain import BatchRequest, Endpoint, Result
from providers.native.contract import TranslatedLines, stand_in_reply, translation_refusal

_BODY_FIELDS = frozenset({"model", "messages"})
_NOT_IN_BATCHES = frozenset({"stream", "stream_options"})  # a batch answers each request whole
_VERTEX_EXTRAS = ("vertex_ai_grounding_metadata", "vertex_ai_url_context_metadata", "vertex_ai_safety_results",
                  "vertex_ai_citation_metadata")


class GeminiContent(TranslatedLines):
    """One deployment's Gemini model: its line translation, its refusals and its response translation.

    `chat`: LiteLLM's chat config of the provider (`GoogleAIStudioGeminiConfig` or `VertexGeminiConfig`);
    `llm_provider`: LiteLLM's provider name for the request body (`gemini` or `vertex_ai`); `service`: the
    batch API's name in a refusal's words."""

    def __init__(self, chat: Any, model: str, llm_provider: str, service: str) -> None:
        self._chat = chat
        self._model = model
        self._llm_provider = llm_provider
        self._service = service
        self._supported = set(chat.get_supported_openai_params(model)) - _NOT_IN_BATCHES

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `GenerateContentRequest` of an OpenAI chat body (LiteLLM's translation)."""
        from litellm.llms.vertex_ai.gemini.transformation import transform_request_body

        asked = {k: v for k, v in body.items() if k not in _BODY_FIELDS and v is not None}
        optional = self._chat.map_openai_params(non_default_params=asked, optional_params={}, model=self._model,
                                                drop_params=False)
        return dict(transform_request_body(
            messages=list(body.get("messages") or []), model=self._model, optional_params=optional,
            custom_llm_provider=self._llm_provider, litellm_params={}, cached_content=None))

    def reject(self, req: BatchRequest) -> Result | None:
        """A parameter Gemini has no counterpart for, or messages LiteLLM cannot translate: a 400 for that line."""
        return translation_refusal(req, self._supported, f"{self._model} in {self._service}",
                                   lambda body: self.line(req))  # translated once: the line keeps it

    def _answer(self, custom_id: str, response: dict[str, Any]) -> dict[str, Any]:
        """A `GenerateContentResponse` as an OpenAI batch output line (a `chat.completion` with usage)."""
        from litellm.types.utils import ModelResponse

        # LiteLLM's reply translation reads the call's parameters off its logging object: none here
        logging = types.SimpleNamespace(optional_params={}, litellm_params={}, model_call_details={})
        reply = self._chat.transform_google_generate_content_to_openai_model_response(
            response, ModelResponse(), self._model, logging, stand_in_reply())
        body = reply.model_dump(exclude_none=True)
        for extra in _VERTEX_EXTRAS:
            body.pop(extra, None)
        return {"custom_id": custom_id, "response": {"status_code": 200, "body": body,
                                                     "request_id": response.get("responseId")}}
