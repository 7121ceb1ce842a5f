"""What a native route's results put in the team's ledger is what the provider bills: each provider's stand-in
(tests/fakes: OpenAI and Azure on the loopback upstream, Anthropic, Mistral, the Gemini API, Vertex AI, Bedrock)
counts the tokens of every line its batch jobs answered (`billed`), and the team's spend after the batch is those
tokens at the provider's batch price, to within one line's cost. Nothing is mocked: the pipeline runs in this
process (`open_embedded`), the stand-ins in theirs.

The prices are those the issue's users met: a route priced by `*_cost_per_token_batches` alone (was $0.00 in the
ledger), one with real-time and batch prices both (was charged the real-time ones), and LiteLLM's map for the rest
(its own batch prices, else the real-time ones halved).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.schema import load_config
from gateway.domain import BatchStatus
from gateway.runtime.runtime import open_embedded
from tests.support.native_config import NATIVE_MODELS, StandIns

TEAM = "payer"
# route -> (USD per input token, per output token) its config gives at batch rates; None: LiteLLM's map
CONFIGURED = {"gpt-bulk": {"input_cost_per_token_batches": 1.25e-6, "output_cost_per_token_batches": 5e-6},
              "azure-bulk": {"input_cost_per_token": 2.5e-6, "output_cost_per_token": 1e-5,
                             "input_cost_per_token_batches": 1.25e-6, "output_cost_per_token_batches": 5e-6}}
STUB = {"claude-bulk": "anthropic", "mistral-bulk": "mistral", "gemini-bulk": "gemini", "vertex-bulk": "vertex",
        "bedrock-bulk": "bedrock"}
MAP_KEYS = {"claude-bulk": ["claude-haiku-4-5"], "mistral-bulk": ["mistral/mistral-small-latest"],
            "gemini-bulk": ["gemini/gemini-2.5-flash-lite"], "vertex-bulk": ["gemini-2.5-flash"],
            "bedrock-bulk": [NATIVE_MODELS["bedrock-bulk"]]}


@pytest.fixture(scope="module")
def servers() -> Iterator[StandIns]:
    with StandIns(batch_delay=0.3) as stand_ins:
        yield stand_ins


@pytest.fixture
def stand_in_env(servers: StandIns, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS's and Cloud Storage's endpoints are the stand-ins' (as `servers.env()` gives a subprocess)."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_BEDROCK", "STORAGE_EMULATOR_HOST", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        value = servers.env().get(name)
        if value is not None:
            monkeypatch.setenv(name, value)


def batch_price(route: str) -> tuple[float, float]:
    """What the provider charges a token of `route` in a batch job: the config's batch price, else LiteLLM's
    map's, else its real-time price halved (docs/native.md)."""
    configured = CONFIGURED.get(route)
    if configured is not None:
        return configured["input_cost_per_token_batches"], configured["output_cost_per_token_batches"]
    import litellm

    entry = next(litellm.model_cost[k] for k in MAP_KEYS[route] if k in litellm.model_cost)
    return (entry.get("input_cost_per_token_batches") or entry["input_cost_per_token"] / 2,
            entry.get("output_cost_per_token_batches") or entry["output_cost_per_token"] / 2)


def billed(servers: StandIns, route: str) -> tuple[int, int]:
    """The tokens the route's provider has billed so far (its stand-in's count)."""
    if route in STUB:
        stats = servers.stubs[STUB[route]].stats()
        return int(stats.get("billed_input_tokens", 0)), int(stats.get("billed_output_tokens", 0))
    tokens = servers.upstream.stats()["billed"].get(NATIVE_MODELS[route]) or {"input": 0, "output": 0}
    return int(tokens["input"]), int(tokens["output"])


