"""`providers.messages_bridge.plain_message` maps a chat reply of one plain text choice exactly as LiteLLM's
Anthropic adapter does (its output is the reference), and leaves every other reply to the adapter."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from providers.messages_bridge import plain_message

BASE: dict[str, Any] = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x", "system_fingerprint": "fp",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                 "message": {"role": "assistant", "content": "echo: hi", "refusal": None, "annotations": []}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11,
              "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
              "completion_tokens_details": {"reasoning_tokens": 0}},
}


def _reply(**changes: Any) -> dict[str, Any]:
    reply = copy.deepcopy(BASE)
    for path, value in changes.items():
        *where, last = path.split("__")
        node: Any = reply
        for key in where:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return reply


def _adapters(reply: dict[str, Any]) -> dict[str, Any]:
    from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter
    from litellm.types.utils import ModelResponse

    return dict(AnthropicAdapter().translate_completion_output_params(ModelResponse(**reply), tool_name_mapping={}))


@pytest.mark.parametrize("reply", [
    BASE,
    _reply(choices__0__finish_reason="length"),
    _reply(usage={"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1}),
    _reply(choices__0__message={"role": "assistant", "content": "plain"}),
])
def test_a_plain_reply_is_mapped_as_the_adapter_maps_it(reply: dict[str, Any]) -> None:
    assert plain_message(reply) == _adapters(reply)


@pytest.mark.parametrize("reply", [
    _reply(choices__0__message__refusal="I can't."),
    _reply(choices__0__message__content=None,
           choices__0__message__tool_calls=[{"id": "c", "type": "function",
                                             "function": {"name": "f", "arguments": "{}"}}],
           choices__0__finish_reason="tool_calls"),
    _reply(choices__0__message__reasoning_content="thinking"),
    _reply(usage__prompt_tokens_details={"cached_tokens": 3}),
    _reply(choices__0__finish_reason="content_filter"),
    _reply(choices=[BASE["choices"][0], BASE["choices"][0]]),
    _reply(choices__0__message__content=""),
])
def test_anything_else_is_left_to_the_adapter(reply: dict[str, Any]) -> None:
    assert plain_message(reply) is None
