"""Anthropic's Messages lines (`url: /v1/messages`, a Message Batch's requests) on upstream and native routes.

The real `batchyard run` against the loopback upstream (OpenAI-wire providers, answered through LiteLLM's
Anthropic-messages adapter) and the Anthropic stand-in (an `anthropic/` deployment in real time, and
Anthropic's own Message Batches on a native route). Nothing is mocked. Whatever route answers, a succeeded
line's body is an Anthropic `message`, and an error a route answered is Anthropic's error object; a line the
gateway refuses before sending it keeps our code.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream
from tests.servers.test_upstream_routes import LEAKS, req, run
from tests.support.server_helpers import start_gateway
from tests.support.waiting import eventually

PRICE_IN, PRICE_OUT = 0.001, 0.002
HAIKU_BATCH = (5e-7, 2.5e-6)  # claude-haiku-4-5's batch prices in LiteLLM's price map (per token)


@pytest.fixture(scope="module")
def claude() -> Iterator[Stub]:
    stub = start_stub("tests.fakes.stubs_anthropic", ["--batch-delay", "0.3"])
    yield stub
    stub.stop()


def config(path: Path, up: Upstream, claude: Stub) -> Path:
    path.write_text(f"""
model_list:
  - model_name: gpt
    litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-test, api_base: "{up.v1_url}"}}
  - model_name: priced
    litellm_params: {{model: hosted_vllm/house-model, api_base: "{up.v1_url}"}}
    model_info: {{input_cost_per_token: {PRICE_IN}, output_cost_per_token: {PRICE_OUT}}}
  - model_name: impatient
    litellm_params: {{model: hosted_vllm/house-model, api_base: "{up.v1_url}", timeout: 0.5}}
  - model_name: claude-now
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
  - model_name: claude-batch
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_key: sk-ant, api_base: "{claude.url}"}}
    model_info: {{batch_mode: native, native_poll_max_seconds: 0.2}}
  - model_name: openai-batch
    litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-test, api_base: "{up.v1_url}"}}
    model_info: {{batch_mode: native, native_poll_max_seconds: 0.2}}
router_settings: {{num_retries: 2, retry_after: 0}}
""")
    return path


def msg(cid: str, model: str, text: str, **extra: Any) -> str:
    """A Message Batch request as the front door hands it on: `params` as the line's body."""
    return req(cid, "/v1/messages", model=model, max_tokens=64, messages=[{"role": "user", "content": text}],
               **extra)


def message_of(line: dict[str, Any]) -> anthropic.types.Message:
    """A succeeded line: status 200 and an Anthropic `message` (validated by the SDK's own type)."""
    response = line["response"]
    assert response["status_code"] == 200, line
    assert not any(key.startswith("_") for key in response["body"])  # nothing of LiteLLM's bookkeeping
    return anthropic.types.Message.model_validate(response["body"])


def anthropic_error(line: dict[str, Any], status: int, type_: str) -> str:
    """An error a route answered: its status and Anthropic's error object; returns the message."""
    response = line["response"]
    assert response["status_code"] == status, line
    body = response["body"]
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == type_, body
    return str(body["error"]["message"])