def write_config(servers: StandIns, tmp_path: Path) -> Path:
    config = yaml.safe_load(servers.config())
    for entry in config["model_list"]:
        entry["model_info"].update(CONFIGURED.get(entry["model_name"], {}))
    config["batch_settings"] = {"teams": [{"team_id": TEAM, "api_keys": ["sk-payer"]}]}
    path = tmp_path / "native.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def chunks(route: str, count: int) -> AsyncIterator[bytes]:
    for i in range(1, count + 1):
        body = {"model": route, "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question number {i} " + "word " * (i % 7)}]}
        yield json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": body}).encode() + b"\n"


@pytest.mark.usefixtures("stand_in_env")
@pytest.mark.parametrize("route", list(NATIVE_MODELS))
async def test_the_ledger_is_what_the_provider_bills(route: str, servers: StandIns, tmp_path: Path) -> None:
    lines = 100 if route == "bedrock-bulk" else 12  # Bedrock takes a job of 100 records at least
    before = billed(servers, route)
    pipeline = await open_embedded(load_config(str(write_config(servers, tmp_path))), tmp_path / "data")
    try:
        await pipeline.start()
        source = await pipeline.service.upload_file(TEAM, "in.jsonl", "batch", chunks(route, lines))
        batch = await pipeline.service.create_batch(TEAM, input_file_id=source.id, endpoint="/v1/chat/completions",
                                                    completion_window="24h")
        done = await asyncio.wait_for(pipeline.service.wait(batch.id), 120)
        assert done.status is BatchStatus.COMPLETED and done.counts.completed == lines, (done.status, done.counts)
        spent = await pipeline.store.quota.spend(TEAM, 0)
    finally:
        await pipeline.aclose()
    after = billed(servers, route)
    tokens_in, tokens_out = after[0] - before[0], after[1] - before[1]
    assert tokens_in > 0 and tokens_out > 0, (before, after)
    rate_in, rate_out = batch_price(route)
    bill = tokens_in * rate_in + tokens_out * rate_out
    one_line = bill / lines
    assert abs(spent - bill) <= one_line, (route, spent, bill)
    assert spent == pytest.approx(bill, rel=1e-9)  # every line's tokens, at the batch price: exact here
    assert done.routes[route]["cost_usd"] == pytest.approx(bill, rel=1e-9)  # the summary says the same


def test_config_check_shows_the_prices_a_native_route_charges() -> None:
    """`batchyard config check`: a native route's prices are its batch prices (the config's `*_batches`, else the
    real-time ones halved, else LiteLLM's map's batch prices), a real-time route's its real-time ones."""
    from gateway.cli.config_check import route_rows
    from gateway.config.schema import parse_config

    def native(name: str, model: str, **prices: float) -> dict[str, Any]:
        return {"model_name": name, "litellm_params": {"model": model, "api_key": "k"},
                "model_info": {"batch_mode": "native", **prices}}

    config = parse_config({"model_list": [
        native("both", "openai/gpt-4o", **CONFIGURED["azure-bulk"]),
        native("batch-only", "openai/gpt-4o-mini", input_cost_per_token_batches=7.5e-8,
               output_cost_per_token_batches=3e-7),
        native("realtime-only", "openai/gpt-4o-mini", input_cost_per_token=2e-6, output_cost_per_token=8e-6),
        native("mapped", "anthropic/claude-haiku-4-5"),
        {"model_name": "live", "litellm_params": {"model": "openai/gpt-4o", "api_key": "k"},
         "model_info": {"input_cost_per_token": 2.5e-6, "output_cost_per_token": 1e-5}},
    ]})
    rows = {row.model_name: row.prices for row in route_rows(config)}
    import litellm

    haiku = litellm.model_cost["claude-haiku-4-5"]
    assert rows == {"both": "1.25 / 5", "batch-only": "0.075 / 0.3", "realtime-only": "1 / 4",
                    "mapped": f"{haiku['input_cost_per_token_batches'] * 1e6:g} / "
                              f"{haiku['output_cost_per_token_batches'] * 1e6:g}",
                    "live": "2.5 / 10"}, rows
