"""What a native route's results put in the team's ledger is what the provider bills: each provider's stand-in
(tests/fakes: OpenAI and Azure on the loopback upstream, Anthropic, Mistral, the Gemini API, Vertex AI, Bedrock,
Groq, Together AI, xAI, Fireworks AI)
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
from tests.support.native_config import GROQ_PRICES, NATIVE_MODELS, TOGETHER_PRICES, XAI_PRICES, StandIns
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers

TEAM = "payer"
# route -> (USD per input token, per output token) its config gives at batch rates; None: LiteLLM's map
CONFIGURED = {"gpt-bulk": {"input_cost_per_token_batches": 1.25e-6, "output_cost_per_token_batches": 5e-6},
              "azure-bulk": {"input_cost_per_token": 2.5e-6, "output_cost_per_token": 1e-5,
                             "input_cost_per_token_batches": 1.25e-6, "output_cost_per_token_batches": 5e-6},
              "groq-bulk": GROQ_PRICES, "together-bulk": TOGETHER_PRICES, "xai-bulk": XAI_PRICES}
STUB = {"claude-bulk": "anthropic", "mistral-bulk": "mistral", "gemini-bulk": "gemini", "vertex-bulk": "vertex",
        "bedrock-bulk": "bedrock", "together-bulk": "together", "xai-bulk": "xai", "fireworks-bulk": "fireworks"}
MAP_KEYS = {"claude-bulk": ["claude-haiku-4-5"], "mistral-bulk": ["mistral/mistral-small-latest"],
            "gemini-bulk": ["gemini/gemini-2.5-flash-lite"], "vertex-bulk": ["gemini-2.5-flash"],
            "bedrock-bulk": [NATIVE_MODELS["bedrock-bulk"]],
            "fireworks-bulk": [f"fireworks_ai/{NATIVE_MODELS['fireworks-bulk']}"]}


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
    server = servers.stubs["groq"] if route == "groq-bulk" else servers.upstream  # both the upstream's counters
    tokens = server.stats()["billed"].get(NATIVE_MODELS[route]) or {"input": 0, "output": 0}
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
        # a host LiteLLM's map does not know, priced by batch prices only: shown as such, not `-`
        {"model_name": "host-live", "litellm_params": {"model": "openai/host-model", "api_key": "k",
                                                       "api_base": "https://batch.example.com/v1"},
         "model_info": {"input_cost_per_token_batches": 5e-8, "output_cost_per_token_batches": 2e-7}},
        native("groq-priced", "groq/llama-3.1-8b-instant", input_cost_per_token_batches=2.5e-8,
               output_cost_per_token_batches=4e-8),
        native("groq-halved-never", "groq/llama-3.1-8b-instant", input_cost_per_token=5e-8,
               output_cost_per_token=8e-8),
    ]})
    rows = {row.model_name: row.prices for row in route_rows(config)}
    import litellm

    haiku = litellm.model_cost["claude-haiku-4-5"]
    assert rows == {"both": "1.25 / 5", "batch-only": "0.075 / 0.3", "realtime-only": "1 / 4",
                    "mapped": f"{haiku['input_cost_per_token_batches'] * 1e6:g} / "
                              f"{haiku['output_cost_per_token_batches'] * 1e6:g}",
                    "live": "2.5 / 10", "host-live": "- (batches 0.05 / 0.2)", "groq-priced": "0.025 / 0.04",
                    "groq-halved-never": "0.05 / 0.08"}, rows  # as written: never halved


# -- a native job reserves before it is created ---------------------------------------------------------------

PRICE = 1e-3  # USD per token at batch rates, in and out: a line's estimate is a few cents
BUDGET = 0.1


def budget_config(servers: StandIns, tmp_path: Path) -> Path:
    config = yaml.safe_load(servers.config())
    config["model_list"] = [e for e in config["model_list"] if e["model_name"] == "gpt-bulk"]
    config["model_list"][0]["model_info"].update(input_cost_per_token_batches=PRICE,
                                                 output_cost_per_token_batches=PRICE)
    config["batch_settings"] = {"teams": [{"team_id": TEAM, "api_keys": ["sk-payer"], "max_budget": BUDGET}]}
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    if not HAVE_REDIS:
        pytest.skip(NO_REDIS_REASON)
    servers = RedisClusterServers(3).start()
    yield servers
    servers.close()


@pytest.mark.parametrize("mode", ["embedded", pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("cluster", marks=pytest.mark.redis)])
async def test_native_jobs_are_cut_to_what_the_budget_holds_two_batches_at_once(
    mode: str, servers: StandIns, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two batches of 10 lines on a native route, created at once by a team with $0.10 left: before each provider
    job its lines' estimate (input tokens, output bounded by max_tokens, at the batch price) is reserved in the
    store's one step that reads the budget, so the two jobs together hold no more than the budget; the lines that
    do not fit get `budget_exceeded` and never reach the provider. The spend is the provider's bill, within the
    budget, and nothing is left reserved once the batches end."""
    config = load_config(str(budget_config(servers, tmp_path)))
    if mode in ("redis", "cluster"):  # one server, or a 3-master cluster (the reservation's Lua in one slot)
        from gateway.runtime.runtime import open_shared

        redis = request.getfixturevalue("redis_server" if mode == "redis" else "cluster")
        redis.flush()
        pipeline = await open_shared(config, redis.url, tmp_path / "blobs", routes=None)
    else:
        pipeline = await open_embedded(config, tmp_path / "data")
    before = servers.upstream.stats()["batch_lines"]
    billed_before = billed(servers, "gpt-bulk")
    try:
        await pipeline.start()
        batches = []
        for name in ("a", "b"):
            source = await pipeline.service.upload_file(TEAM, f"{name}.jsonl", "batch", chunks("gpt-bulk", 10))
            batches.append(source)
        created = await asyncio.gather(*(pipeline.service.create_batch(
            TEAM, input_file_id=s.id, endpoint="/v1/chat/completions", completion_window="24h") for s in batches))
        done = [await asyncio.wait_for(pipeline.service.wait(b.id), 60) for b in created]
        spent = await pipeline.store.quota.spend(TEAM, 0)
        held = await pipeline.store.quota.reserved(TEAM)
    finally:
        await pipeline.aclose()
    sent = servers.upstream.stats()["batch_lines"] - before
    ran = sum(d.counts.completed for d in done)
    assert all(d.status is BatchStatus.COMPLETED for d in done)
    assert 0 < ran == sent < 20, (ran, sent)  # some fit, not all: the rest never reached the provider
    assert sum(d.counts.failed for d in done) == 20 - ran
    after = billed(servers, "gpt-bulk")
    bill = ((after[0] - billed_before[0]) + (after[1] - billed_before[1])) * PRICE
    assert spent == pytest.approx(bill, rel=1e-9) and 0 < spent <= BUDGET, (spent, bill)
    assert held == {}  # the results replaced the holds
