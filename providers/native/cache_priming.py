"""A primed prompt cache for Anthropic's Message Batches: the prefixes a job's requests share, written first.

Requests inside one Message Batch do not read each other's cache writes (they run in any order, at once), so a
thousand requests that share a long system prompt marked `cache_control` each write it, at 1.25x the input price,
and none reads it at 0.1x. One real-time request with that prefix (and `max_tokens: 1`) sent before the job
writes the cache every request of the job then reads, if the job starts within the cache's lifetime (5 minutes,
or the hour a `"ttl": "1h"` breakpoint asks for).

A request's cacheable prefix is what Anthropic hashes up to its last `cache_control` breakpoint, in its order:
`tools`, `system`, `messages`. `tool_choice` is part of it (a change invalidates the cached messages). A prefix
is primed only when at least two requests of the job share it: a prefix of one request is written by that
request itself. OpenAI's batches need none of this: their automatic prefix cache is shared by a job's requests.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from gateway.config.prices import Prices, cost_of
from gateway.domain import Result, Usage, billable
from providers.native.openai_format import Part

# A prefix that ends in the system prompt or the tools still needs one message to be a valid request.
_FILLER = {"role": "user", "content": "."}


def _marked(value: Any) -> bool:
    """Whether a content value (a string, a block, a list of blocks) carries a `cache_control` breakpoint."""
    if isinstance(value, dict):
        return "cache_control" in value
    if isinstance(value, list):
        return any(isinstance(block, dict) and "cache_control" in block for block in value)
    return False


def cached_prefix(params: dict[str, Any]) -> dict[str, Any] | None:
    """The part of a Messages API body up to its last `cache_control` breakpoint (`tools`, `system`, the messages
    through the last marked one, `tool_choice`); None when the body marks nothing."""
    messages = params.get("messages")
    messages = messages if isinstance(messages, list) else []
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and _marked(m.get("content"))), default=-1)
    prefix: dict[str, Any] = {}
    for name in ("tools", "system", "tool_choice"):
        if params.get(name) is not None:
            prefix[name] = params[name]
    marked = last >= 0 or _marked(params.get("system")) or any(
        isinstance(tool, dict) and "cache_control" in tool for tool in params.get("tools") or [])
    if not marked:
        return None
    prefix["messages"] = messages[:last + 1]
    return prefix


def shared_prefixes(data: bytes) -> list[dict[str, Any]]:
    """The distinct cached prefixes that two requests or more of a job share, in the order they first occur.

    `data`: the job's request lines, `{"custom_id", "params"}` each (Anthropic's batch request)."""
    counts: Counter[str] = Counter()
    first: dict[str, dict[str, Any]] = {}
    for raw in data.splitlines():
        if not raw.strip():
            continue
        params = json.loads(raw).get("params") or {}
        prefix = cached_prefix(params)
        if prefix is None:
            continue
        key = json.dumps(prefix, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        counts[key] += 1
        first.setdefault(key, prefix)
    return [first[key] for key, count in counts.items() if count >= 2]


def priming_request(model: str, prefix: dict[str, Any]) -> bytes:
    """The real-time Messages API body that writes `prefix` to the cache and asks for one token back."""
    body = {"model": model, "max_tokens": 1, **prefix, "messages": prefix["messages"] or [_FILLER]}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()




def primed(part: Part, usages: Sequence[Usage], prices: Callable[[], Prices | None]) -> bool:
    """Record in the part what the requests that primed its job's cache cost, at real-time rates (`prices`);
    False when none were made."""
    if not usages:
        return False
    known = prices()
    part.primed = len(usages)
    part.prime_cost_usd = sum(billable(cost_of(u, known)) for u in usages) if known is not None else None
    return True


def with_priming(part: Part, result: Result) -> Result:
    """The result of a part's first line carries what priming the job's prompt cache cost: a result is what the
    journal records and a team's spend counts, and that line's is recorded once, restart or not."""
    if part.prime_cost_usd and part.lines and result.line == part.lines[0]:
        result.cost_usd = billable(result.cost_usd) + part.prime_cost_usd
    return result


__all__ = ["cached_prefix", "primed", "priming_request", "shared_prefixes", "with_priming"]
