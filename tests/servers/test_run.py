"""`batchyard run` end to end: the real command, a real loopback upstream, LiteLLM in between."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.bucket import Bucket
from tests.fakes.upstream.server import Upstream
from tests.support.cli_in_process import batchyard

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "tests" / "data" / "seeds"  # copies of ../shared/seeds: the public documents we started from
BATCHYARD = [sys.executable, "-m", "gateway.cli"]


def write_config(path: Path, upstream: Upstream, extra: str = "") -> Path:
    path.write_text(
        f"""
model_list:
  - model_name: gpt-4o-mini
    litellm_params: {{model: openai/gpt-4o-mini, api_key: os.environ/TEST_OPENAI_KEY, api_base: "{upstream.v1_url}"}}
  - model_name: gpt-4o
    litellm_params:
      model: azure/my-gpt4o
      api_base: "{upstream.url}"
      api_key: az-test
      api_version: "2024-10-21"
  - model_name: embed
    litellm_params: {{model: openai/text-embedding-3-small, api_key: sk-test, api_base: "{upstream.v1_url}"}}
  - model_name: meta-llama/Meta-Llama-3-8B-Instruct
    litellm_params: {{model: hosted_vllm/llama, api_base: "{upstream.v1_url}"}}
  - model_name: REPLACE-WITH-MODEL-DEPLOYMENT-NAME
    litellm_params: {{model: azure/replace, api_base: "{upstream.url}", api_key: az, api_version: "2024-10-21"}}
