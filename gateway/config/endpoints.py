"""Every fact about an endpoint, in one table: its url, its required fields, and what each route kind serves.

`ENDPOINTS` has one row per canonical `Endpoint` (which of them a native provider's jobs take, those jobs
declare: `gateway.config.native_declarations`). Everything else reads these: url normalising
(`gateway.config.urls`), body checks (`gateway.lines.body_fields`), and every backend: the upstream one and
its OpenAI-wire pass-through, the native one, the local engine's refusals. A local route serves what its vLLM
model serves (vLLM tells at start), less `never_local`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.domain import Endpoint

FieldTypes = Mapping[str, tuple[tuple[type, ...], str]]  # field -> (accepted types, how OpenAI names them)
_STRING_OR_ARRAY = ((str, list), "a string or an array")


@dataclass(frozen=True, slots=True)
class EndpointRule:
    """One endpoint's facts.

    `tail`: the path every url form of it ends in (`/v1/<tail>`, Azure's `/openai/deployments/{d}/<tail>`).
    `required`: alternative sets of required body fields; a body holds every field of at least one set.
    `types`: the JSON type a field must have when present (only the cheap, certain checks).
    `sdk_params`: the `openai` SDK's request TypedDict (`module:Name`): OpenAI's documented fields.
    `header_params`: names in that TypedDict the SDK sends as headers, not in the body (never a line's field).
    `fields`: the documented fields where no OpenAI schema exists (rerank: Cohere's v2 request).
    `router_method`: the LiteLLM Router's method on a real-time upstream route (None: only the wire, if `wire`).
    `wire`: an OpenAI-wire provider takes the line's bytes as they are (the upstream backend's pass-through).
    `never_local`: what it is, when no vLLM model serves it (the local line's 400 says where to send it).
    """

    tail: str
    required: tuple[tuple[str, ...], ...]
    types: FieldTypes = field(default_factory=dict)
    sdk_params: str | None = None
    header_params: frozenset[str] = frozenset()
    fields: frozenset[str] = frozenset()
    router_method: str | None = None
    wire: bool = False
    never_local: str | None = None

    @property
    def wire_path(self) -> str:
        """The path below an OpenAI-wire provider's base URL (`/chat/completions`)."""
        return f"/{self.tail}"


ENDPOINTS: dict[Endpoint, EndpointRule] = {
    Endpoint.CHAT: EndpointRule(
        "chat/completions", (("messages",),), {"messages": ((list,), "an array")},
        sdk_params="openai.types.chat.completion_create_params:CompletionCreateParamsBase",
        router_method="acompletion", wire=True),
    Endpoint.COMPLETIONS: EndpointRule(
        "completions", (("prompt",),), {"prompt": _STRING_OR_ARRAY},
        sdk_params="openai.types.completion_create_params:CompletionCreateParamsBase",
        router_method="atext_completion", wire=True),
    Endpoint.EMBEDDINGS: EndpointRule(
        "embeddings", (("input",),), {"input": _STRING_OR_ARRAY},
        sdk_params="openai.types.embedding_create_params:EmbeddingCreateParams",
        router_method="aembedding", wire=True),
    Endpoint.RESPONSES: EndpointRule(
        "responses", (("input",),), {"input": _STRING_OR_ARRAY},
        sdk_params="openai.types.responses.response_create_params:ResponseCreateParamsBase",
        router_method="aresponses", wire=True),
    # vLLM's score takes any one of its four pairs (vllm/entrypoints/pooling/scoring/protocol.py)
    Endpoint.SCORE: EndpointRule(
        "score", (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))),
    # Rerank is no OpenAI endpoint: its fields are Cohere's v2 rerank request, the one LiteLLM's `rerank` takes.
    Endpoint.RERANK: EndpointRule(
        "rerank", (("query", "documents"),),
        fields=frozenset({"model", "query", "documents", "top_n", "rank_fields", "return_documents",
                          "max_chunks_per_doc", "max_tokens_per_doc"}),
        router_method="arerank"),
    Endpoint.MODERATIONS: EndpointRule(
        "moderations", (("input",),), {"input": _STRING_OR_ARRAY},
        sdk_params="openai.types.moderation_create_params:ModerationCreateParams",
        router_method="amoderation", wire=True, never_local="moderations"),
    Endpoint.IMAGES: EndpointRule(
        "images/generations", (("prompt",),), {"prompt": ((str,), "a string")},
        sdk_params="openai.types.image_generate_params:ImageGenerateParamsBase",
        router_method="aimage_generation", wire=True, never_local="image generation"),
    # Image edits in OpenAI's JSON form (`EditImageBodyJsonParam` of openai/openai-openapi; the SDK's type is
    # the multipart form): `images` and `mask` reference images by `image_url` (a URL, under the media-URL rule,
    # or a data: URL) or `file_id`. Only the OpenAI wire takes it as it is: LiteLLM's `aimage_edit` wants files.
    Endpoint.IMAGE_EDITS: EndpointRule(
        "images/edits", (("images", "prompt"),), {"images": ((list,), "an array"), "prompt": ((str,), "a string")},
        fields=frozenset({"model", "images", "prompt", "mask", "background", "input_fidelity", "moderation", "n",
                          "output_compression", "output_format", "partial_images", "quality", "size", "stream",
                          "user"}),
        wire=True, never_local="image editing"),
    # audio takes a URL (vLLM's run_batch) or the file
    Endpoint.TRANSCRIPTIONS: EndpointRule("audio/transcriptions", (("file_url",), ("file",))),
    Endpoint.TRANSLATIONS: EndpointRule("audio/translations", (("file_url",), ("file",))),
    # Anthropic's Messages, the requests of a Message Batch; its documented fields are the `anthropic` SDK's.
    Endpoint.MESSAGES: EndpointRule(
        "messages", (("messages", "max_tokens"),), {"messages": ((list,), "an array")},
        sdk_params="anthropic.types.message_create_params:MessageCreateParamsBase",
        # the `anthropic-workspace-id` and `anthropic-user-profile-id` headers: which of the operator's
        # workspaces (and on whose behalf) the operator's key acts is the operator's, not a line's
        header_params=frozenset({"workspace_id", "user_profile_id"}),
        router_method="aanthropic_messages"),
}

# served upstream: through the Router's method, or (image edits) on OpenAI-wire routes only
UPSTREAM_ENDPOINTS = frozenset(e for e, rule in ENDPOINTS.items() if rule.router_method is not None or rule.wire)
WIRE_ENDPOINTS = frozenset(e for e, rule in ENDPOINTS.items() if rule.wire)

