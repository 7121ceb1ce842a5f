"""Whether a line's reply matches the schema its request asked for: which lines are checked, and the check.

A line is checked when its request names the shape of its output:

- chat: `response_format` of type `json_schema` (the schema at `json_schema.schema`) or `json_object`, and
  the functions of `tools` with `"strict": true` (each tool call's `arguments` against its `parameters`);
- `/v1/responses`: `text.format` of type `json_schema` (or `json_object`);
- Anthropic's Messages: `output_config.format` of type `json_schema` (the pinned `anthropic` SDK's name;
  its beta's `output_format` too), and the `tools` with `"strict": true` (each `tool_use` block's `input`
  against its `input_schema`).

A reply is valid when every choice parses as JSON and validates, is not cut off by the token limit
(`finish_reason: length`, `status: incomplete`, `stop_reason: max_tokens`) and is no refusal. The validator is
`jsonschema-rs` (Rust), each distinct schema compiled once per process (`compiled`, by its JSON bytes),
never fetching a remote `$ref`: a schema is the team's data, not a URL for us to follow.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.domain import OUTPUT_INVALID, Endpoint

MAX_SCHEMA_BYTES = 64 * 1024  # a line's schema past this is refused at validation
_CACHED = 512  # distinct compiled schemas kept per process (a batch seldom has more than a few)


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a line's reply must be: `schema` (canonical JSON bytes; None: any JSON object, `json_object`),
    or nothing for its content (`content=False`: only strict tools are checked), and the strict tools' schemas
    by name. `param`: where the request names the schema, for validation's errors."""

    endpoint: Endpoint
    content: bool
    schema: bytes | None
    param: str
    tools: dict[str, bytes] = field(default_factory=dict)


def _canonical(schema: Any) -> bytes:
    # as the line wrote it (keys unsorted: sorting costs more than the rare second compile of one schema
    # written in another order); the bytes are the cache's key and what the size limit counts
    return orjson.dumps(schema)


def _format(value: Any, param: str, endpoint: Endpoint, nested: bool) -> tuple[bool, bytes | None, str] | None:
    """(content checked, schema, param) from a `response_format`-like object; None: free text."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "json_object" and endpoint is not Endpoint.MESSAGES:
        return True, None, param
    if kind != "json_schema":
        return None
    holder = value.get("json_schema") if nested else value
    where = f"{param}.json_schema.schema" if nested else f"{param}.schema"
    schema = holder.get("schema") if isinstance(holder, dict) else None
    if schema is None:
        return None  # the endpoint's own validation answers a schema that is missing
    return True, _canonical(schema), where


def wanted(endpoint: Endpoint, body: dict[str, Any]) -> Wanted | None:
    """What `body`'s reply is checked against; None: a line without a schema (never checked, never re-run)."""
    found: tuple[bool, bytes | None, str] | None = None
    tools: dict[str, bytes] = {}
    raw_tools = body.get("tools")
    if endpoint is Endpoint.CHAT:
        found = _format(body.get("response_format"), "body.response_format", endpoint, nested=True)
        for tool in raw_tools if isinstance(raw_tools, list) else ():
            fn = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(fn, dict) and fn.get("strict") is True and isinstance(fn.get("name"), str):
                tools[fn["name"]] = _canonical(fn.get("parameters") or {})
    elif endpoint is Endpoint.RESPONSES:
        text = body.get("text")
        found = _format(text.get("format") if isinstance(text, dict) else None, "body.text.format", endpoint,
                        nested=False)
    elif endpoint is Endpoint.MESSAGES:
        config = body.get("output_config")
        found = _format(config.get("format") if isinstance(config, dict) else None, "body.output_config.format",
                        endpoint, nested=False) or _format(body.get("output_format"), "body.output_format",
                                                           endpoint, nested=False)
        for tool in raw_tools if isinstance(raw_tools, list) else ():
            if isinstance(tool, dict) and tool.get("strict") is True and isinstance(tool.get("name"), str):
                tools[tool["name"]] = _canonical(tool.get("input_schema") or {})
    if found is None and not tools:
        return None
    content, schema, param = found if found is not None else (False, None, "body.tools")
    return Wanted(endpoint, content, schema, param, tools)


# -- compiling ------------------------------------------------------------------------------------------------

_lock = threading.Lock()  # the checks run in threads (off the event loop): one writer at a time
_validators: dict[bytes, Any] = {}  # in insertion order: the first key is the oldest


def _no_remote(uri: str) -> Any:
    raise ValueError(f"remote references are not followed ({uri})")


def compiled(schema: bytes) -> Any:
    """The validator of a schema (its JSON bytes), compiled once and kept (the oldest out first, past
    `_CACHED`). Raises `ValueError` (jsonschema-rs's `ValidationError` is one) for a schema it cannot compile."""
    found = _validators.get(schema)  # a read needs no lock (one dict operation): this runs for every reply
    if found is not None:
        return found
    import jsonschema_rs  # a Rust extension: imported by the processes that check, when they first do

    validator = jsonschema_rs.validator_for(orjson.loads(schema), retriever=_no_remote)
    with _lock:
        _validators[schema] = validator
        while len(_validators) > _CACHED:
            del _validators[next(iter(_validators))]
    return validator


