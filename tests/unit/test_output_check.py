"""`gateway.lines.output_check`: which lines are checked, and the first failing place of a reply, for each
kind of request that names its output's shape (chat, responses, Anthropic's Messages)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.domain import Endpoint
from gateway.lines.output_check import MAX_SCHEMA_BYTES, problem, refusal, wanted

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {
    "type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}}},
    "required": ["items"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": SCHEMA}}
GOOD = {"items": [{"age": 1}]}


def _chat(content: Any, finish: str = "stop", **message: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) or content is None else json.dumps(content)
    return {"choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": text,
                                                                           **message}}]}


def test_a_line_without_a_schema_is_not_checked() -> None:
    assert wanted(Endpoint.CHAT, {"messages": []}) is None
    assert wanted(Endpoint.CHAT, {"response_format": {"type": "text"}}) is None
    assert wanted(Endpoint.CHAT, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}) is None
    assert wanted(Endpoint.EMBEDDINGS, {"response_format": FORMAT}) is None
    assert wanted(Endpoint.MESSAGES, {"output_config": {"effort": "low"}}) is None


@pytest.mark.parametrize(("content", "finish", "found"), [
    (GOOD, "stop", None),
    ({"items": [{"age": 1}, {"age": 2}, {"age": 3}, {"age": "x"}]}, "stop",
     '/items/3/age: "x" is not of type "integer"'),
    ({"items": [{"age": 1}], "extra": 1}, "stop", "/: Additional properties are not allowed ('extra' was unexpected)"),
    ({}, "stop", '/: "items" is a required property'),
    ('{"items": [', "stop", "the content is not valid JSON"),
    (GOOD, "length", "the output was cut off at the token limit (finish_reason: length)"),
])
def test_a_chat_reply_against_its_json_schema(content: Any, finish: str, found: str | None) -> None:
    want = wanted(Endpoint.CHAT, {"response_format": FORMAT})
    assert want is not None and want.param == "body.response_format.json_schema.schema"
    got = problem(want, _chat(content, finish))
    assert got == found if found is None else got is not None and got.startswith(found)


def test_json_object_wants_an_object_and_a_refusal_is_invalid() -> None:
    want = wanted(Endpoint.CHAT, {"response_format": {"type": "json_object"}})
    assert want is not None
    assert problem(want, _chat({"any": [1]})) is None
    assert problem(want, _chat([1, 2])) == "/: [1,2] is not an object"
    assert problem(want, _chat(None, refusal="I can't")) == "the model refused"


def test_strict_tools_check_each_call_and_leave_others_alone() -> None:
    tools = [{"type": "function", "function": {"name": "strict_one", "strict": True, "parameters": SCHEMA}},
             {"type": "function", "function": {"name": "loose", "parameters": SCHEMA}}]
    want = wanted(Endpoint.CHAT, {"tools": tools})
    assert want is not None and set(want.tools) == {"strict_one"} and not want.content

    def calls(*pairs: tuple[str, str]) -> dict[str, Any]:
        return _chat(None, "tool_calls", tool_calls=[{"id": "c", "type": "function",
                                                      "function": {"name": n, "arguments": a}} for n, a in pairs])

    assert problem(want, calls(("strict_one", json.dumps(GOOD)), ("loose", "{}"))) is None
    assert problem(want, calls(("strict_one", '{"items": "no"}'))) == \
        'tool call strict_one arguments: /items: "no" is not of type "array"'
    assert problem(want, _chat("plain words")) is None  # no schema for the content: a text answer is fine


def test_several_choices_name_the_failing_one() -> None:
    want = wanted(Endpoint.CHAT, {"response_format": FORMAT})
    assert want is not None
    body = {"choices": [_chat(GOOD)["choices"][0], _chat({})["choices"][0]]}
    assert problem(want, body) == 'choice 1: /: "items" is a required property'


def test_a_responses_reply_against_text_format() -> None:
    want = wanted(Endpoint.RESPONSES, {"text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}})
    assert want is not None and want.param == "body.text.format.schema"

    def reply(text: str, status: str = "completed") -> dict[str, Any]:
        return {"status": status, "incomplete_details": {"reason": "max_output_tokens"} if status != "completed"
                else None, "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]}

    assert problem(want, reply(json.dumps(GOOD))) is None
    assert problem(want, reply("{}")) == '/: "items" is a required property'
    assert problem(want, reply(json.dumps(GOOD), "incomplete")) == "the output was cut off (max_output_tokens)"


def test_a_messages_reply_against_output_config_and_strict_tools() -> None:
    body = {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
            "tools": [{"name": "t", "strict": True, "input_schema": SCHEMA}]}
    want = wanted(Endpoint.MESSAGES, body)
    assert want is not None and want.param == "body.output_config.format.schema" and set(want.tools) == {"t"}
    text = {"type": "message", "stop_reason": "end_turn", "content": [{"type": "text", "text": json.dumps(GOOD)}]}
    assert problem(want, text) is None
    assert problem(want, {**text, "stop_reason": "max_tokens"}) == \
        "the output was cut off at the token limit (stop_reason: max_tokens)"
    tool = {"type": "message", "stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": "x", "name": "t", "input": {"items": [{"age": 1.5}]}}]}
    assert problem(want, tool) == 'tool_use t input: /items/0/age: 1.5 is not of type "integer"'
    beta = wanted(Endpoint.MESSAGES, {"output_format": {"type": "json_schema", "schema": SCHEMA}})
    assert beta is not None and beta.param == "body.output_format.schema"


def test_refused_at_validation_too_large_or_not_compilable_never_fetching() -> None:
    huge = {"description": "x" * MAX_SCHEMA_BYTES}
    large = {"response_format": {"type": "json_schema", "json_schema": {"schema": huge}}}
    assert refusal(Endpoint.CHAT, large) == ("body.response_format.json_schema.schema",
                                             f"The schema is {MAX_SCHEMA_BYTES + 18} bytes; the limit is 65536.")
    remote = {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "http://127.0.0.1:1/s"}}}}
    found = refusal(Endpoint.CHAT, remote)
    assert found is not None and found[1].startswith("The schema cannot be compiled: ")
    tool = {"tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                        "parameters": {"type": "object", "minProperties": "two"}}}]}
    found = refusal(Endpoint.CHAT, tool)
    assert found is not None and found[0] == "body.tools[f]"
    assert refusal(Endpoint.CHAT, {"response_format": FORMAT}) is None