def test_messages_lines_on_upstream_routes(upstream: Upstream, claude: Stub, tmp_path: Path) -> None:
    """Every upstream provider answers a Messages line through LiteLLM's Anthropic adapter (on OpenAI-wire
    providers, `openai/` included, its translation to chat completions sent by the pass-through; Anthropic's
    own Messages for `anthropic/`); retries are the Router's, errors Anthropic's, and usage counts in tokens and
    cost."""
    cfg = config(tmp_path / "c.yaml", upstream, claude)
    lines = [
        msg("openai", "gpt", "hello there", system="Answer briefly."),
        msg("priced", "priced", "one two three", stop_sequences=["END"]),
        msg("claude", "claude-now", "hi claude", metadata={"user_id": "u-1"}),
        msg("retried", "priced", "flaky #fail:503x1"),
        msg("bad", "priced", "no #fail:400"),
        msg("limited", "gpt", "slow down #fail:429"),
        msg("down", "priced", "down #fail:500"),
        msg("overloaded", "claude-now", "busy #fail:overloaded_error"),
        msg("timed-out", "impatient", "too slow #sleep:3000"),
    ]
    before = upstream.stats()["by_path"]
    claude_before = claude.stats().get("messages", 0)
    proc, out = run(tmp_path, cfg, lines, "--data-dir", str(tmp_path / "data"))

    for cid, text in (("openai", "hello there"), ("priced", "one two three"), ("claude", "hi claude"),
                      ("retried", "flaky #fail:503x1")):
        message = message_of(out[cid])
        assert [block.type for block in message.content] == ["text"]
        assert message.content[0].text == f"echo: {text}"  # type: ignore[union-attr]
        assert message.role == "assistant" and message.stop_reason == "end_turn"
        assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    after = upstream.stats()["by_path"]
    assert after.get("/v1/responses", 0) == before.get("/v1/responses", 0)
    assert after.get("/v1/chat/completions", 0) - before.get("/v1/chat/completions", 0) >= 7
    # anthropic/: its own Messages API (the overloaded line retried, as the Router retries a 529)
    assert claude.stats().get("messages", 0) - claude_before == 1 + 3
    assert {"user_id": "u-1"} in [p.get("metadata") for p in claude.stats()["params_seen"]]  # Anthropic's, sent

    assert "Injected failure 400" in anthropic_error(out["bad"], 400, "invalid_request_error")
    anthropic_error(out["limited"], 429, "rate_limit_error")
    anthropic_error(out["down"], 500, "api_error")
    assert "overloaded_error" in anthropic_error(out["overloaded"], 529, "overloaded_error")
    # no answer at all: no response, our code (as on every upstream line)
    assert out["timed-out"]["response"] is None and out["timed-out"]["error"]["code"] == "upstream_timeout"

    # usage: Anthropic's input_tokens/output_tokens are the tokens counted and priced
    db = sqlite3.connect(tmp_path / "data" / "batchyard.sqlite3")
    stats = {row[0]: row[1:] for row in db.execute(
        "SELECT route, completed, input_tokens, output_tokens, cost_usd FROM route_stats")}
    usages = [out[cid]["response"]["body"]["usage"] for cid in ("priced", "retried")]
    tokens_in, tokens_out = sum(u["input_tokens"] for u in usages), sum(u["output_tokens"] for u in usages)
    assert stats["priced"][:3] == (2, tokens_in, tokens_out)
    assert stats["priced"][3] == pytest.approx(tokens_in * PRICE_IN + tokens_out * PRICE_OUT)
    assert stats["gpt"][3] > 0 and stats["claude-now"][3] > 0  # LiteLLM's price map for the other two
    for leak in LEAKS:
        assert leak not in proc.stderr, proc.stderr


def test_a_line_carries_data_never_configuration(upstream: Upstream, claude: Stub, tmp_path: Path) -> None:
    """A Messages line takes the body fields Anthropic documents and nothing of LiteLLM's: a key, a URL, a
    mock, headers (LiteLLM's `extra_headers`, Anthropic's workspace and user profile) or metadata beyond
    Anthropic's `user_id` is that line's 400 under our code, sent nowhere; so is a line without
    `max_tokens`, or streamed."""
    cfg = config(tmp_path / "c.yaml", upstream, claude)
    lines = [
        msg("api_base", "gpt", "hi", api_base="http://127.0.0.1:9/v1"),
        msg("mock_response", "priced", "hi", mock_response="free tokens"),
        msg("extra_headers", "claude-now", "hi", extra_headers={"x-api-key": "stolen"}),
        # in the anthropic SDK's params type, but sent as headers: the operator's workspace, not a line's
        msg("workspace_id", "claude-now", "hi", workspace_id="wrkspc_someone_else"),
        msg("user_profile_id", "gpt", "hi", user_profile_id="profile-1"),
        req("no-max", "/v1/messages", model="gpt", messages=[{"role": "user", "content": "hi"}]),
        msg("streamed", "gpt", "hi", stream=True),
        msg("litellm-metadata", "priced", "hi", metadata={"user_id": "u-1", "tags": ["cheap"]}),
    ]
    before = upstream.stats()["requests"]
    _, out = run(tmp_path, cfg, lines)
    for name in ("api_base", "mock_response", "extra_headers", "workspace_id", "user_profile_id"):
        response = out[name]["response"]
        assert response["status_code"] == 400
        assert response["body"]["error"]["code"] == "unknown_parameter" and response["body"]["error"]["param"] == name
    assert out["no-max"]["response"]["body"]["error"]["code"] == "missing_required_parameter"
    assert out["streamed"]["response"]["body"]["error"]["code"] == "streaming_unsupported"
    # Anthropic's `metadata` is `user_id` alone (the claude line above sends one); more is LiteLLM's to read
    own = out["litellm-metadata"]["response"]["body"]["error"]
    assert (own["code"], own["param"]) == ("unsupported_parameter", "metadata")
    assert upstream.stats()["requests"] == before


