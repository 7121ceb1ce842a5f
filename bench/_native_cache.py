"""`bench/native_providers.py`'s cache part: a job whose lines share a long system prompt, primed against not.

The Anthropic stand-in (tests/fakes/stubs_anthropic.py) counts tokens as whitespace words and keeps Anthropic's
cache rules (a batch's requests read only what was written before it); the route's prices are Anthropic's
ratios on a round input price: cache reads 0.1x, writes 1.25x, a batch at half of each.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.stub_process import Stub, start_stub

TEAM = "bench"
ROUTE = "claude-cached"
INPUT, OUTPUT = 1e-6, 5e-6  # real-time USD per token
PRICES = {"input_cost_per_token": INPUT, "output_cost_per_token": OUTPUT,
          "cache_read_input_token_cost": INPUT * 0.1, "cache_creation_input_token_cost": INPUT * 1.25}
SYSTEM_TOKENS = 2000


async def _lines(count: int) -> AsyncIterator[bytes]:
    system = " ".join(f"rule{i}" for i in range(SYSTEM_TOKENS))  # 2,000 of the stand-in's tokens
    for i in range(count):
        body = {"model": ROUTE, "max_tokens": 16, "messages": [
            {"role": "system", "content": [{"type": "text", "text": system,
                                            "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
            {"role": "user", "content": f"question number {i}"}]}
        yield json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": body}).encode() + b"\n"


async def _run(stub: Stub, lines: int, prime: bool, tmp: Path) -> tuple[float, dict[str, Any]]:
    from gateway.config.schema import load_config
    from gateway.runtime.pool import declare_native_providers
    from gateway.runtime.runtime import open_embedded

    declare_native_providers()
    config = {"model_list": [{"model_name": ROUTE, "litellm_params": {
        "model": "anthropic/claude-haiku-4-5", "api_base": stub.url, "api_key": "sk-a"}, "model_info": {
        "batch_mode": "native", "native_poll_initial_seconds": 0.2, "native_poll_max_seconds": 0.5,
        "prime_cache": prime, **PRICES}}],
        "batch_settings": {"teams": [{"team_id": TEAM, "api_keys": ["sk-bench"]}]}}
    path = tmp / f"cache-{prime}.yaml"
    path.write_text(yaml.safe_dump(config))
    pipeline = await open_embedded(load_config(str(path)), tmp / f"data-{prime}")
    try:
        await pipeline.start()
        source = await pipeline.service.upload_file(TEAM, "in.jsonl", "batch", _lines(lines))
        batch = await pipeline.service.create_batch(TEAM, input_file_id=source.id, endpoint="/v1/chat/completions",
                                                    completion_window="24h")
        done = await asyncio.wait_for(pipeline.service.wait(batch.id), 600)
        spent = await pipeline.store.quota.spend(TEAM, 0)
    finally:
        await pipeline.aclose()
    if done.counts.completed != lines:
        raise SystemExit(f"{done.counts.failed} of {lines} lines failed")
    return spent, done.routes[ROUTE]


def cache_costs(lines: int) -> None:
    """Print the cost of one job of `lines` lines sharing a 2,000-token system prompt, primed and not."""
    print(f"\nthe primed prompt cache: one job of {lines} lines on the Anthropic stand-in")
    stub = start_stub("tests.fakes.stubs_anthropic", ["--batch-delay", "0.5"])
    rows = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for prime in (True, False):
                stub.reset()
                spent, route = asyncio.run(_run(stub, lines, prime, Path(tmp)))
                stats = stub.stats()
                rows[prime] = spent
                label = "primed    " if prime else "not primed"
                print(f"  {label}  ledger ${spent:.6f}   priming requests {route.get('cache_primes', 0)} "
                      f"(${route.get('prime_cost_usd') or 0:.6f})   stand-in cache reads "
                      f"{stats.get('cache_read_tokens', 0):,} tokens, writes {stats.get('cache_write_tokens', 0):,}")
    finally:
        stub.stop()
    print(f"\n{lines} lines sharing a {SYSTEM_TOKENS:,}-token system prompt (cache reads 0.1x, writes 1.25x, batch "
          f"0.5x): primed ${rows[True]:.6f}, not primed ${rows[False]:.6f}, primed / not "
          f"{rows[True] / rows[False]:.3f}")
