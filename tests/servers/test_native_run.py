"""One file through `batchyard run --config` over every native provider at once: OpenAI, Anthropic, Mistral, the
Gemini API, Vertex AI and Amazon Bedrock batch jobs on their stand-ins (Bedrock's over moto's S3, Vertex's over
gcp-storage-emulator), and real-time lines on the
loopback upstream. Each line comes back once, in input order, as a `chat.completion`; each native route went as
its provider's batch job and is priced at its batch rate in the summary. (Local lines are in
tests/engine/test_native_mixed.py, which needs vLLM.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.stub_process import REPO_ROOT, Stub, start_stub
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.gcs import GcsEmulator, service_account_json, service_account_key
from tests.support.services import S3_ENV, MotoS3, process_env

ROLE = "arn:aws:iam::123456789012:role/batchyard-bedrock"
UPSTREAM_MODEL = {"claude-bulk": "claude-haiku-4-5", "mistral-bulk": "mistral-small-latest",
                  "gemini-bulk": "gemini-2.5-flash-lite", "bedrock-bulk": "anthropic.claude-3-5-haiku-20241022-v1:0",
                  "vertex-bulk": "gemini-2.5-flash", "gpt-bulk": "gpt-4o-mini", "gpt-fast": "gpt-4o"}
NATIVE = ["claude-bulk", "mistral-bulk", "gemini-bulk", "vertex-bulk", "bedrock-bulk", "gpt-bulk"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    moto = MotoS3("batchyard-run").start()
    gcs = GcsEmulator("batchyard-run").start()
    private, public = service_account_key(tmp_path_factory.mktemp("sa"))
    stubs: dict[str, Stub] = {}
    try:
        for name, module in (("anthropic", "stubs_anthropic"), ("mistral", "stubs_mistral"),
                             ("gemini", "stubs_gemini")):
            stubs[name] = start_stub(f"tests.fakes.{module}", ["--batch-delay", "0.3"])
        stubs["bedrock"] = start_stub("tests.fakes.stubs_bedrock", ["--batch-delay", "0.3", "--s3-endpoint", moto.url])
        stubs["vertex"] = start_stub("tests.fakes.stubs_vertex", ["--batch-delay", "0.3", "--gcs-endpoint", gcs.url,
                                                                  "--public-key", str(public)])
        with start_upstream(batch_delay=0.3) as upstream:
            yield {**stubs, "upstream": upstream, "s3": moto, "gcs": gcs, "key": private}
    finally:
        for stub in stubs.values():
            stub.stop()
        moto.close()
        gcs.close()


def test_one_file_over_every_native_provider_and_real_time(servers: dict[str, Any], tmp_path: Path) -> None:
    upstream: Upstream = servers["upstream"]
    moto: MotoS3 = servers["s3"]
    gcs: GcsEmulator = servers["gcs"]
    vertex_key = service_account_json(servers["key"], f"{servers['vertex'].url}/token", "batchyard-test")
    native = "batch_mode: native, native_poll_max_seconds: 0.2"
    config = tmp_path / "native.yaml"
    config.write_text(f"""
model_list:
  - model_name: claude-bulk
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_base: "{servers['anthropic'].url}", api_key: sk-a}}
    model_info: {{{native}}}
  - model_name: mistral-bulk
    litellm_params: {{model: mistral/mistral-small-latest, api_base: "{servers['mistral'].url}/v1", api_key: sk-m}}
    model_info: {{{native}}}
  - model_name: gemini-bulk
    litellm_params: {{model: gemini/gemini-2.5-flash-lite, api_base: "{servers['gemini'].url}", api_key: g-key}}
    model_info: {{{native}}}
  - model_name: bedrock-bulk
    litellm_params: {{model: "bedrock/{UPSTREAM_MODEL['bedrock-bulk']}", aws_region_name: us-east-1}}
    model_info: {{{native}, native_s3_bucket: {moto.bucket}, native_role_arn: "{ROLE}"}}
  - model_name: vertex-bulk
    litellm_params: {{model: vertex_ai/gemini-2.5-flash, api_base: "{servers['vertex'].url}",
                      vertex_project: batchyard-test, vertex_credentials: {json.dumps(vertex_key)}}}
    model_info: {{{native}, native_gcs_bucket: {gcs.bucket}}}
  - model_name: gpt-bulk
    litellm_params: {{model: openai/gpt-4o-mini, api_base: "{upstream.v1_url}", api_key: sk-o}}
    model_info: {{{native}}}
  - model_name: gpt-fast
    litellm_params: {{model: openai/gpt-4o, api_base: "{upstream.v1_url}", api_key: sk-o}}
