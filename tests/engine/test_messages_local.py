"""Anthropic's Messages lines (`url: /v1/messages`) on a local route: vLLM's own Anthropic serving layer.

One `batchyard run` on the tiny Llama (one engine for the module), its file mixing Messages lines that run,
lines the gateway refuses before the engine sees them, and lines vLLM answers with an error. A succeeded
line's body is an Anthropic `message` (the `anthropic` SDK's own type validates it); an error the engine
answered is Anthropic's error object; a field the local route cannot honour is refused under our code.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.support.engine_helpers import ENGINE_MARKS, REPO, built_tiny_models, engine_env

pytestmark = ENGINE_MARKS
PRICE_IN, PRICE_OUT = 1e-6, 2e-6


def msg(cid: str, text: str | list[dict[str, Any]], model: str = "tiny", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": text}], **extra}
    return {"custom_id": cid, "method": "POST", "url": "/v1/messages", "body": body}


LINES = [
    msg("plain", "Hello world!"),
    msg("shaped", "Say pong.", system="You answer in one word.", temperature=0, top_k=1, stop_sequences=["\n\n"]),
    {"custom_id": "turns", "method": "POST", "url": "/v1/messages", "body": {
        "model": "tiny", "max_tokens": 4, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "One?"}]},
                     {"role": "assistant", "content": "Two."},
                     {"role": "user", "content": [{"type": "text", "text": "Three?"}]}]}},
    msg("short", "Count to a hundred, slowly.", max_tokens=1),
    {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}},
    msg("anthropic-only", "hi", service_tier="auto"),  # Anthropic's field; vLLM's layer has no such thing
    msg("operator", "hi", vllm_xargs={"x": 1}),  # vLLM's own, but the operator's to allow
    msg("too-long", "hi", max_tokens=100_000),  # past the engine's context: vLLM's 400
    {"custom_id": "bad-role", "method": "POST", "url": "/v1/messages",
     "body": {"model": "tiny", "max_tokens": 8, "messages": [{"role": "tool", "content": "hi"}]}},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Any]], Path]:
    """The file run once, on one engine: each line's output by custom_id, and the run's data directory."""
    models = built_tiny_models(tmp_path_factory)
    tmp = tmp_path_factory.mktemp("messages-local")
    config = tmp / "c.yaml"
    config.write_text(f"""
model_list:
  - model_name: tiny
    litellm_params: {{model: "vllm/{models.llama}"}}
    engine_args: {{max_model_len: 256, dtype: float32, enforce_eager: true, max_num_seqs: 16}}
    model_info: {{input_cost_per_token: {PRICE_IN}, output_cost_per_token: {PRICE_OUT}}}
""")
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in LINES))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config", str(config),
         "--data-dir", str(tmp / "data"), "--no-progress"],
        cwd=REPO, env=engine_env(LITELLM_LOCAL_MODEL_COST_MAP="True"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [x["custom_id"] for x in LINES]
    return {r["custom_id"]: r for r in results}, tmp / "data"


def message_of(line: dict[str, Any]) -> anthropic.types.Message:
    response = line["response"]
    assert response["status_code"] == 200, line
    assert {"stop_reason", "stop_sequence"} <= set(response["body"])
    return anthropic.types.Message.model_validate(response["body"])


def test_messages_run_on_the_local_engine(run: tuple[dict[str, dict[str, Any]], Path]) -> None:
    """vLLM's Anthropic layer turns each body into the engine's request (system prompt, content blocks,
    turns, sampling, stop sequences) and the reply into a `message` with Anthropic's usage."""
    out, _ = run
    for cid in ("plain", "shaped", "turns", "short"):
        message = message_of(out[cid])
        assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
        assert [block.type for block in message.content] == ["text"]
        assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 8
    short = message_of(out["short"])
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 1
    chat = out["chat"]["response"]  # an OpenAI line in the same file is still OpenAI's
    assert chat["status_code"] == 200 and chat["body"]["object"] == "chat.completion"


def test_what_the_local_route_cannot_honour_is_refused(run: tuple[dict[str, dict[str, Any]], Path]) -> None:
    """A field vLLM's Anthropic layer does not take, or one that is the operator's, is that line's 400 under
    our code before the engine sees it; a body vLLM refuses gets Anthropic's `invalid_request_error`."""
    out, _ = run
    for cid, code, param in (("anthropic-only", "unknown_parameter", "service_tier"),
                             ("operator", "unsupported_parameter", "vllm_xargs")):
        response = out[cid]["response"]
        assert response["status_code"] == 400
        assert (response["body"]["error"]["code"], response["body"]["error"]["param"]) == (code, param)
    for cid in ("too-long", "bad-role"):
        response = out[cid]["response"]
        assert response["status_code"] == 400, out[cid]
        body = response["body"]
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


def test_messages_usage_counts(run: tuple[dict[str, dict[str, Any]], Path]) -> None:
    """A `message`'s input_tokens and output_tokens are the tokens the route's stats and its cost count."""
    out, data = run
    ok = [x["response"]["body"] for x in out.values() if x["response"]["status_code"] == 200]
    tokens_in = sum(b["usage"].get("input_tokens", b["usage"].get("prompt_tokens", 0)) for b in ok)
    tokens_out = sum(b["usage"].get("output_tokens", b["usage"].get("completion_tokens", 0)) for b in ok)
    db = sqlite3.connect(data / "batchyard.sqlite3")
    (completed, stats_in, stats_out, cost), = db.execute(
        "SELECT completed, input_tokens, output_tokens, cost_usd FROM route_stats WHERE route = 'tiny'").fetchall()
    assert (completed, stats_in, stats_out) == (len(ok), tokens_in, tokens_out)
    assert cost == pytest.approx(tokens_in * PRICE_IN + tokens_out * PRICE_OUT)
