"""Spend only from what the operator priced (issue 25).

- A reply's `usage` is the upstream's word: only non-negative integers up to `MAX_USAGE_TOKENS` are counted.
  Anything else (negative, huge, float, string, bool, wrong shape) counts as zero tokens and zero cost, and
  `batchyard_upstream_usage_rejected_total{route}` and a log line (never the reply) say so. A batch's usage
  and a team's spend never go negative, in either store.
- A price is the config's or LiteLLM's price map's, never a line's: a line that names prices (LiteLLM takes
  them as keyword arguments) is refused or priced as the operator priced it, and it leaves no price behind
  for the lines after it.
- A team over its budget gets no provider batch job created on a native route; its lines get
  `budget_exceeded`, the code a real-time route's lines get.

Real processes: `batchyard serve` (embedded, or over a real redis-server), the loopback upstream, the openai SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, BatchStatus, Endpoint, Result, Shard, new_id
from gateway.lines.budget import Budgets, spending_for
from gateway.store.records import BatchRecord, now
from gateway.store.sqlite.store import SQLiteStore
from providers.native.runner import NativeBatchBackend
from tests.fakes.upstream.app import BAD_USAGE
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import Gateway, gateway_config, read_jsonl, start_gateway, submit
from tests.support.services import HAVE_REDIS, RedisServer, start_worker
from tests.support.team_helpers import MODES, finished, lines, metric, serve, start_shared, until

PRICE = 0.001  # USD per token, in and out, on every priced route
ROUTES = ("gpt-mini", "gpt-azure")  # LiteLLM's pass-through (OpenAI's wire) and its completion path (Azure)
NATIVE = "gpt-native"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(batch_delay=0.3) as server:
        yield server


def _teams(max_budget: float | None = None) -> list[dict[str, Any]]:
    budget = {} if max_budget is None else {"max_budget": max_budget}
    return [{"team_id": "payer", "api_keys": ["sk-payer"], **budget}, {"team_id": "other", "api_keys": ["sk-other"]}]


def _config(upstream: Upstream, max_budget: float | None = None, *, native: bool = False) -> dict[str, Any]:
    config = gateway_config(upstream, models=ROUTES, teams=_teams(max_budget), shard_size=50, max_concurrency=4,
                            master_key="sk-admin")
    for entry in config["model_list"]:
        entry["model_info"] = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    # Azure, priced by nothing in the config: LiteLLM's price map, by the base model the operator named.
    config["model_list"].append({"model_name": "azure-mapped", "litellm_params": {
        **config["model_list"][1]["litellm_params"]}, "model_info": {"base_model": "gpt-4o-mini"}})
    if native:
        config["model_list"].append({"model_name": NATIVE, "litellm_params": {
            "model": "openai/gpt-4o-mini", "api_base": upstream.v1_url, "api_key": upstream.api_key},
            "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2}})
    return config


def _chat(cid: str, model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}], **extra}}


def _run(gw: Gateway, key: str, batch_lines: list[dict[str, Any]]) -> tuple[openai.types.Batch, dict[str, Any]]:
    """Submit, wait until it ends; the batch and every line's output or error line by custom_id."""
    client = gw.client(key)
    batch = until(gw, key, submit(client, batch_lines).id, finished, timeout=120)
    assert batch.status == "completed", batch
    out = read_jsonl(client, batch.output_file_id) + read_jsonl(client, batch.error_file_id)
    return batch, {line["custom_id"]: line for line in out}


def _tokens(line: dict[str, Any]) -> int:
    usage = line["response"]["body"]["usage"]
    return int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


