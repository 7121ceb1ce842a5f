"""`providers.messages_bridge.plain_chat` maps an Anthropic request of plain text turns, and `plain_message` a
chat reply of one plain text choice, exactly as LiteLLM's Anthropic adapter does (its output is the
reference); every other request and reply is left to the adapter."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from providers.messages_bridge import plain_chat, plain_message

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


TURNS: list[dict[str, Any]] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                               {"role": "user", "content": "again"}]


def _adapters_request(body: dict[str, Any], group: str) -> dict[str, Any]:
    from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter

    chat, tools = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
        {**copy.deepcopy(body), "model": group}, custom_llm_provider="openai")
    assert tools == {}
    return dict(chat)


@pytest.mark.parametrize("group", ["gpt-x", "o1", "claude-like"])
@pytest.mark.parametrize("body", [
    {"max_tokens": 16, "messages": [{"role": "user", "content": "request number 1"}]},
    {"max_tokens": 16, "messages": TURNS},
    {"messages": TURNS, "system": "Be brief.", "max_tokens": 9, "temperature": 0.2, "top_p": 0.9, "top_k": 5},
    {"temperature": 0, "messages": [{"role": "assistant", "content": "prefill"}], "max_tokens": 1},
    {"max_tokens": 16, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
])
def test_a_plain_request_is_mapped_as_the_adapter_maps_it(body: dict[str, Any], group: str) -> None:
    chat = plain_chat(copy.deepcopy(body), group)
    assert chat == _adapters_request(body, group)
    assert list(chat or {}) == list(_adapters_request(body, group))  # the same bytes go out: the same order


@pytest.mark.parametrize("body", [
    {"max_tokens": 16, "messages": [{"role": "user", "content": [{"type": "text", "text": "a block"}]}]},
    {"max_tokens": 16, "system": [{"type": "text", "text": "blocks"}], "messages": TURNS},
    {"max_tokens": 16, "system": "", "messages": TURNS},
    {"max_tokens": 16, "messages": [{"role": "user", "content": ""}]},
    {"max_tokens": 16, "messages": []},
    {"max_tokens": 16, "messages": [{"role": "system", "content": "mid-turn system"}]},
    {"max_tokens": 16, "messages": [{"role": "user", "content": "a", "extra": 1}]},
    {"max_tokens": 16, "stop_sequences": ["x"], "messages": TURNS},
    {"max_tokens": 16, "metadata": {"user_id": "u"}, "messages": TURNS},
    {"max_tokens": 16, "tools": [{"name": "f", "input_schema": {"type": "object"}}], "messages": TURNS},
    {"max_tokens": 16, "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": TURNS},
])
def test_any_other_request_is_left_to_the_adapter(body: dict[str, Any]) -> None:
    assert plain_chat(body, "gpt-x") is None
