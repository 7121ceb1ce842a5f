"""Upstream routes end to end: moderations and images, provider errors as sent, prices, litellm_settings.

The real `batchyard run` (and `batchyard serve`) against the loopback upstream, LiteLLM in between.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.cli_in_process import batchyard
from tests.support.server_helpers import gateway_config, read_jsonl, start_gateway, submit, wait_batch

REPO = Path(__file__).resolve().parents[2]
PRICE_IN, PRICE_OUT = 0.001, 0.002
LEAKS = ("Unclosed client session", "Unclosed connector", "Task was destroyed", "coroutine was never awaited")


def write_config(path: Path, up: Upstream, extra: str = "", router: str = "{num_retries: 2, retry_after: 0}") -> Path:
    path.write_text(f"""
model_list:
  - model_name: gpt-4o-mini
    litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-test, api_base: "{up.v1_url}"}}
  - model_name: priced
    litellm_params: {{model: openai/house-model, api_key: sk-test, api_base: "{up.v1_url}"}}
    model_info: {{input_cost_per_token: {PRICE_IN}, output_cost_per_token: {PRICE_OUT}}}
  - model_name: moderation
    litellm_params: {{model: openai/omni-moderation-latest, api_key: sk-test, api_base: "{up.v1_url}"}}
  - model_name: painter
    litellm_params: {{model: azure/painter, api_key: az-test, api_base: "{up.url}", api_version: "2024-10-21"}}
  - model_name: vllm-llama
    litellm_params: {{model: hosted_vllm/llama, api_base: "{up.v1_url}"}}
  - model_name: azure-chat
    litellm_params: {{model: azure/chat, api_key: az-test, api_base: "{up.url}", api_version: "2024-10-21"}}
  - model_name: nowhere
    litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-test, api_base: "http://127.0.0.1:9/v1"}}
  - model_name: impatient
    litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-test, api_base: "{up.v1_url}", timeout: 0.5}}