@pytest.mark.parametrize("mode", MODES)
def test_usage_counts_only_as_sane_non_negative_integers(mode: str, upstream: Upstream, tmp_path: Path) -> None:
    """A reply's usage that is not sane integers is zero tokens and zero cost: the batch's usage and the
    team's spend are those of the sane replies only, never negative, and the operator is told (metric, log)."""
    batch_lines = []
    for route in ROUTES:
        batch_lines.append(_chat(f"{route}-sane", route, "count these four words"))
        batch_lines += [_chat(f"{route}-{kind}", route, f"#usage:{kind} private-{kind}") for kind in BAD_USAGE]
    with serve(mode, _config(upstream), tmp_path / "data") as gw:
        batch, out = _run(gw, "sk-payer", batch_lines)
        assert {line["response"]["status_code"] for line in out.values()} == {200}  # the replies themselves pass
        sane = [out[f"{route}-sane"]["response"]["body"]["usage"] for route in ROUTES]
        assert batch.usage is not None
        assert batch.usage.input_tokens == sum(u["prompt_tokens"] for u in sane) > 0
        assert batch.usage.output_tokens == sum(u["completion_tokens"] for u in sane) > 0
        routes = gw.client("sk-payer").batches.retrieve(batch.id).model_extra["routes"]  # type: ignore[index]
        for route in ROUTES:
            assert routes[route]["cost_usd"] == pytest.approx(_tokens(out[f"{route}-sane"]) * PRICE)
            assert metric(gw, "batchyard_upstream_usage_rejected_total", route=route) == len(BAD_USAGE)
        spend = metric(gw, "batchyard_team_spend_usd", team="payer")
        assert spend == pytest.approx(sum(_tokens(out[f"{route}-sane"]) for route in ROUTES) * PRICE, abs=1e-12)
        assert metric(gw, "batchyard_cost_usd_total", team="payer", route="gpt-mini") == pytest.approx(
            _tokens(out["gpt-mini-sane"]) * PRICE)
        # The server's log, and its worker processes' (embedded mode: the data directory's logs/).
        log = gw.log() + "".join(p.read_text() for p in (tmp_path / "data" / "logs").glob("*.log"))
        assert "counted as zero tokens" in log and "route gpt-azure" in log
        assert "private-" not in log  # the log names the route and a count, never a reply


def test_a_line_cannot_set_its_own_price(upstream: Upstream, tmp_path: Path) -> None:
    """Prices a line names (LiteLLM's `input_cost_per_token` and kin, in its body or its metadata) are not the
    price: its cost, and every later line's, is the config's or the price map's times the tokens."""
    import litellm

    mapped = litellm.model_cost["gpt-4o-mini"]
    price_of = {route: (PRICE, PRICE) for route in ROUTES}
    price_of["azure-mapped"] = (mapped["input_cost_per_token"], mapped["output_cost_per_token"])
    named = {"input_cost_per_token": 1000.0, "output_cost_per_token": 1000.0}
    hostile = [_chat(f"{route}-named", route, "price me myself", **named) for route in price_of]
    hostile += [_chat(f"{route}-meta", route, "price me by metadata", metadata={"model_info": named})
                for route in price_of]

    def cost(line: dict[str, Any], route: str) -> float:
        usage = line["response"]["body"]["usage"]
        return usage["prompt_tokens"] * price_of[route][0] + usage["completion_tokens"] * price_of[route][1]

    with start_gateway(_config(upstream), tmp_path / "data") as gw:
        _, out = _run(gw, "sk-payer", hostile)
        # Refused (a line's body is the endpoint's documented fields) or answered at the operator's price.
        answered = {cid: line for cid, line in out.items() if (line["response"] or {}).get("status_code") == 200}
        expected = sum(cost(line, cid.rsplit("-", 1)[0]) for cid, line in answered.items())
        assert metric(gw, "batchyard_team_spend_usd", team="payer") == pytest.approx(expected, abs=1e-12)
        assert expected < 1.0  # a thousand dollars a token would be far past this

        # Another team's plain lines afterwards: nothing the lines above named stuck to the deployments.
        _, plain = _run(gw, "sk-other", [_chat(f"{route}-plain", route, "plain line") for route in price_of])
        expected = sum(cost(plain[f"{route}-plain"], route) for route in price_of)
        assert metric(gw, "batchyard_team_spend_usd", team="other") == pytest.approx(expected, abs=1e-12)
        assert expected > 0


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason="redis-server is not on PATH")
def test_native_lines_of_a_team_over_budget_create_no_provider_job(upstream: Upstream, tmp_path: Path) -> None:
    """A native batch accepted while the team was under budget, run once it is over (here: the operator
    lowered `max_budget` below what the team spent): no file or batch job reaches the provider, and each
    line gets `budget_exceeded`, as on a real-time route; a new batch is refused with that code."""
    redis = RedisServer().start()
    data = tmp_path / "data"
    try:
        with start_shared(_config(upstream, 1.0, native=True), data, redis.url, with_worker=False) as api:
            worker = start_worker(data.parent / "shared.config.yaml", redis.url, str(data / "blobs")).wait_ready()
            try:
                _run(api, "sk-payer", lines(10, "spend", sleep_ms=0))  # 10 lines of 7 tokens: 0.07 USD
            finally:
                worker.kill()
            spend = metric(api, "batchyard_team_spend_usd", team="payer")
            assert spend is not None and 0.05 < spend < 1.0
            waiting = submit(api.client("sk-payer"), [_chat(f"n{i}", NATIVE, f"native {i}") for i in range(4)])
        before = upstream.stats()
        # The operator lowers the budget below the spend; the gateway comes back with its worker.
        with start_shared(_config(upstream, 0.05, native=True), data, redis.url) as gw:
            client = gw.client("sk-payer")
            done = until(gw, "sk-payer", waiting.id, finished, timeout=120)
            assert done.status == "completed" and done.request_counts is not None
            assert (done.request_counts.completed, done.request_counts.failed) == (0, 4)
            errors = read_jsonl(client, done.error_file_id)
            assert {e["error"]["code"] for e in errors} == {"budget_exceeded"} and len(errors) == 4
            after = upstream.stats()
            assert after["batches_created"] == before["batches_created"]
            assert after["files_created"] == before["files_created"]
            with pytest.raises(openai.RateLimitError) as refused:
                submit(client, [_chat("late", NATIVE, "one more")])
            assert refused.value.response.json()["error"]["code"] == "budget_exceeded"
    finally:
        redis.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite3")
    yield s
    await s.aclose()


