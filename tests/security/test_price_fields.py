"""A field that changes what the provider charges is refused unless the model allows it, and then priced.

Every field of `gateway.config.priced_fields` on a route that allows none: that line's 400
(`unsupported_parameter`, the field as `param`), and nothing sent. Allowed: a tier's tokens at the tier's
prices, web searches at the per-search price times the reply's `server_tool_use` count (or one per line),
and a priced field with no price known anywhere refused all the same. Run with `batchyard run --config`
on the loopback OpenAI upstream (the pass-through) and the Anthropic stand-in (LiteLLM's Messages path); the
cost is read from the run's own route statistics.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.priced_fields import NAMES
from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream
from tests.servers.test_upstream_routes import req, run

P_IN, P_OUT = 1e-3, 2e-3  # base prices per token on every route here
PRIORITY = (4e-3, 8e-3)
US = (1.1e-3, 2.2e-3)
SEARCH_LOW, SEARCH_MEDIUM = 0.03, 0.05


@pytest.fixture(scope="module")
def claude() -> Iterator[Stub]:
    stub = start_stub("tests.fakes.stubs_anthropic", [])
    yield stub
    stub.stop()


def _chat(cid: str, model: str, text: str = "hello", **extra: Any) -> str:
    return req(cid, "/v1/chat/completions", model=model, messages=[{"role": "user", "content": text}], **extra)


def _message(cid: str, model: str, text: str = "hello", **extra: Any) -> str:
    return req(cid, "/v1/messages", model=model, max_tokens=16, messages=[{"role": "user", "content": text}],
               **extra)


# (case, line maker, route kind, the param the refusal names): one per priced field and endpoint
REFUSED = [
    ("chat service_tier priority", lambda m: _chat("c", m, service_tier="priority"), "gpt", "service_tier"),
    ("chat service_tier flex", lambda m: _chat("c", m, service_tier="flex"), "gpt", "service_tier"),
    ("chat web_search_options", lambda m: _chat("c", m, web_search_options={}), "gpt", "web_search_options"),
    ("chat mcp tool", lambda m: _chat("c", m, tools=[{"type": "mcp", "server_label": "x",
                                                        "server_url": "https://mcp.example/sse"}]),
     "gpt", "tools[0].type"),
    ("chat web_search tool", lambda m: _chat("c", m, tools=[
        {"type": "function", "function": {"name": "f", "parameters": {}}}, {"type": "web_search_preview"}]),
     "gpt", "tools[1].type"),
    ("chat file_search tool", lambda m: _chat("c", m, tools=[{"type": "file_search", "vector_store_ids": ["vs"]}]),
     "gpt", "tools[0].type"),
    ("chat computer tool", lambda m: _chat("c", m, tools=[{"type": "computer_use_preview", "display_width": 8,
                                                             "display_height": 8, "environment": "browser"}]),
     "gpt", "tools[0].type"),
    ("chat image_generation tool", lambda m: _chat("c", m, tools=[{"type": "image_generation"}]), "gpt",
     "tools[0].type"),
    ("responses service_tier priority", lambda m: req("c", "/v1/responses", model=m, input="hi",
                                                      service_tier="priority"), "gpt", "service_tier"),
    ("responses code_interpreter tool", lambda m: req("c", "/v1/responses", model=m, input="hi", tools=[
        {"type": "code_interpreter", "container": {"type": "auto"}}]), "gpt", "tools[0].type"),
    ("messages service_tier auto", lambda m: _message("c", m, service_tier="auto"), "claude", "service_tier"),
    ("messages inference_geo us", lambda m: _message("c", m, inference_geo="us"), "claude", "inference_geo"),
    ("messages speed fast", lambda m: _message("c", m, speed="fast"), "claude", "speed"),
    ("messages mcp_servers", lambda m: _message("c", m, mcp_servers=[
        {"type": "url", "url": "https://mcp.example/sse", "name": "x"}]), "claude", "mcp_servers"),
    ("messages container", lambda m: _message("c", m, container="container_1"), "claude", "container"),
    ("messages web_search tool", lambda m: _message("c", m, tools=[
        {"type": "web_search_20250305", "name": "web_search"}]), "claude", "tools[0].type"),
    ("messages web_fetch tool", lambda m: _message("c", m, tools=[
        {"type": "web_fetch_20250910", "name": "web_fetch"}]), "claude", "tools[0].type"),
    ("messages code_execution tool", lambda m: _message("c", m, tools=[
        {"type": "code_execution_20250825", "name": "code_execution"}]), "claude", "tools[0].type"),
]


def _config(path: Path, up: Upstream, claude: Stub) -> Path:
    base = f"input_cost_per_token: {P_IN}, output_cost_per_token: {P_OUT}"
    path.write_text(f"""
