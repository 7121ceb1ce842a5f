"""Media URLs in every shape LiteLLM fetches (issue 45, Must 6), on a wire route and on a translated one.

LiteLLM 1.110.2 fetches a URL found in a chat `file` part's `file.file_id` or `file.file_data`, in a `file`
given as a plain string, in the part's own `file_data`, and in the Responses API's `input_file.file_data` and
`file_id` (its Gemini, Vertex, Anthropic and Bedrock translations); an internal wire route's server may fetch
them too. Each shape, naming the cloud metadata address, is the line's `media_url_not_allowed` with the
param that holds it, before anything is sent, on an internal OpenAI-wire pass-through route (`openai/` at the
loopback upstream) and on a route LiteLLM translates (`anthropic/`); the shapes checked before (an
`image_url`, an `input_file.file_url`, a Messages `source.url`) still are. An id (`file-abc`) and a `data:` URL
are no fetch: such a line reaches the upstream. Run with `batchyard run --config` on the recording loopback
upstream (its per-model counts say what reached it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fakes.upstream.server import Upstream
from tests.servers.test_upstream_routes import req, run

METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"


def _chat(part: dict[str, Any]) -> dict[str, Any]:
    return {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": "read this"}, part]}]}


def _responses(part: dict[str, Any]) -> dict[str, Any]:
    return {"max_output_tokens": 16,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "read this"}, part]}]}


# (name, url, body, the param named)
SHAPES: list[tuple[str, str, dict[str, Any], str]] = [
    ("file.file_id", "/v1/chat/completions", _chat({"type": "file", "file": {"file_id": METADATA}}),
     "messages[0].content[1].file.file_id"),
    ("file.file_data", "/v1/chat/completions", _chat({"type": "file", "file": {"file_data": METADATA}}),
     "messages[0].content[1].file.file_data"),
    ("file as a string", "/v1/chat/completions", _chat({"type": "file", "file": METADATA}),
     "messages[0].content[1].file"),
    ("the part's file_data", "/v1/chat/completions", _chat({"type": "file", "file_data": METADATA}),
     "messages[0].content[1].file_data"),
    ("input_file.file_data", "/v1/responses", _responses({"type": "input_file", "file_data": METADATA}),
     "input[0].content[1].file_data"),
    ("input_file.file_id", "/v1/responses", _responses({"type": "input_file", "file_id": METADATA}),
     "input[0].content[1].file_id"),
    ("input_file.file_url", "/v1/responses", _responses({"type": "input_file", "file_url": METADATA}),
     "input[0].content[1].file_url"),
    ("image_url as a string", "/v1/responses", _responses({"type": "input_image", "image_url": METADATA}),
     "input[0].content[1].image_url"),
    ("image_url.url", "/v1/chat/completions", _chat({"type": "image_url", "image_url": {"url": METADATA}}),
     "messages[0].content[1].image_url.url"),
]
ROUTES = {"wire": "media-wire", "translated": "media-translated"}


def test_every_shape_litellm_fetches_is_checked_on_wire_and_translated_routes(upstream: Upstream,
                                                                              tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"""
model_list:
  - model_name: wire
    litellm_params: {{model: openai/media-wire, api_key: sk-op, api_base: "{upstream.v1_url}"}}
  - model_name: translated
    litellm_params: {{model: anthropic/media-translated, api_key: sk-op, api_base: "{upstream.url}"}}
router_settings: {{num_retries: 0, retry_after: 0}}
""")
    lines = [req(f"{route}-{i}", url, model=route, **body)
             for route in ROUTES for i, (_, url, body, _) in enumerate(SHAPES)]
    ids = {"type": "file", "file": {"file_id": "file-abc", "file_data": "data:application/pdf;base64,JVBERi0="}}
    lines.append(req("wire-id-and-data", "/v1/chat/completions", model="wire", **_chat(ids)))
    _, got = run(tmp_path, cfg, lines)

    for route in ROUTES:
        for i, (shape, _, _, param) in enumerate(SHAPES):
            response = got[f"{route}-{i}"]["response"]
            assert response is not None and response["status_code"] == 400, (route, shape, got[f"{route}-{i}"])
            error = response["body"]["error"]
            assert error["code"] == "media_url_not_allowed", (route, shape, error)
            assert error["param"] == param and "169.254.169.254" in error["message"], (route, shape, error)
    assert got["wire-id-and-data"]["response"]["status_code"] == 200, got["wire-id-and-data"]
    seen = upstream.stats()["by_model"]
    # nothing refused reached the upstream: on the wire route only the line of an id and inline bytes did
    assert seen.get("media-wire", 0) == 1 and seen.get("media-translated", 0) == 0, seen
