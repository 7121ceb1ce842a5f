"""Provider extras and operator settings only where the config allows them; media fetched from no one's network.

On a local route a line's body goes through vLLM's own request models: a field they lack is refused (vLLM
would ignore it), and the fields that override what the operator set for the engine (`chat_template`,
`vllm_xargs`, ...) are refused unless `model_info.allowed_params` lists them. On an upstream route a
provider extra (`top_k`) passes only where the operator lists it. A media URL is fetched only from a host
in `model_info.allowed_media_domains`, and never from a private or loopback address, listed or not.
Run with `batchyard run --config` on the tiny Llama and the loopback upstream.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway.config.schema import parse_config
from gateway.errors import ConfigError
from tests.fakes.upstream.server import Upstream
from tests.support.engine_helpers import ENGINE_MARKS, REPO, built_tiny_models, engine_env

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def media_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback server that stands for an internal service a team wants the gateway to read."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"secret")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def _line(cid: str, model: str, content: Any = "hello", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def _image(url: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]


@pytest.mark.parametrize("_", [pytest.param(None, marks=ENGINE_MARKS)])
def test_extras_settings_and_media_on_local_and_upstream_routes(
    _: None, upstream: Upstream, media_server: tuple[str, list[str]], tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    models = built_tiny_models(tmp_path_factory)
    port, hits = media_server
    config = tmp_path / "config.yaml"
    config.write_text(f"""
model_list:
  - model_name: tiny
    litellm_params: {{model: "vllm/{models.llama}"}}
    engine_args: {{max_model_len: 256, dtype: float32, enforce_eager: true, max_num_seqs: 8,
                  trust_request_chat_template: true}}  # vLLM asks for both
    model_info: {{allowed_params: [chat_template], allowed_media_domains: [localhost]}}
  - model_name: gpt
    litellm_params: {{model: openai/gpt, api_key: sk-op, api_base: "{upstream.v1_url}"}}
  - model_name: gpt-extras
    litellm_params: {{model: openai/gpt-extras, api_key: sk-op, api_base: "{upstream.v1_url}",
                      max_parallel_requests: 8}}
    model_info: {{allowed_params: [top_k], allowed_media_domains: [localhost]}}
""")
    lines = [
        _line("local-plain", "tiny"),
        _line("local-vllm-sampling", "tiny", top_k=5, min_tokens=1),  # vLLM's documented request fields
        _line("local-template-allowed", "tiny", chat_template=TEMPLATE),
        _line("local-xargs-not-allowed", "tiny", vllm_xargs={"k": 1}),
        _line("local-unknown", "tiny", api_base="http://127.0.0.1:1/v1"),
        _line("local-media-unlisted", "tiny", _image(f"http://127.0.0.1:{port}/a.png")),
        _line("local-media-loopback", "tiny", _image(f"http://localhost:{port}/a.png")),
        _line("up-topk-not-allowed", "gpt", top_k=5),
        _line("up-topk-allowed", "gpt-extras", top_k=5),
        _line("up-media-loopback", "gpt-extras", _image(f"http://localhost:{port}/b.png")),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config",
                           str(config), "--no-progress"], cwd=REPO, env=engine_env(LITELLM_LOCAL_MODEL_COST_MAP="True"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {x["custom_id"]: x["response"] for x in map(json.loads, out.read_text().splitlines())}

    def error(cid: str) -> dict[str, Any]:
        assert got[cid]["status_code"] == 400, got[cid]
        return dict(got[cid]["body"]["error"])

    for cid in ("local-plain", "local-vllm-sampling", "local-template-allowed", "up-topk-allowed"):
        assert got[cid]["status_code"] == 200, (cid, got[cid])
    assert error("local-xargs-not-allowed")["code"] == "unsupported_parameter"
    assert error("local-xargs-not-allowed")["param"] == "vllm_xargs"
    assert error("local-unknown") == {"message": "Unrecognized request argument supplied: api_base",
                                      "type": "invalid_request_error", "param": "api_base", "code": "unknown_parameter"}
    assert error("up-topk-not-allowed")["param"] == "top_k"
    for cid in ("local-media-unlisted", "local-media-loopback", "up-media-loopback"):
        assert error(cid)["code"] == "media_url_not_allowed", got[cid]
        assert error(cid)["param"] == "messages[0].content[1].image_url.url"
    assert "not allowed for this model" in error("local-media-unlisted")["message"]
    assert "loopback" in error("local-media-loopback")["message"]
    assert hits == [], "the gateway fetched a team's URL"
    assert upstream.stats()["by_model"].get("gpt", 0) == 0  # the refused line was never sent


@pytest.mark.parametrize(("case", "entry", "needle"), [
    ("a LiteLLM setting as an allowed extra",
     {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini"},
      "model_info": {"allowed_params": ["top_k", "api_base", "mock_response"]}}, "api_base, mock_response"),
    ("media hosts with a scheme",
     {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini"},
      "model_info": {"allowed_media_domains": ["https://images.example.com"]}}, "bare lower-case host"),
    ("vLLM's media domains in engine_args",
     {"model_name": "tiny", "litellm_params": {"model": "vllm/models/tiny"},
      "engine_args": {"allowed_media_domains": ["example.com"]}}, "belongs in model_info"),
])
def test_the_config_refuses_what_would_reopen_the_boundary(case: str, entry: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"model_list": [entry]}, Path("team.yaml"))
    assert needle in str(raised.value), (case, str(raised.value))
