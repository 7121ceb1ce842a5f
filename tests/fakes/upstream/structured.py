"""Structured replies of the loopback upstream: a chat or responses request that names a schema
(`response_format` json_schema/json_object, strict `tools`, `text.format`) gets JSON made from that schema.

`#schema:KIND` in the request's text makes the reply wrong in one way, on every attempt; `#schema:KINDxN` only
on the first N attempts of that text (then valid). KIND: `badjson` (not JSON), `wrongtype` (the first property
of the wrong type), `missing` (a required property left out), `extra` (a property the schema does not name),
`length` (cut off: `finish_reason: length`, `status: incomplete`), `badtool` (a strict tool's arguments with
the wrong type).
"""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from typing import Any

JSON = dict[str, Any]
_SCHEMA_RE = re.compile(r"#schema:(badjson|wrongtype|missing|extra|length|badtool)(?:x(\d+))?")


def instance(schema: Any, depth: int = 0) -> Any:
    """A value valid under `schema` (the subset structured outputs use: objects, arrays, scalars, enums)."""
    if not isinstance(schema, dict) or depth > 16:
        return {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return instance(schema[key][0], depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: instance(sub, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [instance(schema.get("items") or {}, depth + 1)] * max(1, int(schema.get("minItems", 1)))
    return {"string": "text", "integer": 7, "number": 1.5, "boolean": True, "null": None}.get(kind, "text")


def _broken(value: JSON, how: str) -> JSON:
    broken = dict(value)
    if how == "wrongtype" and broken:
        first = next(iter(broken))
        broken[first] = [] if isinstance(broken[first], str) else "not the type"
    elif how == "missing" and broken:
        broken.pop(next(iter(broken)))
    elif how == "extra":
        broken["unexpected_key"] = 1
    return broken


class Structured:
    """The attempts seen per request text (a directive may hold for the first N only)."""

    def __init__(self) -> None:
        self.attempts: Counter[str] = Counter()

    def _wrong(self, text: str) -> str | None:
        match = _SCHEMA_RE.search(text)
        if match is None:
            return None
        self.attempts[text] += 1
        times = match.group(2)
        return match.group(1) if times is None or self.attempts[text] <= int(times) else None

    def chat(self, body: JSON, text: str, reply: JSON) -> None:
        fmt = body.get("response_format")
        strict = [t["function"] for t in body.get("tools") or () if isinstance(t, dict)
                  and isinstance(t.get("function"), dict) and t["function"].get("strict") is True]
        schema: Any = None
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") or {}
        elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
            schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
        if schema is None and not strict:
            return
        how = self._wrong(text)
        choice = reply["choices"][0]
        message = choice["message"]
        if strict:
            fn = strict[0]
            args = instance(fn.get("parameters") or {})
            if how in ("badtool", "wrongtype", "missing", "extra"):
                args = _broken(args, "wrongtype" if how == "badtool" else how)
            arguments = "{not json" if how == "badjson" else json.dumps(args)
            message["content"] = None
            message["tool_calls"] = [{"id": f"call_{secrets.token_hex(6)}", "type": "function",
                                      "function": {"name": fn["name"], "arguments": arguments}}]
            choice["finish_reason"] = "tool_calls"
        else:
            message["content"] = self._content(schema, how)
        if how == "length":
            choice["finish_reason"] = "length"

    def responses(self, body: JSON, text: str, reply: JSON) -> None:
        fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            return
        how = self._wrong(text)
        reply["output"][0]["content"][0]["text"] = self._content(fmt.get("schema") or {}, how)
        reply["text"] = {"format": fmt}
        if how == "length":
            reply["status"] = "incomplete"
            reply["incomplete_details"] = {"reason": "max_output_tokens"}

    @staticmethod
    def _content(schema: Any, how: str | None) -> str:
        value = instance(schema)
        if how == "badjson":
            return '{"answer": "cut'
        if how == "length":
            return json.dumps(value)[:-2]
        if how in ("wrongtype", "missing", "extra") and isinstance(value, dict):
            value = _broken(value, how)
        return json.dumps(value)


__all__ = ["Structured", "instance"]
