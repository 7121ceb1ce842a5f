"""`budget_reservation: estimate` on both stores (SQLite; Redis: one server, a 3-master cluster, Valkey): two creates at
the same instant against one budget, only one holds its estimate; the hold shrinks as the batch's results are
journaled; the sweeper releases what a batch that ended without its finalizer (a dead worker's, a failed one) held,
and a create's hold whose batch was never stored. The gateway runs in this process (no worker: nothing is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus, Result
from gateway.errors import OverQuota
from gateway.lines.budget import TeamSpending, create_hold
from gateway.runtime.runtime import Runtime, open_embedded, open_shared
from gateway.store.quota import GRACE_SECONDS
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, RedisServer

TEAM = "careful"


def _config() -> Any:
    return parse_config({
        "model_list": [{"model_name": "gpt-mini",
                        "litellm_params": {"model": "openai/gpt-mini", "api_base": "http://127.0.0.1:9/v1",
                                           "api_key": "k"},
                        "model_info": {"input_cost_per_token": 0.0, "output_cost_per_token": 1e-4}}],
        "batch_settings": {"budget_reservation": "estimate",
                           "teams": [{"team_id": TEAM, "api_keys": ["sk-c"], "max_budget": 1.0}]}})


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(3)
    servers.start()
    yield servers
    servers.close()


KINDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis), pytest.param("cluster", marks=pytest.mark.redis)]


@contextlib.asynccontextmanager
async def running(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Runtime]:
    if kind == "sqlite":
        rt = await open_embedded(_config(), tmp_path / "data", routes=(), sweeping=False)
    else:
        if not HAVE_REDIS:
            pytest.skip(NO_REDIS_REASON)
        server: RedisServer | RedisClusterServers = request.getfixturevalue(
            "redis_server" if kind == "redis" else "cluster")
        server.flush()
        rt = await open_shared(_config(), server.url, tmp_path / "blobs", routes=())
    await rt.start()
    try:
        yield rt
    finally:
        await rt.aclose()


async def _lines(n: int) -> AsyncIterator[bytes]:
    for i in range(n):  # each line: 1000 output tokens at most, $0.10 at $0.0001 a token (input free)
        yield json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "gpt-mini", "max_tokens": 1000,
                                   "messages": [{"role": "user", "content": f"question {i}"}]}}).encode() + b"\n"


async def _create(rt: Runtime, lines: int = 6) -> Any:
    source = await rt.service.upload_file(TEAM, "in.jsonl", "batch", _lines(lines))
    try:
        return await rt.service.create_batch(TEAM, input_file_id=source.id, endpoint="/v1/chat/completions",
                                             completion_window="24h")
    except OverQuota as exc:
        return exc


@pytest.mark.parametrize("kind", KINDS)
async def test_two_creates_at_once_only_one_holds_its_estimate(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with running(kind, tmp_path, request) as runtime:
        outcomes = await asyncio.gather(_create(runtime), _create(runtime))
        refused = [o for o in outcomes if isinstance(o, OverQuota)]
        created = [o for o in outcomes if not isinstance(o, OverQuota)]
        assert len(refused) == 1 and len(created) == 1, outcomes
        assert refused[0].code == "insufficient_quota"
        # the estimate, and what is left
        assert "0.600000 USD" in refused[0].message and "0.400000 USD" in refused[0].message
        held = await runtime.store.quota.reserved(TEAM)
        assert held == {create_hold(created[0].id, created[0].created_at): pytest.approx(0.6)}
        smaller = await _create(runtime, lines=4)  # $0.40 fits what is left
        assert not isinstance(smaller, OverQuota), smaller
        assert sum((await runtime.store.quota.reserved(TEAM)).values()) == pytest.approx(1.0)



@pytest.mark.parametrize("kind", KINDS)
async def test_the_hold_shrinks_as_results_are_journaled(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with running(kind, tmp_path, request) as runtime:
        batch = await _create(runtime)
        hold = create_hold(batch.id, batch.created_at)
        spending = TeamSpending(runtime.budgets, TEAM, hold)
        spending.buffered(Result(line=1, custom_id="a", status_code=200, body={}, cost_usd=0.25))
        assert await runtime.budgets.over(TEAM) is False

        async def written() -> float:  # as the runner journals the results: what they cost
            return 0.25

        await spending.journal(written())
        assert (await runtime.store.quota.reserved(TEAM))[hold] == pytest.approx(0.35)



@pytest.mark.parametrize("kind", KINDS)
async def test_the_sweeper_releases_a_dead_batchs_hold_and_a_create_that_never_stored(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with running(kind, tmp_path, request) as runtime:
        batch = await _create(runtime)
        stray = create_hold("batch_never_stored", time.time() - GRACE_SECONDS - 5)
        young = create_hold("batch_being_created", time.time())
        for hold in (stray, young):
            assert await runtime.store.quota.reserve(TEAM, 0, hold, [0.1], 1.0) == 1
        await runtime.sweeper.sweep()
        held = await runtime.store.quota.reserved(TEAM)
        assert set(held) == {create_hold(batch.id, batch.created_at), young}  # its batch runs; the other is new
        # The batch ends without its finalizer (as when the worker holding it died and its end was forced).
        await runtime.store.batches.update(batch.id, {"status": BatchStatus.FAILED})
        await runtime.sweeper.sweep()
        assert set(await runtime.store.quota.reserved(TEAM)) == {young}
