"""Each real-time request is granted against its team's budget as it starts (`gateway.backends.bounded` with
`gateway.lines.budget.TeamSpending`), over a real embedded store: a result counts as spent before its slot is
released, so however late the shard's loop takes the results (a journal write, a loaded machine), spend passes
`max_budget` by at most the requests in flight when it was reached.

Calls here take a few event-loop ticks (no timers); the only timer is the slow consumer's, and the bound holds
whatever it is."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.backends.bounded import run_bounded
from gateway.config.prices import route_prices
from gateway.config.schema import Config, parse_config
from gateway.domain import BatchRequest, Endpoint, Result, billable
from gateway.lines.budget import Budgets, TeamSpending, spending_for
from gateway.pipeline.shard_runner import price
from gateway.scheduling.fairness import FairSlots, Share, running_for
from gateway.store.sqlite.store import SQLiteStore

TEAM, BUDGET, PRICE = "thrifty", 0.05, 0.001  # a reply is 3 + 4 tokens: 0.007 USD a line
LINE_COST = 7 * PRICE
PRICES = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}


def _config() -> Config:
    return parse_config({
        "model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": "http://127.0.0.1:9/v1",
                                                              "api_key": "k"}, "model_info": PRICES}],
        "batch_settings": {"teams": [{"team_id": TEAM, "api_keys": ["sk-t"], "max_budget": BUDGET}]}})


@contextlib.asynccontextmanager
async def _budgets(tmp_path: Path) -> AsyncIterator[Budgets]:
    store = SQLiteStore(tmp_path / "b.sqlite3")
    try:
        yield Budgets(_config(), store.quota)
    finally:
        await store.aclose()


class Upstream:
    """Answers after a few ticks with 3 + 4 tokens, unpriced (the route's prices price it, as for a local
    route); counts the calls that reached it."""

    def __init__(self) -> None:
        self.calls = self.ended = 0

    async def call(self, req: BatchRequest) -> Result:
        self.calls += 1
        for _ in range(3):
            await asyncio.sleep(0)
        self.ended += 1
        body = {"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
        return Result(line=req.line, custom_id=req.custom_id, status_code=200, body=body, model=req.model)


def _requests(n: int) -> list[BatchRequest]:
    return [BatchRequest(i, f"c{i}", Endpoint.CHAT, {"model": "m", "messages": []}) for i in range(1, n + 1)]


@pytest.mark.parametrize("consumer_delay", [0.0, 0.02], ids=["prompt shard loop", "shard loop 20 ms behind"])
async def test_two_runs_of_one_team_pass_the_budget_by_at_most_the_requests_in_flight(
    tmp_path: Path, consumer_delay: float
) -> None:
    limit, lines = 4, 40
    slots, upstream = FairSlots(limit), Upstream()
    async with _budgets(tmp_path) as budgets:
        pricing = functools.partial(price, route_prices(PRICES))

        async def shard(batch: str) -> list[Result]:
            spending = TeamSpending(budgets, TEAM, price=pricing)
            got: list[Result] = []
            with running_for(Share(TEAM, batch)), spending_for(spending):
                results = run_bounded(_requests(lines), upstream.call, slots)
            async for result in results:
                await asyncio.sleep(consumer_delay)  # as a shard's loop busy with a journal write
                spending.buffered(result)  # what the runner does as it takes a result
                got.append(result)
            return got

        got = [r for run in await asyncio.gather(shard("b1"), shard("b2")) for r in run]
        assert slots.used == 0
        ran = [r for r in got if r.ok]
        spent = sum(billable(r.cost_usd) for r in ran)
        assert len(ran) == upstream.calls
        # It reached the budget; past it by at most the other requests in flight when the result that reached
        # it was counted (its own slot was not yet given on).
        reached = math.ceil(BUDGET / LINE_COST)
        assert reached <= len(ran) <= reached + limit - 1, (len(ran), spent)
        assert BUDGET <= spent <= BUDGET + limit * LINE_COST
        assert {(r.error or {}).get("code") for r in got if not r.ok} == {"budget_exceeded"}
        assert await budgets.over(TEAM)


async def test_results_counted_but_never_journaled_stop_counting_when_the_shard_ends(tmp_path: Path) -> None:
    """A shard cancelled with results unread (they are never journaled: the ledger never sees them) does not
    leave their cost counted in this process."""
    slots, upstream = FairSlots(10), Upstream()
    async with _budgets(tmp_path) as budgets:
        spending = TeamSpending(budgets, TEAM, price=functools.partial(price, route_prices(PRICES)))
        with running_for(Share(TEAM, "b")), spending_for(spending):
            results = run_bounded(_requests(10), upstream.call, slots)
        async for result in results:
            spending.buffered(result)
            while upstream.ended < 10:  # every request ends (10 x 0.007 USD) while the shard's loop is busy
                await asyncio.sleep(0.001)
            break
        await results.aclose()
        assert await budgets.over(TEAM)  # counted as spent while the shard runs
        spending.close()  # as the runner does when the shard ends
        assert not await budgets.over(TEAM)