""")
    routes = [*NATIVE, "gpt-fast"] * 3 + ["bedrock-bulk"] * 97  # Bedrock's job takes 100 records at least
    lines = []
    for i, route in enumerate(routes, 1):
        body = {"model": route, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8}
        lines.append({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = process_env({**S3_ENV, "AWS_ENDPOINT_URL_S3": moto.url, "AWS_ENDPOINT_URL_BEDROCK": servers["bedrock"].url,
                       "STORAGE_EMULATOR_HOST": gcs.url})
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config",
                           str(config), "--no-progress"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in got] == [x["custom_id"] for x in lines]  # input order, each once
    for line, sent in zip(got, lines, strict=True):
        route = sent["body"]["model"]
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == UPSTREAM_MODEL[route], body
        assert body["choices"][0]["message"]["content"] == f"echo: {sent['body']['messages'][0]['content']}"
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
    for name, count in (("anthropic", 3), ("mistral", 3), ("gemini", 3), ("vertex", 3), ("bedrock", 100)):
        assert servers[name].stats()["batch_requests"] == count, name  # one job each, every line in it
    for route in NATIVE:
        assert f"{route}: native, upstream batches " in proc.stderr, proc.stderr

    # The summary's route table: Gemini and Vertex at LiteLLM's *_batches prices, Bedrock at its real-time ones halved.
    import litellm

    table = proc.stderr[proc.stderr.index("  route "):].splitlines()[1:1 + len(NATIVE) + 1]
    rows = {cells[0]: cells[1:] for cells in (row.split() for row in table)}
    priced = (("gemini-bulk", "gemini/gemini-2.5-flash-lite"), ("vertex-bulk", "gemini-2.5-flash"),
              ("bedrock-bulk", UPSTREAM_MODEL["bedrock-bulk"]))
    for route, key in priced:
        price = litellm.model_cost[key]
        rate_in = price.get("input_cost_per_token_batches") or price["input_cost_per_token"] / 2
        rate_out = price.get("output_cost_per_token_batches") or price["output_cost_per_token"] / 2
        usage = [x["response"]["body"]["usage"] for x, s in zip(got, lines, strict=True) if s["body"]["model"] == route]
        tokens_in, tokens_out = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
        assert rows[route][1:3] == [str(tokens_in), str(tokens_out)], rows
        assert float(rows[route][3]) == pytest.approx(tokens_in * rate_in + tokens_out * rate_out, abs=1e-6)


def test_dry_run_shows_gemini_vertex_and_bedrock_at_batch_prices(tmp_path: Path) -> None:
    """`--dry-run` contacts nobody: the low cost is the input tokens at the batch input rate (LiteLLM's
    `*_batches` price for Gemini and Vertex, the real-time one halved for Bedrock)."""
    import litellm

    config = tmp_path / "dry.yaml"
    config.write_text(f"""
model_list:
  - model_name: gemini-bulk
    litellm_params: {{model: gemini/gemini-2.5-flash-lite, api_key: g-key}}
    model_info: {{batch_mode: native}}
  - model_name: bedrock-bulk
    litellm_params: {{model: "bedrock/{UPSTREAM_MODEL['bedrock-bulk']}"}}
    model_info: {{batch_mode: native, native_s3_bucket: b, native_role_arn: "{ROLE}"}}
  - model_name: vertex-bulk
    litellm_params: {{model: vertex_ai/gemini-2.5-flash, vertex_project: p}}
    model_info: {{batch_mode: native, native_gcs_bucket: b}}
""")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": route, "max_tokens": 100, "messages": [{"role": "user", "content": "hello there friend"}]}}) + "\n"
        for i, route in enumerate(["gemini-bulk", "bedrock-bulk", "vertex-bulk"])))
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp_path / "o.jsonl"),
                           "--config", str(config), "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env=process_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {cells[0]: cells for cells in (line.split() for line in (proc.stdout + proc.stderr).splitlines()) if cells}
    gemini = litellm.model_cost["gemini/gemini-2.5-flash-lite"]
    bedrock = litellm.model_cost[UPSTREAM_MODEL["bedrock-bulk"]]
    vertex = litellm.model_cost["gemini-2.5-flash"]
    for route, rate_in in (("gemini-bulk", gemini["input_cost_per_token_batches"]),
                           ("vertex-bulk", vertex["input_cost_per_token_batches"]),
                           ("bedrock-bulk", bedrock["input_cost_per_token"] / 2)):
        cells = rows[route]
        assert cells[1] == "native" and float(cells[6]) == pytest.approx(int(cells[3]) * rate_in), cells