def refusal(endpoint: Endpoint, body: dict[str, Any]) -> tuple[str, str] | None:
    """(param, message) when a line's schema cannot be checked: over `MAX_SCHEMA_BYTES`, or one the validator
    cannot compile. Validation refuses such a line; None: fine (or no schema)."""
    want = wanted(endpoint, body)
    if want is None:
        return None
    named = [(want.param, want.schema)] + [(f"body.tools[{name}]", s) for name, s in want.tools.items()]
    for param, schema in named:
        if schema is None:
            continue
        if len(schema) > MAX_SCHEMA_BYTES:
            return param, f"The schema is {len(schema)} bytes; the limit is {MAX_SCHEMA_BYTES}."
        try:
            compiled(schema)
        except ValueError as exc:
            return param, f"The schema cannot be compiled: {str(exc).splitlines()[0][:300]}"
    return None


# -- checking -------------------------------------------------------------------------------------------------


def _pointer(path: list[str | int]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _against(schema: bytes | None, value: Any) -> str | None:
    """The first place `value` breaks `schema` (None: any JSON object), as `/a/0/b: message`."""
    if schema is None:
        return None if isinstance(value, dict) else f"/: {orjson.dumps(value)[:80].decode()} is not an object"
    validator = compiled(schema)
    if validator.is_valid(value):  # the fast path: no error objects built
        return None
    error = next(iter(validator.iter_errors(value)))
    return f"{_pointer(error.instance_path)}: {error.message[:300]}"


def _parsed(text: Any, schema: bytes | None) -> str | None:
    if not isinstance(text, str):
        return "the reply has no text content"
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return f"the content is not valid JSON ({exc})"
    return _against(schema, value)


def _chat_choice(want: Wanted, choice: Any) -> str | None:
    if not isinstance(choice, dict) or not isinstance(message := choice.get("message"), dict):
        return "the choice has no message"
    if choice.get("finish_reason") == "length":
        return "the output was cut off at the token limit (finish_reason: length)"
    calls = message.get("tool_calls")
    if calls:
        for call in calls if isinstance(calls, list) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            name = fn.get("name") if isinstance(fn, dict) else None
            if name in want.tools:
                assert isinstance(fn, dict)
                problem = _parsed(fn.get("arguments"), want.tools[name])
                if problem is not None:
                    return f"tool call {name} arguments: {problem}"
        return None
    if message.get("refusal"):
        return "the model refused"
    return _parsed(message.get("content"), want.schema) if want.content else None


def _responses(want: Wanted, body: dict[str, Any]) -> str | None:
    if body.get("status") == "incomplete":
        reason = (body.get("incomplete_details") or {}).get("reason", "incomplete")
        return f"the output was cut off ({reason})"
    texts = [part.get("text") for item in body.get("output") or () if isinstance(item, dict)
             and item.get("type") == "message" for part in item.get("content") or ()
             if isinstance(part, dict) and part.get("type") == "output_text"]
    if not texts:
        return "the reply has no output text"
    return _parsed("".join(t for t in texts if isinstance(t, str)), want.schema) if want.content else None


def _messages(want: Wanted, body: dict[str, Any]) -> str | None:
    if body.get("stop_reason") == "max_tokens":
        return "the output was cut off at the token limit (stop_reason: max_tokens)"
    blocks = [b for b in body.get("content") or () if isinstance(b, dict)]
    for block in blocks:
        name = block.get("name")
        if block.get("type") == "tool_use" and name in want.tools:
            problem = _against(want.tools[name], block.get("input"))
            if problem is not None:
                return f"tool_use {name} input: {problem}"
    if not want.content or any(b.get("type") == "tool_use" for b in blocks):
        return None
    return _parsed("".join(b.get("text") or "" for b in blocks if b.get("type") == "text"), want.schema)


def problem(want: Wanted, body: Any) -> str | None:
    """Why a successful reply's body does not match what its request wanted (the first failing place, as a
    JSON pointer), or None when it does. CPU work: callers on an event loop run it in a thread."""
    if not isinstance(body, dict):
        return "the reply is not a JSON object"
    if want.endpoint is Endpoint.RESPONSES:
        return _responses(want, body)
    if want.endpoint is Endpoint.MESSAGES:
        return _messages(want, body)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        return "the reply has no choices"
    for i, choice in enumerate(choices):
        found = _chat_choice(want, choice)
        if found is not None:
            return found if len(choices) == 1 else f"choice {i}: {found}"
    return None


__all__ = ["MAX_SCHEMA_BYTES", "OUTPUT_INVALID", "Wanted", "compiled", "problem", "refusal", "wanted"]