router_settings: {{num_retries: 3, retry_after: 0}}
{extra}
"""
    )
    return path


def line(cid: str, model: str | None, text: str = "hi", url: str = "/v1/chat/completions", **body: Any) -> str:
    b: dict[str, Any] = {"messages": [{"role": "user", "content": text}], **body}
    if model is not None:
        b["model"] = model
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": b})


Runner = Callable[..., subprocess.CompletedProcess[bytes]]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "TEST_OPENAI_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run([*BATCHYARD, "run", *args], cwd=REPO, env=env, input=stdin, capture_output=True, timeout=300)


@pytest.fixture()
def run_here(capsys: pytest.CaptureFixture[str]) -> Runner:
    """`run` called as a function (tests/support/cli_in_process.py: LiteLLM's imports paid once per worker), where
    a case reads only the exit status, stderr and files: the same environment and directory as `run`. The
    cases of stdin/stdout and of the exit status after a failed upload keep the subprocess."""
    def call(*args: str) -> subprocess.CompletedProcess[bytes]:
        env = {"TEST_OPENAI_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        done = batchyard(capsys, "run", *args, env=env, cwd=REPO)
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.encode(), done.stderr.encode())
    return call


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_mixed_models_and_url_forms(upstream: Upstream, tmp_path: Path, run_here: Runner) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    lines = [
        line("openai-v1", "gpt-4o-mini", "one"),
        line("azure-deployment", None, "two", url="/openai/deployments/gpt-4o/chat/completions"),
        line("unknown", "no-such-model", "three"),
        line("azure-bare", "gpt-4o", "four", url="/chat/completions"),
        line("openai-v1-form", "gpt-4o-mini", "five", url="/openai/v1/chat/completions"),
        line("no-slash", "gpt-4o-mini", "six", url="chat/completions"),
        json.dumps({"custom_id": "emb", "method": "POST", "url": "/embeddings",
                    "body": {"model": "embed", "input": "seven"}}),
        json.dumps({"custom_id": "cmp", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "gpt-4o-mini", "prompt": "eight"}}),
        json.dumps({"custom_id": "resp", "method": "POST", "url": "/v1/responses",
                    "body": {"model": "gpt-4o-mini", "input": "nine"}}),
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    before = upstream.stats()["requests"]
    proc = run_here("-i", str(src), "-o", str(out), "--config", str(cfg), "--no-progress")
    assert proc.returncode == 0, proc.stderr.decode()
    results = read_jsonl(out)
    assert [r["custom_id"] for r in results] == [json.loads(x)["custom_id"] for x in lines]
    by_id = {r["custom_id"]: r for r in results}
    for cid, text in [("openai-v1", "one"), ("azure-deployment", "two"), ("azure-bare", "four"),
                      ("openai-v1-form", "five"), ("no-slash", "six")]:
        resp = by_id[cid]["response"]
        assert resp["status_code"] == 200
        assert resp["body"]["choices"][0]["message"]["content"] == f"echo: {text}"
        assert by_id[cid]["id"].startswith("batch_req_") and by_id[cid]["error"] is None
    assert by_id["azure-deployment"]["response"]["body"]["model"] == "my-gpt4o"  # reached at the Azure path
    assert by_id["emb"]["response"]["body"]["data"][0]["object"] == "embedding"
    assert by_id["cmp"]["response"]["body"]["choices"][0]["text"] == "echo: eight"
    assert by_id["resp"]["response"]["body"]["object"] == "response"
    unknown = by_id["unknown"]["response"]
    assert unknown["status_code"] == 404
    assert unknown["body"]["error"]["code"] == "model_not_found"
    # the unknown model made no upstream call
    assert "no-such-model" not in upstream.stats()["by_model"]
    assert upstream.stats()["requests"] - before >= len(lines) - 1
    stats = upstream.stats()["by_path"]
    assert stats.get("/openai/deployments/my-gpt4o/chat/completions", 0) >= 2
    summary = proc.stderr.decode()
    assert "9 requests" in summary and "no-such-model" in summary and "tokens:" in summary


def test_provider_errors_are_per_line(upstream: Upstream, tmp_path: Path, run_here: Runner) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        line("retry", "gpt-4o-mini", "flaky #fail:429x2 #count"),
        line("boom", "gpt-4o-mini", "always #fail:500"),
        line("bad", "gpt-4o-mini", "bad #fail:400"),
        line("fine", "gpt-4o-mini", "fine"),
    ]))
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    proc = run_here("-i", str(src), "-o", str(out), "--error-file", str(errors), "--config", str(cfg), "--no-progress")
    assert proc.returncode == 0, proc.stderr.decode()
    ok = {r["custom_id"]: r for r in read_jsonl(out)}
    failed = {r["custom_id"]: r for r in read_jsonl(errors)}
    assert set(ok) == {"retry", "fine"} and set(failed) == {"boom", "bad"}
    assert upstream.stats()["by_custom"]["flaky #fail:429x2 #count"] == 3  # two 429s, then success
    assert failed["boom"]["response"]["status_code"] == 500
    assert failed["bad"]["response"]["status_code"] == 400
    assert failed["bad"]["response"]["body"]["error"]["code"] == "bad_request"  # the provider's own body


def test_seed_examples(upstream: Upstream, tmp_path: Path, run_here: Runner) -> None:
    """The example lines of the documents the product started from run as they are."""
    cfg = write_config(tmp_path / "c.yaml", upstream)
    lines: list[str] = []
    for seed in sorted(SEEDS.glob("*")):
        for raw in seed.read_text(encoding="utf-8").splitlines():
            raw = raw.strip()
            if raw.startswith('{"custom_id"') and '"url": "/v1/score"' not in raw:
                try:
                    data = json.loads(raw)
                except ValueError:
                    continue  # a line the page itself cut short
                data["custom_id"] = f"{seed.stem}-{len(lines)}"
                if data["url"] == "/v1/embeddings":
                    data["body"]["model"] = "embed"
                lines.append(json.dumps(data))
    assert len(lines) >= 10
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines))
    out = tmp_path / "out.jsonl"
    proc = run_here("-i", str(src), "-o", str(out), "--config", str(cfg), "--no-progress")
    assert proc.returncode == 0, proc.stderr.decode()
    results = read_jsonl(out)
    assert [r["custom_id"] for r in results] == [json.loads(x)["custom_id"] for x in lines]
    assert all(r["response"]["status_code"] == 200 for r in results)


def test_order_and_exactly_once_on_5000_lines(upstream: Upstream, tmp_path: Path, run_here: Runner) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream, "batch_settings: {shard_size: 300}")
    src = tmp_path / "in.jsonl"
    models = ["gpt-4o-mini", "gpt-4o", "embed", "nope"]
    with src.open("w") as f:
        for i in range(5000):
            m = models[i % 4]
            if m == "embed":
                f.write(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
                                    "body": {"model": m, "input": f"t{i}"}}) + "\n")
            else:
                f.write(line(f"c{i}", m, f"#sleep:{i % 7} n{i}") + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_here("-i", str(src), "-o", str(out), "--config", str(cfg), "--no-progress")
    assert proc.returncode == 0, proc.stderr.decode()
    results = read_jsonl(out)
    assert [r["custom_id"] for r in results] == [f"c{i}" for i in range(5000)]
    assert len({r["id"] for r in results}) == 5000
    assert sum(r["response"]["status_code"] == 404 for r in results) == 1250


@pytest.fixture()
def bucket() -> Iterator[Bucket]:
    server = Bucket()
    yield server
    server.close()


def test_http_input_and_presigned_put_output(upstream: Upstream, tmp_path: Path, bucket: Bucket,
                                            run_here: Runner, caplog: pytest.LogCaptureFixture) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    bucket.store["/in.jsonl"] = "\n".join(line(f"u{i}", "gpt-4o-mini", f"x{i}") for i in range(20)).encode()
    bucket.fail_puts = 2  # retried with backoff; only a 2xx counts
    proc = run_here("-i", f"{bucket}/in.jsonl?X-Amz-Signature=secret",
                    "-o", f"{bucket}/out.jsonl?X-Amz-Signature=secret", "--config", str(cfg), "--no-progress")
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(x) for x in bucket.store["/out.jsonl"].decode().splitlines()]
    assert [r["custom_id"] for r in out] == [f"u{i}" for i in range(20)]
    assert all(n is not None for n in bucket.lengths)  # S3 needs Content-Length, not chunked
    assert b"secret" not in proc.stderr  # a presigned URL's signature is a credential
    assert "secret" not in caplog.text  # nor logged


def test_failed_upload_keeps_results_locally(upstream: Upstream, tmp_path: Path, bucket: Bucket) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    src = tmp_path / "in.jsonl"
    src.write_text(line("k1", "gpt-4o-mini", "keep me"))
    bucket.fail_puts = 100
    env_cwd = tmp_path
    proc = subprocess.run(
        [*BATCHYARD, "run", "-i", str(src), "-o", f"{bucket}/out.jsonl", "--config", str(cfg), "--no-progress"],
        cwd=env_cwd, env={**os.environ, "TEST_OPENAI_KEY": "k", "PYTHONPATH": str(REPO)},
        capture_output=True, timeout=300,
    )
    assert proc.returncode == 3, proc.stderr.decode()
    kept = list(tmp_path.glob("batchyard-*-output.jsonl"))
    assert len(kept) == 1 and "keep me" in kept[0].read_text()
    assert str(kept[0]) in proc.stderr.decode()


def test_stdin_and_stdout(upstream: Upstream, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", upstream)
    data = ("\ufeff" + line("s1", "gpt-4o-mini", "a") + "\r\n\r\n" + line("s2", "gpt-4o", "b") + "\r\n").encode()
    proc = run("-i", "-", "-o", "-", "--config", str(cfg), "-q", stdin=data)
    assert proc.returncode == 0, proc.stderr.decode()
    out = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    assert [r["custom_id"] for r in out] == ["s1", "s2"]
