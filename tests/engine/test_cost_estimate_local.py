"""`batchyard run --dry-run` on a local route: its input tokens counted with the model's own tokenizer and chat
template, its output bound the engine's context less the input, at the route's `model_info` prices; the engine
is never started (the tokenizer alone is read from the model's directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.engine_helpers import ENGINE_MARKS, REPO, built_tiny_models
from tests.support.server_helpers import chat_line, jsonl

pytestmark = ENGINE_MARKS
PRICE = 1e-4  # USD per token, in and out
CONTEXT = 256


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_tiny_models(tmp_path_factory, reranker=False).llama


def test_dry_run_counts_a_local_route_with_its_own_tokenizer(tiny_llama: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer  # the reference count: the model's own tokenizer and chat template

    config: dict[str, Any] = {"model_list": [{
        "model_name": "tiny", "litellm_params": {"model": f"vllm/{tiny_llama}"},
        "engine_args": {"max_model_len": CONTEXT},
        "model_info": {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}}]}
    lines = [chat_line(f"t{i}", "tiny", f"tell me about the number {i} " * (i + 1)) for i in range(3)]
    lines.append(chat_line("capped", "tiny", "short", max_tokens=10))
    cfg, inp, out = tmp_path / "config.yaml", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    cfg.write_text(yaml.safe_dump(config))
    inp.write_bytes(jsonl(lines))
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(inp), "-o", str(out), "--config",
                           str(cfg), "--dry-run", "-q"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert not out.exists()

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama))
    counts = [len(tokenizer.encode(tokenizer.apply_chat_template(line["body"]["messages"], add_generation_prompt=True,
                                                                 tokenize=False), add_special_tokens=False))
              for line in lines]
    bound = sum(CONTEXT - n for n in counts[:3]) + 10  # the context less the input, or the line's own max_tokens
    rows = {cells[0]: cells for line in proc.stdout.splitlines() if (cells := line.split())}
    assert rows["tiny"][:6] == ["tiny", "local", "4", str(sum(counts)), "exact", str(bound)]
    assert float(rows["tiny"][6]) == pytest.approx(sum(counts) * PRICE, abs=1e-6)
    assert float(rows["tiny"][7]) == pytest.approx((sum(counts) + bound) * PRICE, abs=1e-6)
