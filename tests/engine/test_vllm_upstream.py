"""A real `vllm serve` (the tiny Llama, CPU) as a `hosted_vllm/` upstream of `batchyard run`.

vLLM's own error replies must reach the output line as vLLM sent them (status,
message, param, code), and the run must leave no unclosed client session behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.engine_helpers import built_tiny_models
from tests.support.waiting import free_port

REPO = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 512  # the tiny Llama's max_position_embeddings

pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (the engine extra) is not installed"),
]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    models = built_tiny_models(tmp_path_factory, reranker=False)
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core as vLLM ships it
    log = tempfile.NamedTemporaryFile(prefix="vllm-serve-", suffix=".log", delete=False)  # noqa: SIM115
    # float32: bfloat16 (vLLM's CPU default) kills the engine core on the tiny Llama here
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models.llama),
           "--served-model-name", "tiny-llama", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
           "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {proc.returncode}:\n{Path(log.name).read_text()[-4000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve not ready in 300 s:\n{Path(log.name).read_text()[-4000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.unlink(log.name)


def test_vllm_errors_as_vllm_sent_them(vllm_url: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
model_list:
  - model_name: team-llama
    litellm_params: {{model: hosted_vllm/tiny-llama, api_base: "{vllm_url}/v1"}}
router_settings: {{num_retries: 1, retry_after: 0}}
""")
    def line(cid: str, **body: object) -> str:
        payload = {"model": "team-llama", "messages": [{"role": "user", "content": "Hello world"}], **body}
        return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": payload})

    lines = [line("too-long", max_tokens=5000), *(line(f"ok-{i}", max_tokens=2) for i in range(60))]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out),
                           "--config", str(cfg), "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(results) == len(lines)

    # What vLLM itself answers, asked directly
    direct = httpx.post(f"{vllm_url}/v1/chat/completions", timeout=60, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 5000})
    assert direct.status_code == 400
    vllm_error = direct.json()["error"]

    bad = results["too-long"]["response"]
    assert bad["status_code"] == 400
    error = bad["body"]["error"]
    assert error["param"] == "max_tokens" and error["code"] == vllm_error["code"] and error["code"] is not None
    assert error["message"] == vllm_error["message"] and "max_tokens" in error["message"]
    assert "litellm" not in error["message"].lower() and "model group" not in error["message"]
    for i in range(60):
        assert results[f"ok-{i}"]["response"]["status_code"] == 200, results[f"ok-{i}"]
    assert "Unclosed client session" not in proc.stderr and "Unclosed connector" not in proc.stderr, proc.stderr