def test_messages_lines_on_a_native_anthropic_route(upstream: Upstream, claude: Stub, tmp_path: Path) -> None:
    """On a native Anthropic route a Messages line goes into Anthropic's Message Batch as it is (the model the
    deployment names, nothing else changed) and its result comes back as Anthropic sent it; a chat line on the
    same route is still translated both ways; the tokens count at Anthropic's batch rates. Other providers'
    batch jobs take no Messages line: its 400."""
    cfg = config(tmp_path / "c.yaml", upstream, claude)
    params = {"system": "Be brief.", "stop_sequences": ["END"], "metadata": {"user_id": "u-1"},
              "service_tier": "auto"}
    lines = [
        msg("native", "claude-batch", "hello batch", **params),
        msg("native-errored", "claude-batch", "no #fail:overloaded_error"),
        req("native-chat", "/v1/chat/completions", model="claude-batch", max_tokens=16,
            messages=[{"role": "user", "content": "hello chat"}]),
        msg("openai-native", "openai-batch", "hello"),
        msg("native-refused", "claude-batch", "hi", api_key="sk-mine"),
    ]
    seen_before = len(claude.stats()["params_seen"])
    _, out = run(tmp_path, cfg, lines, "--data-dir", str(tmp_path / "data"))

    message = message_of(out["native"])
    assert message.content[0].text == "echo: hello batch"  # type: ignore[union-attr]
    assert message.model == "claude-haiku-4-5" and message.id.startswith("msg_")
    assert out["native"]["response"]["request_id"] == message.id
    assert "#fail:overloaded_error" in anthropic_error(out["native-errored"], 529, "overloaded_error")
    chat = out["native-chat"]["response"]
    assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"
    seen = claude.stats()["params_seen"][seen_before:]
    sent = next(p for p in seen if p["messages"][0]["content"] == "hello batch")
    assert sent == {"model": "claude-haiku-4-5", "max_tokens": 64,
                    "messages": [{"role": "user", "content": "hello batch"}], **params}
    assert len(seen) == 3  # the refused line went nowhere

    refused = out["openai-native"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["code"] == "unsupported_endpoint"
    assert refused["body"]["error"]["message"] == (
        "/v1/messages is not supported in openai batches; Anthropic's Messages run natively on anthropic/ "
        "deployments, in real time on any")
    own = out["native-refused"]["response"]["body"]["error"]
    assert (own["code"], own["param"]) == ("unknown_parameter", "api_key")

    # the Messages line's tokens count at Anthropic's batch rates
    db = sqlite3.connect(tmp_path / "data" / "batchyard.sqlite3")
    (tokens_in, tokens_out), = db.execute(
        "SELECT input_tokens, output_tokens FROM route_stats WHERE route = 'claude-batch'").fetchall()
    usage = out["native"]["response"]["body"]["usage"]
    chat_usage = chat["body"]["usage"]
    assert (tokens_in, tokens_out) == (usage["input_tokens"] + chat_usage["prompt_tokens"],
                                       usage["output_tokens"] + chat_usage["completion_tokens"])
    (data,), = db.execute("SELECT data FROM batches").fetchall()
    routes = json.loads(data)["routes"]
    assert routes["claude-batch"]["cost_usd"] == pytest.approx(tokens_in * HAIKU_BATCH[0] + tokens_out * HAIKU_BATCH[1])
    assert len(routes["claude-batch"]["upstream_batch_ids"]) == 2  # the Messages lines' batch, the chat line's


def test_the_server_runs_messages_lines_in_its_pipeline(upstream: Upstream, claude: Stub, tmp_path: Path) -> None:
    """The server's Message Batch (the front door hands on these lines) runs through the same workers and
    finalizer: the messages as the providers' adapters gave them, Anthropic's errors for the rest."""
    lines = [json.loads(msg("ok", "priced", "served")), json.loads(msg("bad", "priced", "no #fail:400")),
             json.loads(msg("claude", "claude-now", "hi"))]
    config = {"model_list": [
        {"model_name": "priced", "litellm_params": {"model": "hosted_vllm/house-model", "api_base": upstream.v1_url}},
        {"model_name": "claude-now", "litellm_params": {"model": "anthropic/claude-haiku-4-5", "api_key": "sk-ant",
                                                        "api_base": claude.url}},
    ], "router_settings": {"num_retries": 0}}
    with start_gateway(config, tmp_path / "data") as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="none", max_retries=0)
        batch = client.messages.batches.create(
            requests=[{"custom_id": x["custom_id"], "params": x["body"]} for x in lines])  # type: ignore[misc]
        done = eventually(lambda: (b := client.messages.batches.retrieve(batch.id)).processing_status == "ended"
                          and b, 60, "the Message Batch to end")
        assert (done.request_counts.succeeded, done.request_counts.errored) == (2, 1)
        results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert results["ok"].type == "succeeded" and results["ok"].message.content[0].text == "echo: served"  # type: ignore[union-attr]
    assert results["claude"].type == "succeeded" and results["claude"].message.id.startswith("msg_")  # type: ignore[union-attr]
    assert results["bad"].type == "errored" and results["bad"].error.error.type == "invalid_request_error"  # type: ignore[union-attr]
