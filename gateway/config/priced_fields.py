"""The request fields that change what a provider charges, in one table: each is refused unless the model's
`model_info.allowed_params` lists it, and priced where it is allowed.

A line's body is data, but some documented fields buy more than tokens at the base price: a service tier
(OpenAI's `priority` is about 2x, `flex` about 0.5x), Anthropic's `inference_geo` (1.1x for `us`) and `speed`
(fast mode), and server tools the provider runs and bills per use (web search per 1,000 searches, code
execution per container, file search per 1,000 calls) or that reach further servers (MCP). Sent unpriced,
they would let `max_budget` understate the bill. So a line carrying one is that line's 400
(`unsupported_parameter`, the field as `param`, before anything is sent) unless the operator lists the
field's NAME in `allowed_params`; then its cost is counted (`Charge`):

- a tier (`service_tier`, `inference_geo`, `speed` with any value but the neutral ones): the reply's tokens at
  the tier's prices, `input_cost_per_token_{value}` / `output_cost_per_token_{value}` (LiteLLM's names for
  tiers: `input_cost_per_token_priority`, `..._flex`), from the deployment's config, else LiteLLM's price
  map. The tier the reply says it ran at wins over the one asked for (OpenAI's `service_tier`, Anthropic's
  `usage.service_tier`), and is billed even where the line asked for none; a reported tier with no known
  price is billed at the highest per-token price known for the model, never the base one
  (`gateway.config.prices`). A line asking for a tier whose price neither gives is refused, allowed or not.
- `web_search` (a `web_search*` tool, or chat's `web_search_options`): per search,
  `search_context_cost_per_query.search_context_size_{low|medium|high}` (the size the line asks for, medium
  by default), times the reply's `usage.server_tool_use.web_search_requests` (one per line where the reply
  has no count: OpenAI's search models search once per request).
- `code_execution` (Anthropic's `code_execution*` tool or `container`, OpenAI's `code_interpreter`): one
  container per line at `code_interpreter_cost_per_session` (the config's, else the map's `{provider}/container`).
- `file_search`: one call per line at `file_search_cost_per_1k_calls` / 1000.
- `web_fetch`, `mcp` (an `mcp` tool on a chat or Responses line, which LiteLLM turns into Anthropic's
  `mcp_servers`; `mcp_servers` itself), `computer_use`, `image_generation`: the provider bills them as
  tokens (fetched pages, tool results, image tokens), which the reply's usage counts; allowed, they are
  priced as tokens. They are refused by default because they send the provider to other servers or run
  tools on the operator's account.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.domain import Endpoint

PER_TOKEN_KEYS = ("input_cost_per_token", "output_cost_per_token")
TIER_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")  # what may follow a per-token key as a tier's suffix


def is_tier_price_key(key: str) -> bool:
    """Whether `key` is a tier's per-token price (`input_cost_per_token_{tier}`: LiteLLM's `_priority`,
    `_flex`, `_batches`, or a tier field's value such as Anthropic's `inference_geo: us`), a name the price
    rules read for any tier, so a `model_info` holding one holds no unknown key."""
    return any(key.startswith(f"{k}_") and TIER_NAME.fullmatch(key[len(k) + 1:]) is not None
               for k in PER_TOKEN_KEYS)


_TOOLS = (Endpoint.CHAT, Endpoint.RESPONSES, Endpoint.MESSAGES)
_OPENAI_TIER = (Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES, Endpoint.EMBEDDINGS, Endpoint.IMAGES)


@dataclass(frozen=True, slots=True)
class TierField:
    """A top-level field whose value picks a price tier; `neutral` values are the base price."""

    name: str
    endpoints: tuple[Endpoint, ...]
    neutral: frozenset[str]


# The tier fields by endpoint. OpenAI: `default` is the standard price; Anthropic: `standard_only` never uses
# priority capacity, `global` is the base region, `standard` the base speed.
TIER_FIELDS = (
    TierField("service_tier", _OPENAI_TIER, frozenset({"default"})),
    TierField("service_tier", (Endpoint.MESSAGES,), frozenset({"standard_only", "standard"})),
    TierField("inference_geo", (Endpoint.MESSAGES,), frozenset({"global"})),
    TierField("speed", (Endpoint.MESSAGES,), frozenset({"standard"})),
)

# Other top-level fields, by endpoint: field -> the name `allowed_params` lists for it.
FIELDS: dict[Endpoint, dict[str, str]] = {
    Endpoint.CHAT: {"web_search_options": "web_search"},
    Endpoint.MESSAGES: {"mcp_servers": "mcp", "container": "code_execution"},
}

# Tool types (by prefix: Anthropic versions them, `web_search_20250305`) -> the name `allowed_params` lists.
TOOL_TYPES = (
    ("web_search", "web_search"), ("web_fetch", "web_fetch"), ("code_execution", "code_execution"),
    ("code_interpreter", "code_execution"), ("file_search", "file_search"), ("mcp", "mcp"),
    ("computer", "computer_use"), ("image_generation", "image_generation"),
)

# Every name `allowed_params` may list to allow one of them (the docs' table).
NAMES = frozenset({"service_tier", "inference_geo", "speed"} | {n for _, n in TOOL_TYPES}
                  | {n for fields in FIELDS.values() for n in fields.values()})

_SEARCH_SIZES = frozenset({"low", "medium", "high"})


@dataclass(frozen=True, slots=True)
class Charge:
    """What a line's priced fields add to its cost: a tier for its tokens, searches, containers, file
    searches. `name` and `param` name the first priced field found (for the refusal)."""

    name: str
    param: str
    tier: str | None = None  # a tier field's value (its prices replace the base ones)
    search_size: str | None = None  # web search asked, at this context size
    sessions: int = 0  # code execution containers
    file_searches: int = 0


def priced_fields(endpoint: Endpoint, body: Mapping[str, Any]) -> list[Charge]:
    """The priced fields `body` carries for `endpoint` (empty for nearly every line: a few dict lookups)."""
    found: list[Charge] = []
    for field in TIER_FIELDS:
        value = body.get(field.name)
        if value is not None and endpoint in field.endpoints and str(value) not in field.neutral:
            found.append(Charge(field.name, field.name, tier=str(value)))
    for key, name in FIELDS.get(endpoint, {}).items():
        if body.get(key) is not None:
            size = _size(body[key]) if name == "web_search" else None
            found.append(Charge(name, key, search_size=size, sessions=int(name == "code_execution")))
    tools = body.get("tools") if endpoint in _TOOLS else None
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            tool_name = next((n for prefix, n in TOOL_TYPES if isinstance(kind, str) and kind.startswith(prefix)),
                             None)
            if tool_name is not None:
                found.append(Charge(tool_name, f"tools[{index}].type",
                                    search_size=_size(tool) if tool_name == "web_search" else None,
                                    sessions=int(tool_name == "code_execution"),
                                    file_searches=int(tool_name == "file_search")))
    return found


def _size(options: Any) -> str:
    size = options.get("search_context_size") if isinstance(options, dict) else None
    return size if isinstance(size, str) and size in _SEARCH_SIZES else "medium"


Lookup = Callable[[str], Any]  # a deployment's price key: its config's value, else the price map's


def missing_price(charges: Sequence[Charge], lookup: Lookup) -> str | None:
    """Why an allowed priced field cannot be priced on a deployment (None: every one can)."""
    for charge in charges:
        if charge.tier is not None and lookup(f"input_cost_per_token_{charge.tier}") is None \
                and lookup(f"output_cost_per_token_{charge.tier}") is None:
            return f"no price is known for {charge.name} {charge.tier!r} (input_cost_per_token_{charge.tier})"
        if charge.search_size is not None and _search_price(lookup, charge.search_size) is None:
            return "no price per web search is known (search_context_cost_per_query)"
        if charge.sessions and _price(lookup("code_interpreter_cost_per_session")) is None:
            return "no price per code execution container is known (code_interpreter_cost_per_session)"
        if charge.file_searches and _price(lookup("file_search_cost_per_1k_calls")) is None:
            return "no price per file search is known (file_search_cost_per_1k_calls)"
    return None


def tier_of(charges: Sequence[Charge], reply: Mapping[str, Any]) -> str | None:
    """The tier a reply ran at: the one it reports (OpenAI's top-level `service_tier`, Anthropic's
    `usage.service_tier`), whether the line asked for one or not, else the one the line asked for. None: the
    base price."""
    asked = next((c.tier for c in charges if c.tier is not None), None)
    usage = reply.get("usage")
    said = reply.get("service_tier") or (usage.get("service_tier") if isinstance(usage, dict) else None)
    if isinstance(said, str) and said:
        neutral = {"default", "standard", "standard_only", "auto"}
        return None if said in neutral else said
    return asked


def extra_cost(charges: Sequence[Charge], reply: Mapping[str, Any], lookup: Lookup) -> float:
    """What searches, containers and file searches add to a reply's token cost."""
    total = 0.0
    size = next((c.search_size for c in charges if c.search_size is not None), None)
    if size is not None:
        total += _searches(reply) * (_search_price(lookup, size) or 0.0)
    sessions = sum(c.sessions for c in charges)
    if sessions:
        total += min(sessions, 1) * (_price(lookup("code_interpreter_cost_per_session")) or 0.0)
    searches = sum(c.file_searches for c in charges)
    if searches:
        total += searches * (_price(lookup("file_search_cost_per_1k_calls")) or 0.0) / 1000
    return total


def _searches(reply: Mapping[str, Any]) -> int:
    """The searches a reply reports (`usage.server_tool_use.web_search_requests`: Anthropic's, and LiteLLM's
    for the providers it maps), else one."""
    usage = reply.get("usage")
    used = usage.get("server_tool_use") if isinstance(usage, dict) else None
    count = used.get("web_search_requests") if isinstance(used, dict) else None
    if isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 10_000:
        return count
    return 1


def _search_price(lookup: Lookup, size: str) -> float | None:
    table = lookup("search_context_cost_per_query")
    if isinstance(table, dict):
        return _price(table.get(f"search_context_size_{size}"))
    return _price(table)  # one price for every size


def _price(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None


__all__ = ["FIELDS", "NAMES", "PER_TOKEN_KEYS", "TIER_FIELDS", "TIER_NAME", "TOOL_TYPES", "Charge", "TierField",
           "extra_cost", "is_tier_price_key", "missing_price", "priced_fields", "tier_of"]