model_list:
  - model_name: gpt
    litellm_params: {{model: openai/price-plain, api_key: sk-op, api_base: "{up.v1_url}"}}
    model_info: {{{base}}}
  - model_name: claude
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
    model_info: {{{base}}}
  - model_name: gpt-priority
    litellm_params: {{model: openai/price-priority, api_key: sk-op, api_base: "{up.v1_url}"}}
    model_info: {{{base}, input_cost_per_token_priority: {PRIORITY[0]}, output_cost_per_token_priority: {PRIORITY[1]},
                 allowed_params: [service_tier]}}
  - model_name: gpt-search
    litellm_params: {{model: openai/price-search, api_key: sk-op, api_base: "{up.v1_url}"}}
    model_info: {{{base}, allowed_params: [web_search],
                 search_context_cost_per_query: {{search_context_size_low: {SEARCH_LOW},
                                                  search_context_size_medium: {SEARCH_MEDIUM}}}}}
  - model_name: claude-geo
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
    model_info: {{{base}, input_cost_per_token_us: {US[0]}, output_cost_per_token_us: {US[1]},
                 allowed_params: [inference_geo]}}
  - model_name: claude-search
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
    model_info: {{{base}, allowed_params: [web_search],
                 search_context_cost_per_query: {{search_context_size_medium: {SEARCH_MEDIUM}}}}}
  - model_name: claude-code
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
    model_info: {{{base}, allowed_params: [code_execution]}}
  - model_name: claude-native
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
    model_info: {{batch_mode: native, native_poll_max_seconds: 0.2, allowed_params: [web_search]}}
router_settings: {{num_retries: 0, retry_after: 0}}
""")
    return path


def test_each_price_field_is_refused_unless_allowed_and_priced_when_allowed(
    upstream: Upstream, claude: Stub, tmp_path: Path,
) -> None:
    refused = [(case, make(model).replace('"custom_id": "c"', json.dumps({"custom_id": case})[1:-1]), param)
               for case, make, model, param in REFUSED]
    web_search = [{"type": "web_search_20250305", "name": "web_search"}]
    lines = [line for _, line, _ in refused] + [
        _chat("priority", "gpt-priority", "a b c", service_tier="priority"),
        _chat("flex-unpriced", "gpt-priority", "a b c", service_tier="flex"),
        _chat("default-tier", "gpt-priority", "a b c", service_tier="default"),  # the base price: no field
        _chat("search-low", "gpt-search", "a b c", web_search_options={"search_context_size": "low"}),
        _message("geo", "claude-geo", "a b c", inference_geo="us"),
        _message("searched", "claude-search", "find it #searches:2", tools=web_search),
        _message("code-unpriced", "claude-code", "run it", tools=[
            {"type": "code_execution_20250825", "name": "code_execution"}]),
        # a native batch prices tokens at batch rates only: a server tool is refused there, allowed or not
        _message("native-search", "claude-native", "find it", tools=web_search),
    ]
    before, claude_before = upstream.stats()["by_model"], claude.stats().get("messages", 0)
    _, out = run(tmp_path, _config(tmp_path / "config.yaml", upstream, claude), lines, "--data-dir",
                 str(tmp_path / "data"))

    def error(cid: str) -> dict[str, Any]:
        response = out[cid]["response"]
        assert response is not None and response["status_code"] == 400, (cid, out[cid])
        body = response["body"]
        return dict(body["error"])

    for case, _, param in refused:
        got = error(case)
        # a Messages line's error is Anthropic's shape, whose message carries ours
        text = json.dumps(got)
        assert param in text and "allowed_params" in text, (case, got)
        if "param" in got:
            assert (got["param"], got["code"]) == (param, "unsupported_parameter"), (case, got)
    assert "no price is known for service_tier 'flex'" in json.dumps(error("flex-unpriced"))
    assert "code_interpreter_cost_per_session" in json.dumps(error("code-unpriced"))
    assert "native batch" in json.dumps(error("native-search"))
    # nothing refused was sent: the plain routes saw no request at all
    after = upstream.stats()["by_model"]
    assert after.get("price-plain", 0) == before.get("price-plain", 0)
    assert after.get("price-priority", 0) - before.get("price-priority", 0) == 2  # priority and default
    assert claude.stats().get("messages", 0) - claude_before == 2  # geo and searched
    assert claude.stats().get("batches_created", 0) == 0  # the native line's job was never made

    db = sqlite3.connect(tmp_path / "data" / "batchyard.sqlite3")
    stats = {row[0]: row[1:] for row in db.execute(
        "SELECT route, completed, input_tokens, output_tokens, cost_usd FROM route_stats")}
    usage = {cid: out[cid]["response"]["body"]["usage"] for cid in ("priority", "default-tier", "search-low")}

    def tokens(cid: str) -> tuple[int, int]:
        u = usage[cid]
        return u["prompt_tokens"], u["completion_tokens"]

    (pi, po), (di, do) = tokens("priority"), tokens("default-tier")
    assert stats["gpt-priority"][3] == pytest.approx(pi * PRIORITY[0] + po * PRIORITY[1] + di * P_IN + do * P_OUT)
    si, so = tokens("search-low")
    assert stats["gpt-search"][3] == pytest.approx(si * P_IN + so * P_OUT + SEARCH_LOW)  # one search per line
    _, gi, go, geo_cost = stats["claude-geo"]
    assert gi > 0 and geo_cost == pytest.approx(gi * US[0] + go * US[1])
    _, qi, qo, search_cost = stats["claude-search"]
    assert search_cost == pytest.approx(qi * P_IN + qo * P_OUT + 2 * SEARCH_MEDIUM)  # the reply's count
    for route in ("gpt", "claude", "claude-code"):  # every line refused: nothing completed, nothing spent
        assert stats.get(route, (0, 0, 0, 0))[0] == 0 and not stats.get(route, (0, 0, 0, 0))[3], route


def test_the_table_names_every_field_an_operator_may_allow() -> None:
    assert {"service_tier", "inference_geo", "speed", "web_search", "web_fetch", "code_execution", "mcp",
            "file_search"} <= NAMES
