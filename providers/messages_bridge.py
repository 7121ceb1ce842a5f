"""Anthropic Messages lines on an OpenAI-wire route: LiteLLM's adapter, our pass-through.

LiteLLM's `Router.aanthropic_messages` on an OpenAI-shaped provider translates the request with its
Anthropic adapter, sends it through `litellm.acompletion` (or the Responses API) with all of LiteLLM's per-call
machinery, and translates the reply back. Measured on the loopback upstream that path ran a Message Batch at
0.14x the same requests as an OpenAI batch, which goes through the pass-through (`providers.passthrough`).
Here the same adapter functions (`AnthropicAdapter`: LiteLLM's own translation, not a copy) translate the
body into a chat completions request, the pass-through sends it as bytes (the Router's deployment choice,
limits and retries as for any chat line), and the adapter translates the reply into Anthropic's `message`.
Routes that are not OpenAI-wire (an `anthropic/` deployment, Bedrock, Vertex AI, …) keep the Router's path.

The reply of one plain text choice (most of a batch) is mapped by `plain_message`, without building LiteLLM's
`ModelResponse`: that construction and the adapter's output translation were 0.14 ms a line, the largest cost
left between a Message Batch and an OpenAI batch. A request of plain text turns (string contents, a string
system prompt, sampling and length fields) is mapped by `plain_chat`, the adapter's request translation
being the next cost (about a tenth of the worker's CPU for a line, measured at 20,000 lines). Both give
exactly what the adapter gives (`tests/unit/test_messages_bridge.py` compares them), and hand anything else
(tools, images, documents, thinking, metadata, stop sequences, tool calls, a refusal, reasoning, cached
tokens, several choices) to the adapter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.domain import BatchRequest, Endpoint, Result
from gateway.message_batches.wire import anthropic_error

PassThrough = Callable[[BatchRequest, str], Awaitable[Result]]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}  # the adapter's, for the replies mapped here
_PLAIN_USAGE = frozenset({"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
                          "completion_tokens_details"})
# Fields a plain request may hold; the adapter copies all but `messages` and `system` as they are.
_PLAIN_FIELDS = frozenset({"messages", "system", "max_tokens", "temperature", "top_p", "top_k"})


def plain_chat(body: dict[str, Any], group: str) -> dict[str, Any] | None:
    """The chat completions request LiteLLM's adapter makes of an Anthropic request of plain text turns
    (`body` without `model`; `group` is the model it names); None for any other request."""
    if not body.keys() <= _PLAIN_FIELDS:
        return None
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        return None
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        if not isinstance(system, str) or not system:
            return None  # text blocks, or an empty prompt the adapter leaves out
        messages.append({"role": "system", "content": system})
    for turn in turns:
        if not isinstance(turn, dict) or len(turn) != 2:
            return None
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(content, str) or not content:
            return None  # content blocks, or an empty turn the adapter leaves out
        if role == "user":
            messages.append({"role": "user", "content": content})
        elif role == "assistant":
            messages.append({"role": "assistant", "content": content, "thinking_blocks": None})
        else:
            return None
    chat = {"model": group, "messages": messages}
    chat.update((k, v) for k, v in body.items() if k != "messages" and k != "system")
    return chat


def plain_message(reply: dict[str, Any]) -> dict[str, Any] | None:
    """The Anthropic `message` LiteLLM's adapter makes of a chat reply of one plain text choice; None for any
    other reply, which the adapter translates itself."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message, stop = choice.get("message"), _STOP_REASONS.get(str(choice.get("finish_reason")))
    if not isinstance(message, dict) or stop is None:
        return None
    text = message.get("content")
    if not isinstance(text, str) or not text or any(message[k] for k in message if k not in ("role", "content")):
        return None  # a refusal, tool calls, reasoning, annotations, audio: the adapter's
    usage = reply.get("usage")
    if not isinstance(usage, dict) or not set(usage) <= _PLAIN_USAGE:
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    for details in (usage.get("prompt_tokens_details"), usage.get("completion_tokens_details")):
        if details is not None and (not isinstance(details, dict) or any(details.values())):
            return None  # cached or reasoning tokens: the adapter counts them its way
    rid, model = reply.get("id"), reply.get("model")
    if not isinstance(rid, str) or not isinstance(model, str) or not model:
        return None
    return {"id": rid, "type": "message", "role": "assistant", "model": model, "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
            "content": [{"type": "text", "text": text}], "stop_reason": stop, "stop_details": None}


def _adapter() -> Any:
    from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter

    return AnthropicAdapter()


async def message_through_wire(req: BatchRequest, group: str, body: dict[str, Any], send: PassThrough) -> Result:
    """`req` (a /v1/messages line whose `body` is checked, `model` taken out) answered by the OpenAI-wire
    deployments of `group`: an Anthropic `message` on success, Anthropic's error shape otherwise."""
    chat: dict[str, Any] | None = plain_chat(body, group)
    tools: dict[str, str] = {}
    if chat is None:
        try:
            translated, tools = _adapter().translate_completion_input_params_with_tool_mapping(
                {**body, "model": group}, custom_llm_provider="openai")
        except (ValueError, TypeError, KeyError) as exc:  # a body the adapter cannot read: this line's 400
            return Result(line=req.line, custom_id=req.custom_id, status_code=400, model=group,
                          body={"type": "error", "error": {"type": "invalid_request_error", "message": str(exc)}})
        chat = dict(translated)
    result = await send(BatchRequest(line=req.line, custom_id=req.custom_id, url=Endpoint.CHAT, body=chat), group)
    if result.status_code is None or result.body is None:
        return result  # never answered (timeout, unreachable): the line's error as for any upstream line
    if not result.ok:
        result.body = anthropic_error(result.status_code, result.body)
        return result
    plain = plain_message(result.body) if not tools else None
    if plain is not None:
        # the same token counts as the chat reply's (no cached or reasoning ones): the result read them already
        result.status_code, result.body = 200, plain
        return result
    from litellm.types.utils import ModelResponse  # the adapter's reply type: only off the plain path

    message = _adapter().translate_completion_output_params(ModelResponse(**result.body), tool_name_mapping=tools)
    body_out = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    return Result(line=req.line, custom_id=req.custom_id, status_code=200, body=body_out, model=result.model,
                  cost_usd=result.cost_usd, request_id=result.request_id)
