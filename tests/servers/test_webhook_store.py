"""Webhook deliveries in the store, both modes: the same calls on SQLite and on a real redis-server
answer alike (a transcript of what came back), and what is recorded survives a reopen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.store.protocols import WebhookDeliveries
from gateway.store.redis.connection import connect_redis
from gateway.store.redis.keys import Keys
from gateway.store.redis.webhooks import RedisWebhookDeliveries
from gateway.store.sqlite.store import SQLiteStore
from gateway.store.webhook_deliveries import DELIVERED, FAILED, PENDING, WebhookDelivery
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if not HAVE_REDIS:
        pytest.skip(NO_REDIS_REASON)
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.close()


def _delivery(n: int, owner: str, next_at: float) -> WebhookDelivery:
    return WebhookDelivery(f"wh_{n:032x}", f"evt_{n:032x}", owner, f"batch_{n}", "batch.completed", 1000 + n,
                           next_at=next_at)


async def _transcript(store: WebhookDeliveries) -> list[Any]:
    out: list[Any] = []
    ids = lambda found: [d.id for d in found]  # noqa: E731
    out.append([await store.add(_delivery(n, owner, at)) for n, owner, at in
                ((1, "a", 100.0), (2, "b", 50.0), (3, "a", 300.0), (4, "a", 100.0))])
    out.append(await store.add(_delivery(1, "a", 0.0)))  # the same id again: kept as first recorded
    out.append(ids(await store.due(100.0, 10)))  # soonest first; 3 is not due
    out.append(ids(await store.due(100.0, 1)))
    first = (await store.due(100.0, 10))[1]
    out.append(first.to_json())
    first.attempts, first.last_status, first.last_error, first.next_at = 1, 500, "HTTP 500", 250.0
    await store.save(first)
    out.append(ids(await store.due(200.0, 10)))  # moved past 200
    out.append(ids(await store.due(260.0, 10)))
    first.state, first.attempts, first.last_status, first.last_error, first.finished_at = DELIVERED, 2, 200, None, 7
    await store.save(first)
    gone = (await store.due(1000.0, 10))[0]
    gone.state, gone.last_error = FAILED, "gave up"
    await store.save(gone)
    out.append(ids(await store.due(1000.0, 10)))  # only what is still pending
    out.append([(d.id, d.state, d.attempts, d.last_status) for d in await store.recent("a", 10)])  # newest first
    out.append(ids(await store.recent("a", 2)))
    out.append(ids(await store.recent("b", 10)))
    out.append(ids(await store.recent(None, 10)))
    out.append(ids(await store.recent("nobody", 10)))
    out.append([d.state for d in await store.recent(None, 10)].count(PENDING))
    return out


async def test_redis_deliveries_answer_as_sqlite_does(tmp_path: Path, redis_url: str) -> None:
    sqlite = SQLiteStore(tmp_path / "w.sqlite3")
    client = connect_redis(redis_url)
    shared = RedisWebhookDeliveries(client, Keys("test-webhooks:"))
    try:
        expected = await _transcript(sqlite.webhooks)
        got = await _transcript(shared)
    finally:
        await sqlite.aclose()
        await client.aclose()
    assert expected[0] == [True, True, True, True] and expected[1] is False
    assert expected[2] == ["wh_" + f"{2:032x}", "wh_" + f"{1:032x}", "wh_" + f"{4:032x}"]
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert g == e, f"step {i}"


async def test_a_recorded_delivery_survives_a_reopen(tmp_path: Path, redis_url: str) -> None:
    path = tmp_path / "again.sqlite3"
    first = SQLiteStore(path)
    await first.webhooks.add(_delivery(9, "a", 5.0))
    await first.aclose()
    again = SQLiteStore(path)
    assert [d.id for d in await again.webhooks.due(10.0, 10)] == [f"wh_{9:032x}"]
    await again.aclose()

    client = connect_redis(redis_url)
    await RedisWebhookDeliveries(client, Keys("reopen:")).add(_delivery(9, "a", 5.0))
    await client.aclose()
    client = connect_redis(redis_url)
    assert [d.id for d in await RedisWebhookDeliveries(client, Keys("reopen:")).due(10.0, 10)] == [f"wh_{9:032x}"]
    await client.aclose()
