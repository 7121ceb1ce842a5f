"""One file through `batchyard run --config` over every native provider at once: OpenAI, Azure OpenAI, Anthropic,
Mistral, the Gemini API, Vertex AI and Amazon Bedrock batch jobs on their stand-ins (Bedrock's over moto's S3,
Vertex's over gcp-storage-emulator; `tests.support.native_config.StandIns`), and real-time lines on the
loopback upstream. Each line comes back once, in input order, as a `chat.completion`; each native route went as
its provider's batch job and is priced at its batch rate in the summary. (Local lines are in
tests/engine/test_native_mixed.py, which needs vLLM.)"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.stub_process import REPO_ROOT
from tests.support.native_config import NATIVE_MODELS, ROLE, StandIns
from tests.support.services import process_env

UPSTREAM_MODEL = {**NATIVE_MODELS, "gpt-fast": "gpt-4o"}
NATIVE = list(NATIVE_MODELS)


@pytest.fixture(scope="module")
def servers() -> Iterator[StandIns]:
    with StandIns(batch_delay=0.3) as stand_ins:
        yield stand_ins


def test_one_file_over_every_native_provider_and_real_time(servers: StandIns, tmp_path: Path) -> None:
    config = tmp_path / "native.yaml"
    config.write_text(servers.config(extra=f"""  - model_name: gpt-fast
    litellm_params: {{model: openai/gpt-4o, api_base: "{servers.upstream.v1_url}", api_key: sk-o}}
"""))
    routes = [*NATIVE, "gpt-fast"] * 3 + ["bedrock-bulk"] * 97  # Bedrock's job takes 100 records at least
    lines = []
    for i, route in enumerate(routes, 1):
        body = {"model": route, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 8}
        lines.append({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config",
                           str(config), "--no-progress"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env=servers.env())
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
        assert servers.stubs[name].stats()["batch_requests"] == count, name  # one job each, every line in it
    assert servers.upstream.stats()["batches_created"] == 2  # OpenAI's job and Azure's
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
