"""The native routes' per-line translations made cheaper are LiteLLM's, unchanged: a Bedrock line's Claude body
(its OpenAI parameters mapped once per distinct set) is what LiteLLM's `BedrockFilesConfig.
_map_openai_to_bedrock_params` makes of it, and an Anthropic message read back (a Message Batch result or Bedrock's
`modelOutput`) is the `chat.completion` LiteLLM's Anthropic files handler makes of it (its output is the reference)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint
from providers.native.anthropic_jobs import chat_completion_body

MODELS = ("anthropic.claude-3-5-haiku-20241022-v1:0", "anthropic.claude-sonnet-4-20250514-v1:0",
          "us.anthropic.claude-3-7-sonnet-20250219-v1:0")
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}
PARAMS: list[dict[str, Any]] = [
    {"max_tokens": 16}, {"temperature": 0.2, "top_p": 0.5, "stop": ["x"]},
    {"tools": [TOOL], "tool_choice": "auto", "max_completion_tokens": 50}, {"response_format": SCHEMA},
    {"response_format": {"type": "json_object"}}, {"reasoning_effort": "low", "max_tokens": 3000},
    {"user": "u1", "metadata": {"a": "b"}}, {}, {"max_tokens": 16},  # the first set again: mapped once, reused
]


def _messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text":
            f"hi {i}"}]}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": f"and {i}?"}]


@pytest.mark.parametrize("model", MODELS)
def test_a_bedrock_line_is_litellms_translation(model: str) -> None:
    import litellm
    from litellm.llms.bedrock.files.transformation import BedrockFilesConfig

    from providers.native.bedrock_jobs import BedrockJobs

    info = NativeModelInfo(batch_mode="native", native_s3_bucket="bucket", native_role_arn="arn:aws:iam::1:role/r")
    jobs = BedrockJobs(litellm, "bedrock", model, {}, info)
    for i, params in enumerate(PARAMS * 2):
        body = {"model": "claude-bulk", "messages": _messages(i), **params}
        req = BatchRequest(line=i, custom_id=f"r{i}", url=Endpoint.CHAT, body=body)
        try:
            expected = BedrockFilesConfig()._map_openai_to_bedrock_params(
                {k: v for k, v in copy.deepcopy(body).items() if k != "model"}, model, "anthropic")
        except Exception as exc:  # a parameter the model does not take: refused in the same words
            with pytest.raises(type(exc)) as refused:
                jobs.line(req)
            assert str(refused.value) == str(exc)
            continue
        line = json.loads(jobs.line(req))
        assert line == {"recordId": f"l{i}", "modelInput": json.loads(json.dumps(expected))}, params
    jobs.release()


@pytest.mark.parametrize("message", [
    {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
     "content": [{"type": "text", "text": "echo: hi"}], "stop_reason": "end_turn", "stop_sequence": None,
     "usage": {"input_tokens": 5, "output_tokens": 3}},
    {"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
     "content": [{"type": "text", "text": "Let me look."}, {"type": "tool_use", "id": "toolu_1", "name": "lookup",
                                                            "input": {"word": "hi"}}],
     "stop_reason": "tool_use", "stop_sequence": None,
     "usage": {"input_tokens": 50, "output_tokens": 20, "cache_read_input_tokens": 10}},
])
def test_a_read_back_message_is_litellms_translation(message: dict[str, Any]) -> None:
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig
    from litellm.llms.anthropic.files.handler import AnthropicFilesHandler

    config = AnthropicConfig()
    expected = dict(AnthropicFilesHandler()._transform_anthropic_message_to_openai_format(
        anthropic_message=copy.deepcopy(message), anthropic_config=config))
    body = chat_completion_body(copy.deepcopy(message), config)
    for generated in ("id", "created"):  # made anew by each translation
        assert body.pop(generated) and expected.pop(generated)
    assert body == expected
    assert body["usage"]["completion_tokens"] == message["usage"]["output_tokens"]