async def test_a_native_shard_checks_the_budget_before_each_provider_job(
    upstream: Upstream, store: SQLiteStore, tmp_path: Path
) -> None:
    """The native backend itself asks the budget its requests spend (`spending_for`, set by the shard runner)
    before it creates a provider job, so a team that went over while its shard was starting commits nothing."""
    config = parse_config(_config(upstream, 0.01, native=True), "spend.yaml")
    budgets = Budgets(config, store.quota)
    batch_id = new_id("batch")
    t = now()
    await store.batches.put(BatchRecord(id=batch_id, owner="payer", endpoint="*", input_file_id="file-x",
                                      completion_window="24h", status=BatchStatus.IN_PROGRESS, created_at=t,
                                      expires_at=t + 3600))
    shard = Shard(batch_id=batch_id, index=0, route=NATIVE, size=3, team="payer")
    await store.ledger.put_shards(batch_id, [shard])
    spent = Result(line=99, custom_id="paid", status_code=200, body={"usage": {}}, cost_usd=0.02)
    await store.ledger.record_results(Shard(batch_id=batch_id, index=1, route="gpt-mini", size=1), [spent],
                                      budgets.spend_to("payer"))
    assert await budgets.over("payer")
    backend = NativeBatchBackend(config.routes[NATIVE], {}, store)
    requests = [BatchRequest(line=i, custom_id=f"n{i}", url=Endpoint.CHAT,
                             body={"model": NATIVE, "messages": [{"role": "user", "content": f"hi {i}"}]})
                for i in (1, 2, 3)]
    before = upstream.stats()

    async def over() -> bool:
        return await budgets.over("payer")

    with spending_for(over):
        results = [r async for r in backend.execute_shard(shard, requests)]
    assert sorted(r.line for r in results) == [1, 2, 3]
    assert {(r.error or {}).get("code") for r in results} == {"budget_exceeded"}
    after = upstream.stats()
    assert (after["batches_created"], after["files_created"]) == (before["batches_created"], before["files_created"])
