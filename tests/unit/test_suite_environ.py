"""The suite's environment restore keeps what LiteLLM's import set: without `TIKTOKEN_CACHE_DIR` a later count of
an OpenAI model's tokens downloads tiktoken's encoding, which CI cannot reach."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import environ


def test_a_restore_keeps_the_encodings_litellm_pointed_at() -> None:
    code = """
import os
from tests.support import environ
saved = dict(os.environ)
saved.pop("TIKTOKEN_CACHE_DIR", None)
os.environ.pop("TIKTOKEN_CACHE_DIR", None)
from litellm import token_counter
token_counter(model="gpt-4", text="hi")  # its encoding module sets TIKTOKEN_CACHE_DIR to the bundled encodings
os.environ["BATCHYARD_TEST_SET"] = "1"
environ.restore(saved)
assert "BATCHYARD_TEST_SET" not in os.environ
print(token_counter(model="gpt-4o-mini", text="hello world"))  # o200k_base: read from the bundle, not fetched
"""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9"}  # a download would fail at once
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2"


def test_a_restore_puts_back_the_rest() -> None:
    saved = dict(os.environ)
    os.environ["BATCHYARD_TEST_ADDED"] = "x"
    environ.restore(saved)
    assert os.environ == saved
