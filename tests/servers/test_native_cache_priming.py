"""A primed prompt cache on Anthropic's native route, against the Anthropic stand-in with its cache accounting
(tests/fakes/stubs_anthropic.py): before a Message Batch whose lines share a `cache_control` prefix, one
real-time request per distinct shared prefix writes it; the job's requests then read it. The priming's cost is
in the team's ledger and in the batch's `routes`. Nothing is mocked: the pipeline runs in this process, the
stand-in in its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.schema import load_config, parse_config
from gateway.domain import BatchStatus
from gateway.errors import ConfigError
from gateway.runtime.runtime import open_embedded
from tests.fakes.stub_process import Stub, start_stub

TEAM = "cachers"
ROUTE = "claude-cached"
# real-time USD per token; the stand-in's cache reads are priced 0.1x the input, writes 1.25x (Anthropic's)
INPUT, OUTPUT = 1e-6, 5e-6
PRICES = {"input_cost_per_token": INPUT, "output_cost_per_token": OUTPUT,
          "cache_read_input_token_cost": INPUT / 10, "cache_creation_input_token_cost": INPUT * 1.25}
SYSTEM_A = "You answer as a careful librarian would. " * 40  # 280 words: the stand-in's tokens
SYSTEM_B = "You answer in the voice of a ship's captain. " * 30


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    started = start_stub("tests.fakes.stubs_anthropic", ["--batch-delay", "0.3"])
    try:
        yield started
    finally:
        started.stop()


def config_file(stub: Stub, tmp_path: Path, **info: Any) -> Path:
    config = {"model_list": [{"model_name": ROUTE, "litellm_params": {
        "model": "anthropic/claude-haiku-4-5", "api_base": stub.url, "api_key": "sk-a"}, "model_info": {
        "batch_mode": "native", "native_poll_initial_seconds": 0.1, "native_poll_max_seconds": 0.2, **PRICES,
        **info}}],
        "batch_settings": {"teams": [{"team_id": TEAM, "api_keys": ["sk-cachers"]}]}}
    path = tmp_path / "cached.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral",
                                                                                             "ttl": "1h"}}]}


async def lines(bodies: list[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    for i, messages in enumerate(bodies):
        body = {"model": ROUTE, "max_tokens": 16, "messages": messages}
        yield json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": body}).encode() + b"\n"


def job(count_a: int, count_b: int) -> list[list[dict[str, Any]]]:
    """`count_a` lines under system prompt A, `count_b` under B, one under a prefix no other line shares and one
    that marks nothing."""
    bodies = [[system(SYSTEM_A), {"role": "user", "content": f"question a{i}"}] for i in range(count_a)]
    bodies += [[system(SYSTEM_B), {"role": "user", "content": f"question b{i}"}] for i in range(count_b)]
    bodies.append([system("A prompt of its own."), {"role": "user", "content": "alone"}])
    bodies.append([{"role": "user", "content": "nothing cached"}])
    return bodies


async def run(config: Path, tmp_path: Path, bodies: list[list[dict[str, Any]]]) -> tuple[Any, float]:
    pipeline = await open_embedded(load_config(str(config)), tmp_path / "data")
    try:
        await pipeline.start()
        source = await pipeline.service.upload_file(TEAM, "in.jsonl", "batch", lines(bodies))
        batch = await pipeline.service.create_batch(TEAM, input_file_id=source.id, endpoint="/v1/chat/completions",
                                                    completion_window="24h")
        done = await asyncio.wait_for(pipeline.service.wait(batch.id), 60)
        spent = await pipeline.store.quota.spend(TEAM, 0)
    finally:
        await pipeline.aclose()
    assert done.status is BatchStatus.COMPLETED and done.counts.completed == len(bodies), (done.status, done.counts)
    return done, spent


def tokens(text: str) -> int:
    return len(text.split())  # the stand-in's count


async def test_each_shared_prefix_is_primed_once_before_the_job_and_its_cost_is_in_the_ledger(
    stub: Stub, tmp_path: Path
) -> None:
    stub.reset()
    done, spent = await run(config_file(stub, tmp_path), tmp_path, job(5, 3))
    stats = stub.stats()
    # two real-time requests (prefixes A and B, shared), then the one job of all ten lines; the lone prefix and
    # the line that marks nothing are not primed
    assert sorted(stats["arrivals"][:2]) == ["message:claude-haiku-4-5"] * 2
    assert stats["arrivals"][2:] == ["batch:10"]
    primes = [p for p in stats["params_seen"] if p["max_tokens"] == 1]
    assert len(primes) == 2 and sorted(p["system"][0]["text"] for p in primes) == sorted([SYSTEM_A, SYSTEM_B])
    # every line under A and B read the cache the priming wrote; the lone one wrote its own
    a, b = tokens(SYSTEM_A), tokens(SYSTEM_B)
    assert stats["cache_read_tokens"] == 5 * a + 3 * b
    assert stats["cache_write_tokens"] == a + b + tokens("A prompt of its own.")
    # the priming's cost at real-time rates: its prefix written (1.25x), the filler message, one reply
    prime_cost = sum(t * INPUT * 1.25 + tokens(".") * INPUT + tokens("echo: .") * OUTPUT for t in (a, b))
    summary = done.routes[ROUTE]
    assert summary["cache_primes"] == 2
    assert summary["prime_cost_usd"] == pytest.approx(prime_cost, rel=1e-9)
    # the ledger: the batch's lines at batch rates (half the real-time ones) plus the priming
    assert spent == pytest.approx(summary["cost_usd"], rel=1e-9)
    lines_cost = summary["cost_usd"] - summary["prime_cost_usd"]
    read = (5 * a + 3 * b) * INPUT / 10 / 2
    assert lines_cost > read and spent == pytest.approx(lines_cost + prime_cost, rel=1e-9)


async def test_prime_cache_false_sends_no_request_before_the_job(stub: Stub, tmp_path: Path) -> None:
    stub.reset()
    done, spent = await run(config_file(stub, tmp_path, prime_cache=False), tmp_path, job(4, 2))
    stats = stub.stats()
    assert stats["arrivals"] == ["batch:8"]  # no real-time request: the job's requests each write the cache
    assert stats.get("cache_read_tokens", 0) == 0
    assert stats["cache_write_tokens"] == (4 * tokens(SYSTEM_A) + 2 * tokens(SYSTEM_B)
                                           + tokens("A prompt of its own."))
    assert done.routes[ROUTE]["cache_primes"] == 0 and done.routes[ROUTE]["prime_cost_usd"] is None
    assert spent == pytest.approx(done.routes[ROUTE]["cost_usd"], rel=1e-9)


async def test_a_job_primed_costs_less_than_one_not_primed(stub: Stub, tmp_path: Path) -> None:
    """The point of priming: 8 lines sharing a long prefix read it at 0.1x rather than each write it at 1.25x."""
    costs = {}
    for prime in (True, False):
        stub.reset()
        bodies = [[system(SYSTEM_A), {"role": "user", "content": f"question {i}"}] for i in range(8)]
        _, costs[prime] = await run(config_file(stub, tmp_path, prime_cache=prime), tmp_path / str(prime), bodies)
    assert costs[True] < costs[False] / 2, costs


@pytest.mark.parametrize(("entry", "words"), [
    ({"litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "k"},
      "model_info": {"batch_mode": "native", "prime_cache": False}}, "not a setting of a openai/ deployment"),
    ({"litellm_params": {"model": "anthropic/claude-haiku-4-5", "api_key": "k"},
      "model_info": {"prime_cache": False}}, "not a setting here"),
])
def test_prime_cache_is_refused_where_nothing_reads_it(entry: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match="prime_cache") as caught:
        parse_config({"model_list": [{"model_name": "m", **entry}]})
    assert words in str(caught.value)
