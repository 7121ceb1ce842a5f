"""The attribute names our spans carry, in one place.

The GenAI names follow the OpenTelemetry Semantic Conventions for generative AI, version 1.38.0
(https://github.com/open-telemetry/semantic-conventions/blob/v1.38.0/docs/gen-ai/gen-ai-spans.md), status
"Development": the GenAI conventions have no released Python package of names yet, so they are written here
and a later version is one edit. The older `gen_ai.usage.prompt_tokens` / `completion_tokens` are emitted as
well: vLLM's own `llm_request` spans and the tools built on them still read those.
"""

from __future__ import annotations

from gateway.domain import Endpoint

SEMCONV_VERSION = "1.38.0"

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"  # the older name of input_tokens
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"  # the older name of output_tokens
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_MESSAGES = "gen_ai.input.messages"  # content: only for a team content capture names
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"

# batchyard's own, under its own namespace
BATCH_ID = "batchyard.batch.id"
TEAM = "batchyard.team"
ENDPOINT = "batchyard.endpoint"
LINES = "batchyard.batch.lines"
COMPLETED = "batchyard.batch.completed"
FAILED = "batchyard.batch.failed"
STATUS = "batchyard.batch.status"
SHARD = "batchyard.shard.index"
SHARD_LINES = "batchyard.shard.lines"
ROUTE = "batchyard.route"
ATTEMPT = "batchyard.shard.attempt"
CUSTOM_ID = "batchyard.request.custom_id"
LINE = "batchyard.request.line"
COST = "batchyard.request.cost_usd"
SAMPLED = "batchyard.request.sampled"  # false: a request outside the sample, kept because it failed
ROLE = "batchyard.role"
UPSTREAM_BATCH_ID = "batchyard.upstream.batch_id"
MACHINE_FAULT = "batchyard.machine_fault"  # the fault of the machine a shard stopped on (disk_full, ...)

# gen_ai.operation.name of each endpoint (the conventions' well-known values where one fits)
OPERATIONS: dict[Endpoint, str] = {
    Endpoint.CHAT: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.RESPONSES: "chat",
    Endpoint.MESSAGES: "chat",
}

# LiteLLM's provider prefixes -> the conventions' gen_ai.provider.name (others are passed on as LiteLLM names them)
PROVIDERS = {
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "vertex_ai": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
    "mistral": "mistral_ai",
    "watsonx": "ibm.watsonx.ai",
    "xai": "x_ai",
    "hosted_vllm": "vllm",
}


def operation(endpoint: Endpoint) -> str:
    return OPERATIONS.get(endpoint, endpoint.value.rsplit("/", 1)[-1])


def provider_name(litellm_provider: str) -> str:
    """gen_ai.provider.name of a LiteLLM provider name."""
    return PROVIDERS.get(litellm_provider, litellm_provider)
