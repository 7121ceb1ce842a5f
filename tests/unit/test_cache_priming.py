"""The prefixes a Message Batch's requests share up to their last `cache_control` breakpoint
(`providers.native.cache_priming`), in Anthropic's order: tools, system, messages."""

from __future__ import annotations

import json
from typing import Any

from providers.native.cache_priming import cached_prefix, priming_request, shared_prefixes

MARK = {"type": "ephemeral"}
TOOL = {"name": "lookup", "input_schema": {"type": "object"}, "cache_control": MARK}


def line(i: int, **params: Any) -> bytes:
    return json.dumps({"custom_id": f"l{i}", "params": {"model": "m", "max_tokens": 9, **params}}).encode() + b"\n"


def test_the_prefix_ends_at_the_last_breakpoint() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "doc", "cache_control": MARK}]},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "question"}]
    assert cached_prefix({"system": "plain", "messages": messages}) == {"system": "plain",
                                                                        "messages": messages[:1]}
    assert cached_prefix({"tools": [TOOL], "messages": messages[1:]}) == {"tools": [TOOL], "messages": []}
    assert cached_prefix({"system": "plain", "messages": messages[1:]}) is None  # nothing marked


def test_only_prefixes_two_requests_share_are_primed_each_once() -> None:
    system = [{"type": "text", "text": "long prompt", "cache_control": MARK}]
    data = b"".join([
        *(line(i, system=system, messages=[{"role": "user", "content": f"q{i}"}]) for i in range(3)),
        line(3, system=[{**system[0], "text": "another"}], messages=[{"role": "user", "content": "q"}]),
        line(4, tools=[TOOL], system=system, messages=[{"role": "user", "content": "q"}]),  # tools differ
        line(5, tools=[TOOL], system=system, messages=[{"role": "user", "content": "r"}]),
        line(6, messages=[{"role": "user", "content": "unmarked"}]),
    ])
    assert shared_prefixes(data) == [{"system": system, "messages": []},
                                     {"tools": [TOOL], "system": system, "messages": []}]


def test_the_priming_request_asks_for_one_token() -> None:
    body = json.loads(priming_request("claude-x", {"system": "s", "messages": []}))
    assert body == {"model": "claude-x", "max_tokens": 1, "system": "s",
                    "messages": [{"role": "user", "content": "."}]}