router_settings: {router}
{extra}
""")
    return path


def req(cid: str, url: str, **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def chat(cid: str, model: str, text: str) -> str:
    return req(cid, "/v1/chat/completions", model=model, messages=[{"role": "user", "content": text}])


def run(tmp: Path, cfg: Path, lines: list[str], *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONWARNINGS": "always::ResourceWarning"}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config", str(cfg),
         "--no-progress", *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [json.loads(x)["custom_id"] for x in lines]
    return proc, {r["custom_id"]: r for r in results}


def run_here(capsys: pytest.CaptureFixture[str], tmp: Path, cfg: Path,
             lines: list[str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`run`, called as a function (tests/support/cli_in_process.py: LiteLLM's imports paid once), for the cases
    that read only the output; the one that checks every client session is closed at exit keeps the process."""
    src, out = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    proc = batchyard(capsys, "run", "-i", str(src), "-o", str(out), "--config", str(cfg), "--no-progress",
                     env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [json.loads(x)["custom_id"] for x in lines]
    return proc, {r["custom_id"]: r for r in results}


def test_moderations_and_images_in_a_mixed_file(upstream: Upstream, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    lines = [
        chat("chat", "gpt-4o-mini", "hello there"),
        req("mod-v1", "/v1/moderations", model="moderation", input="they attack at dawn"),
        req("mod-bare", "/moderations", model="moderation", input=["a calm day", "attack"]),
        req("mod-azure-v1", "/openai/v1/moderations", model="moderation", input="a calm day"),
        req("img-v1", "/v1/images/generations", model="painter", prompt="a red cat", n=2),
        req("img-deployment", "/openai/deployments/painter/images/generations?api-version=2024-10-21",
            prompt="a blue dog"),
        req("img-bad-n", "images/generations", model="painter", prompt="too many", n=11),
        chat("priced", "priced", "one two three"),
    ]
    before = upstream.stats()["by_path"]
    proc, out = run(tmp_path, cfg, lines, "--data-dir", str(tmp_path / "data"))

    assert out["chat"]["response"]["body"]["choices"][0]["message"]["content"] == "echo: hello there"
    flagged = out["mod-v1"]["response"]["body"]["results"]
    assert out["mod-v1"]["response"]["status_code"] == 200 and [r["flagged"] for r in flagged] == [True]
    assert flagged[0]["categories"]["violence"] is True
    assert [r["flagged"] for r in out["mod-bare"]["response"]["body"]["results"]] == [False, True]
    assert out["mod-azure-v1"]["response"]["body"]["results"][0]["flagged"] is False
    images = out["img-v1"]["response"]["body"]
    assert out["img-v1"]["response"]["status_code"] == 200 and len(images["data"]) == 2
    assert all(d["b64_json"] and d["revised_prompt"] == "a red cat" for d in images["data"])
    assert out["img-deployment"]["response"]["body"]["data"][0]["revised_prompt"] == "a blue dog"
    bad = out["img-bad-n"]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["param"] == "n"  # the provider's own error object
    after = upstream.stats()["by_path"]
    assert after.get("/v1/moderations", 0) - before.get("/v1/moderations", 0) == 3
    azure_images = "/openai/deployments/painter/images/generations"
    assert after.get(azure_images, 0) - before.get(azure_images, 0) >= 3  # the bad n may be retried

    # cost: the configured prices times the provider's token counts; LiteLLM's price map for gpt-4o-mini
    db = sqlite3.connect(tmp_path / "data" / "batchyard.sqlite3")
    stats = {row[0]: row[1:] for row in db.execute("SELECT route, completed, cost_usd FROM route_stats")}
    usage = out["priced"]["response"]["body"]["usage"]
    expected = usage["prompt_tokens"] * PRICE_IN + usage["completion_tokens"] * PRICE_OUT
    assert stats["priced"][0] == 1 and stats["priced"][1] == pytest.approx(expected)
    assert stats["gpt-4o-mini"][1] > 0
    for leak in LEAKS:  # every LiteLLM client session closed at exit
        assert leak not in proc.stderr, proc.stderr


def test_provider_errors_reach_the_caller_as_sent(upstream: Upstream, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    lines = [
        chat("openai-400", "gpt-4o-mini", "bad #fail:400"),
        chat("vllm-400", "vllm-llama", "bad #fail:400"),
        chat("azure-403", "azure-chat", "no #fail:403"),
        chat("vllm-500", "vllm-llama", "down #fail:500"),
        req("emb-bad", "/v1/embeddings", model="gpt-4o-mini"),  # no input: OpenAI's missing-parameter error, no call
        chat("unreachable", "nowhere", "hello"),
        chat("timeout", "impatient", "slow #sleep:3000"),
    ]
    _, out = run_here(capsys, tmp_path, cfg, lines)
    for cid, status in [("openai-400", 400), ("vllm-400", 400), ("azure-403", 403), ("vllm-500", 500)]:
        response = out[cid]["response"]
        expected = {"message": f"Injected failure {status} (#fail directive).",
                    "type": "invalid_request_error" if status == 400 else
                    ("permission_error" if status == 403 else "server_error"),
                    "param": None, "code": {400: "bad_request", 403: "forbidden", 500: None}[status]}
        assert response["status_code"] == status, out[cid]
        assert response["body"] == {"error": expected}, out[cid]
    emb = out["emb-bad"]["response"]
    assert emb["status_code"] == 400
    assert emb["body"]["error"]["param"] == "input" and emb["body"]["error"]["code"] == "missing_required_parameter"
    assert out["unreachable"]["response"] is None
    assert out["unreachable"]["error"]["code"] == "upstream_unreachable"
    assert out["timeout"]["response"] is None and out["timeout"]["error"]["code"] == "upstream_timeout"
    text = json.dumps(out)
    assert "litellm" not in text.lower() and "model group" not in text and "Exception -" not in text


def test_litellm_settings_take_effect(upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # router_settings name neither timeout nor num_retries: litellm_settings decide them
    cfg = write_config(tmp_path / "c.yaml", upstream, router="{retry_after: 0}",
                       extra="litellm_settings: {request_timeout: 0.5, num_retries: 0, drop_params: false}")
    lines = [chat("slow", "gpt-4o-mini", "slow #sleep:3000"),
             chat("flaky", "gpt-4o-mini", "settings flaky #fail:503x1 #count"),
             chat("fine", "gpt-4o-mini", "fine")]
    _, out = run_here(capsys, tmp_path, cfg, lines)
    assert out["slow"]["error"]["code"] == "upstream_timeout"  # request_timeout 0.5 s, not our 600 s
    assert out["flaky"]["response"]["status_code"] == 503  # num_retries 0: not retried (ours would be 3)
    assert upstream.stats()["by_custom"]["settings flaky #fail:503x1 #count"] == 1
    assert out["fine"]["response"]["status_code"] == 200


def test_server_accepts_moderation_and_image_batches(upstream: Upstream, tmp_path: Path) -> None:
    config = gateway_config(upstream, models=("gpt-mini", "omni-moderation-latest", "gpt-azure"))
    with start_gateway(config, tmp_path / "data") as gw:
        client = gw.client(None)
        mod = submit(client, [req("m1", "/v1/moderations", model="omni-moderation-latest", input="attack")],
                     endpoint="/v1/moderations")
        img = submit(client, [req("i1", "/images/generations", model="gpt-mini", prompt="a cat")],
                     endpoint="/v1/images/generations")
        for batch, check in [(mod, lambda b: b["results"][0]["flagged"] is True),
                             (img, lambda b: b["data"][0]["revised_prompt"] == "a cat")]:
            done = wait_batch(client, batch.id)
            assert done.status == "completed", done
            [line] = read_jsonl(client, done.output_file_id)
            assert line["response"]["status_code"] == 200 and check(line["response"]["body"])
        wrong = gw.http("POST", "/v1/batches", json={"input_file_id": mod.input_file_id,
                                                     "endpoint": "/v1/images/variations", "completion_window": "24h"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "endpoint"


@pytest.mark.asyncio
async def test_aclose_closes_every_client(upstream: Upstream) -> None:
    import litellm

    from gateway.config.schema import parse_config
    from gateway.domain import BatchRequest, Endpoint
    from providers.litellm_backend import LiteLLMBackend

    # m and v take the pass-through (our sessions); t LiteLLM's completion path (its cached clients)
    entries = [{"model_name": "m", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-test",
                                                      "api_base": upstream.v1_url}},
               {"model_name": "v", "litellm_params": {"model": "hosted_vllm/llama", "api_base": upstream.v1_url}},
               {"model_name": "t", "litellm_params": {"model": "mistral/mistral-small", "api_key": "sk-test",
                                                      "api_base": upstream.v1_url}}]
    routes = list(parse_config({"model_list": entries}).routes.values())
    backend = LiteLLMBackend(routes, {"num_retries": 0}, 8)
    requests = [BatchRequest(line=i + 1, custom_id=f"c{i}", url=Endpoint.CHAT,
                             body={"model": "mvt"[i % 3], "messages": [{"role": "user", "content": f"hi {i}"}]})
                for i in range(6)]
    results = [r async for r in backend.execute(requests)]
    assert sorted(r.status_code or 0 for r in results) == [200] * 6
    clients = [getattr(c, "_client", None) or getattr(c, "client", None)
               for c in litellm.in_memory_llm_clients_cache.cache_dict.values()]
    open_clients = [c for c in clients if c is not None and hasattr(c, "is_closed") and not c.is_closed]
    assert open_clients  # LiteLLM cached the clients it made for these calls
    sessions = list(backend._wire._sessions.values()) if backend._wire else []
    # m and v are two deployments on one host: one pool of connections (a session per host)
    assert len(sessions) == 1 and all(s is not None and not s.closed for s in sessions)
    await backend.aclose()
    assert all(c.is_closed for c in open_clients)
    assert all(s is not None and s.closed for s in sessions)
    assert not litellm.in_memory_llm_clients_cache.cache_dict  # a later start makes fresh ones


def test_litellm_s_own_failure_is_said_as_litellm_said_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """LiteLLM raises its catch-all APIConnectionError for a credential file it cannot read: no byte went out,
    nothing was unreachable. The line keeps LiteLLM's words and names the provider."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model_list:\n  - model_name: gem\n    litellm_params: {model: vertex_ai/gemini-2.0-flash, "
                   "vertex_credentials: /nonexistent/creds.json, vertex_project: p, vertex_location: us-central1}\n"
                   "router_settings: {num_retries: 0}\n")
    _, out = run_here(capsys, tmp_path, cfg, [chat("creds", "gem", "hello")])
    response = out["creds"]["response"]
    assert response["status_code"] == 500, out
    error = response["body"]["error"]
    assert error["code"] == "upstream_error" and error["provider"] == "vertex_ai"
    assert error["exception"] == "APIConnectionError"
    assert error["message"] == ("vertex_ai: Unable to load the vertex credentials file. LiteLLM's log names the path "
                                "and the reason.")


def test_image_edits_in_their_json_form_run_on_a_wire_route(upstream: Upstream, tmp_path: Path) -> None:
    """`/v1/images/edits` (OpenAI's JSON form): images by file id or data: URL reach the provider as written; a URL
    the gateway's own network would fetch is held to the media-URL rule (the loopback upstream is internal); the
    multipart form's `image` is no field of the JSON form."""
    cfg = write_config(tmp_path / "c.yaml", upstream)
    edit = "/v1/images/edits"
    lines = [
        req("by-id", edit, model="painter", prompt="make it red", images=[{"file_id": "file-cat"}]),
        req("by-data", "images/edits", model="gpt-4o-mini", prompt="a hat", n=2,
            images=[{"image_url": "data:image/png;base64,iVBORw0KGgo="}], mask={"file_id": "file-mask"}),
        req("by-url", edit, model="painter", prompt="blue", images=[{"image_url": "https://img.example.com/c.png"}]),
        req("no-images", edit, model="painter", prompt="blue"),
        req("multipart-field", edit, model="painter", prompt="blue", images=[{"file_id": "f"}], image="cat.png"),
    ]
    before = upstream.stats()["by_path"]
    _, out = run(tmp_path, cfg, lines)
    assert out["by-id"]["response"]["status_code"] == 200
    assert out["by-id"]["response"]["body"]["data"][0]["revised_prompt"] == "make it red"
    assert len(out["by-data"]["response"]["body"]["data"]) == 2
    refused = {cid: out[cid]["response"]["body"]["error"] for cid in ("by-url", "no-images", "multipart-field")}
    assert all(out[cid]["response"]["status_code"] == 400 for cid in refused)
    assert refused["by-url"]["param"] == "images[0].image_url" and "img.example.com" in refused["by-url"]["message"]
    assert "images" in refused["no-images"]["message"]  # the required field, named
    assert "image" in refused["multipart-field"]["message"]
    after = upstream.stats()["by_path"]
    deployment = "/openai/deployments/painter/images/edits"
    assert after.get(deployment, 0) - before.get(deployment, 0) == 1  # only the line that passed every check
    assert after.get("/v1/images/edits", 0) - before.get("/v1/images/edits", 0) == 1
