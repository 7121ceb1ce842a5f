"""Teams share a local-engine route fairly (a real `batchyard serve`, embedded, with a worker process running
the tiny Llama on vLLM's CPU engine; the OpenAI SDK is the client).

- A newcomer team's small batch finishes long before a big batch that another team started first: the
  engine's window goes to it as slots free, and vLLM's priority scheduling runs its requests before the
  ones the big batch has waiting inside the engine.
- A team alone on the route gets the whole engine: its window is full.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_helpers import ENGINE_MARKS, built_tiny_models
from tests.support.server_helpers import Gateway, start_gateway, submit
from tests.support.team_helpers import done, finished, metric, until

pytestmark = ENGINE_MARKS
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MODEL = "tiny"
RUNNING = 4  # max_num_seqs
WINDOW = 2 * RUNNING  # the engine's submission window (the default: twice max_num_seqs)
SLOW = 300  # seconds: a loaded 2-core machine loads the engine and runs these batches slowly
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = built_tiny_models(tmp_path_factory)
    engine_args = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": RUNNING}
    config: dict[str, Any] = {
        "model_list": [{"model_name": MODEL, "litellm_params": {"model": f"vllm/{models.llama}"},
                        "engine_args": engine_args}],
        "general_settings": {"master_key": "sk-admin"},
        "batch_settings": {"teams": TEAMS, "shard_size": 40},
    }
    with start_gateway(config, tmp_path_factory.mktemp("engine-teams") / "data") as server:
        warm = submit(server.client("sk-alpha"), _lines(1, "warm"))  # the worker loads the engine on first use
        assert until(server, "sk-alpha", warm.id, finished, timeout=SLOW).status == "completed", server.log()[-3000:]
        yield server


def _lines(n: int, tag: str, max_tokens: int = 8) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                      "messages": [{"role": "user", "content": f"{tag} {i}"}]}}
            for i in range(n)]


def test_a_newcomers_small_batch_finishes_long_before_a_big_one_started_first(gateway: Gateway) -> None:
    # Long answers (max_model_len is 256): the small batch's way through the API, validation and a worker's claim
    # takes the same second or two however fast the engine is, and the big one must not get halfway meanwhile.
    big = submit(gateway.client("sk-alpha"), _lines(400, "big", max_tokens=200))
    until(gateway, "sk-alpha", big.id, lambda b: done(b) >= WINDOW, timeout=SLOW)  # alpha fills the engine
    small = submit(gateway.client("sk-beta"), _lines(4, "small"))
    small_done = until(gateway, "sk-beta", small.id, finished, timeout=SLOW)
    big_now = gateway.client("sk-alpha").batches.retrieve(big.id)
    assert small_done.status == "completed" and small_done.request_counts is not None
    assert small_done.request_counts.completed == 4
    assert not finished(big_now) and done(big_now) < 400 / 2, big_now.request_counts
    gateway.client("sk-alpha").batches.cancel(big.id)
    until(gateway, "sk-alpha", big.id, finished, timeout=SLOW)


def test_a_team_alone_gets_the_whole_engine(gateway: Gateway) -> None:
    # Long answers, so the window stays full for a while however fast or loaded the machine is.
    alone = submit(gateway.client("sk-beta"), _lines(80, "alone", max_tokens=64))
    seen, polls = 0.0, 0
    deadline = time.monotonic() + SLOW
    while seen < WINDOW:
        seen = max(seen, metric(gateway, "batchyard_team_requests_in_flight", team="beta", route=MODEL) or 0.0)
        polls += 1
        if polls % 10 == 0 and finished(gateway.client("sk-beta").batches.retrieve(alone.id)):
            break
        assert time.monotonic() < deadline
    batch = until(gateway, "sk-beta", alone.id, finished, timeout=SLOW)
    assert batch.status == "completed"
    assert seen == WINDOW  # work-conserving: the whole window, nothing kept back for teams with no work
