"""What the shared store's ordered single-slot steps leave after a crash, and the sweep that removes it, on a
redis-server, a 3-master cluster and a valkey-server (`any_redis`):
- a batch or file create that stopped between its index entries and its record (written here by the store's
  own first step, `_index`, and never its second): its entries stay while the create could still be under
  way, and go once it is older than the grace; a slow create that finishes after the sweep keeps them;
- a finished batch's spend: settled, it leaves nothing in its team's `spend-moved` nor its `spend-owed`, the
  team's spend is exactly the cost of its results (as SQLite's), and neither a settle run again nor a late
  move of results journaled before the seal adds anything."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus, Result, Shard
from gateway.runtime.runtime import open_shared
from gateway.store.protocols import Store
from gateway.store.quota import SpendTo
from gateway.store.records import BatchOptions, BatchRecord, FileRecord
from gateway.store.redis.connection import open_redis
from gateway.store.redis.creates import CREATE_GRACE_SECONDS
from gateway.store.redis.keys import Keys
from gateway.store.redis.spend import SpendMover
from gateway.store.redis.store import RedisStore
from gateway.store.sqlite.store import SQLiteStore
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, RedisServer, shared_config

pytestmark = pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)

LATER = CREATE_GRACE_SECONDS + 1


@contextlib.asynccontextmanager
async def _redis(server: RedisServer | RedisClusterServers) -> AsyncIterator[tuple[RedisStore, Keys]]:
    server.flush()
    client, keys = await open_redis(server.url)
    store = RedisStore(client, keys)
    try:
        yield store, keys
    finally:
        await store.aclose()


def _batch(batch_id: str, owner: str, status: BatchStatus = BatchStatus.VALIDATING) -> BatchRecord:
    return BatchRecord(id=batch_id, owner=owner, endpoint="/v1/chat/completions", input_file_id="file_in",
                       completion_window="24h", status=status, created_at=1000, expires_at=1000 + 86_400,
                       options=BatchOptions(strict=False, allowed_models=["m"]))


def _file(file_id: str, owner: str, purpose: str = "batch") -> FileRecord:
    return FileRecord(file_id, owner, 10, 1000, f"{file_id}.jsonl", purpose, 5000, f"files/{file_id}")


async def _ids(store: Store, owner: str) -> tuple[list[str], list[str]]:
    """The owner's batches and files, as listed."""
    batches = [b.id for b in (await store.batches.page(owner, limit=10, after=None)).data]
    files = [f.id for f in (await store.files.page(owner, purpose=None, limit=10, order="asc", after=None)).data]
    return batches, files


async def test_a_create_stopped_before_its_record_leaves_index_entries_the_sweep_removes_after_the_grace(
    any_redis: RedisServer | RedisClusterServers,
) -> None:
    async with _redis(any_redis) as (store, keys):
        r = store.batches._r
        await store.batches.put(_batch("batch_whole", "team"))
        await store.files.put(_file("file_whole", "team"))
        # the crash: the create's first step (note, sequence, index entries), never its record
        await store.batches._index(_batch("batch_half", "team"))
        await store.files._index(_file("file_half", "team"))
        assert set(await r.zrange(keys.batches("team"), 0, -1)) == {"batch_whole", "batch_half"}
        assert set(await r.zrange(keys.active, 0, -1)) == {"batch_whole", "batch_half"}
        assert set(await r.zrange(keys.files("team", "batch"), 0, -1)) == {"file_whole", "file_half"}
        assert set(await r.zrange(keys.file_expiry, 0, -1)) == {"file_whole", "file_half"}
        assert await _ids(store, "team") == (["batch_whole"], ["file_whole"])  # readers skip them

        # within the grace the create may still be under way: nothing is removed
        assert (await store.batches.tidy(time.time()), await store.files.tidy(time.time())) == (0, 0)
        assert await r.zscore(keys.batches("team"), "batch_half") is not None
        assert await r.zscore(keys.files("team"), "file_half") is not None

        # past it: the entries go, and only theirs (the whole create's note was let go of at its end)
        assert (await store.batches.tidy(time.time() + LATER), await store.files.tidy(time.time() + LATER)) == (1, 1)
        assert await r.zrange(keys.batches("team"), 0, -1) == ["batch_whole"]
        assert await r.zrange(keys.active, 0, -1) == ["batch_whole"]
        for index in (keys.files("team"), keys.files("team", "batch"), keys.file_expiry):
            assert await r.zrange(index, 0, -1) == ["file_whole"], index
        assert await r.zcard(keys.creating("batches")) == 0 and await r.zcard(keys.creating("files")) == 0
        assert (await store.batches.tidy(time.time() + LATER), await store.files.tidy(time.time() + LATER)) == (0, 0)
        assert await _ids(store, "team") == (["batch_whole"], ["file_whole"])
        assert [b.id for b in await store.batches.active()] == ["batch_whole"]


async def test_a_create_slower_than_the_grace_keeps_its_entries_when_it_finishes_after_the_sweep(
    any_redis: RedisServer | RedisClusterServers,
) -> None:
    async with _redis(any_redis) as (store, keys):
        r = store.batches._r
        rec, f = _batch("batch_slow", "team"), _file("file_slow", "team")
        seq, batch_note = await store.batches._index(rec)
        old, file_note = await store.files._index(f)
        assert (await store.batches.tidy(time.time() + LATER), await store.files.tidy(time.time() + LATER)) == (1, 1)
        assert await r.zscore(keys.batches("team"), rec.id) is None  # the sweep took it for stopped
        await store.batches._record(rec, seq, batch_note)  # …but it was only slow: its record, then its entries
        await store.files._record(f, old, file_note)
        assert await _ids(store, "team") == (["batch_slow"], ["file_slow"])
        assert [b.id for b in await store.batches.active()] == ["batch_slow"]
        assert [x.id for x in await store.files.expired(6000)] == ["file_slow"]
        assert await r.zscore(keys.batches("team"), rec.id) == seq


async def _spend_run(store: Store) -> tuple[float, float]:
    """A batch of two shards with costs, sealed and settled as the finalizer does; the team's spend after the
    settle and after a second one."""
    await store.batches.put(_batch("batch_paid", "payer", BatchStatus.IN_PROGRESS))
    shards = [Shard("batch_paid", 0, "m", 2), Shard("batch_paid", 1, "m", 2)]
    await store.ledger.put_shards("batch_paid", shards)
    for shard in shards:
        results = [Result(line=line, custom_id=f"c{line}", status_code=200, body={}, model="m", cost_usd=0.25 * line)
                   for line in (2 * shard.index + 1, 2 * shard.index + 2)]
        await store.ledger.record_results(shard, results, SpendTo("payer"))
        await store.ledger.record_results(shard, results[:1], SpendTo("payer"))  # again: costs once
    for shard in shards:
        await store.ledger.drop_journal(shard)  # the finalizer seals every shard, then settles
    await store.ledger.settle_spend("batch_paid")
    settled = await store.quota.spend("payer", 0)
    await store.ledger.record_results(shards[0], [Result(line=9, custom_id="c9", status_code=200, body={},
                                                         model="m", cost_usd=5.0)], SpendTo("payer"))  # sealed
    await store.ledger.settle_spend("batch_paid")  # a finalizer run again
    return settled, await store.quota.spend("payer", 0)


async def test_a_settled_batch_leaves_no_spend_moved_and_its_spend_is_exact_and_moved_once(
    any_redis: RedisServer | RedisClusterServers, tmp_path: Path,
) -> None:
    sqlite = SQLiteStore(tmp_path / "s.sqlite3")
    try:
        expected = await _spend_run(sqlite)
    finally:
        await sqlite.aclose()
    assert expected == (2.5, 2.5)  # 0.25 * (1 + 2 + 3 + 4), each line once
    async with _redis(any_redis) as (store, keys):
        r = store.batches._r
        assert await _spend_run(store) == pytest.approx(expected)
        assert await r.hgetall(keys.spend_moved("payer")) == {}
        assert not await r.exists(keys.spend_owed("batch_paid"))
        assert await r.exists(keys.spend_settled("payer", "batch_paid"))
        # the move of a record_results whose lines were journaled before the seal, arriving after the settle
        # (their cost is in the settled total): nothing more
        await SpendMover(r, keys).move("batch_paid", "payer", {"0": "1.5"})
        assert await store.quota.spend("payer", 0) == pytest.approx(2.5)
        assert await r.hgetall(keys.spend_moved("payer")) == {}


async def test_a_settle_that_stopped_before_forgetting_what_is_owed_moves_nothing_when_run_again(
    any_redis: RedisServer | RedisClusterServers,
) -> None:
    async with _redis(any_redis) as (store, keys):
        r = store.batches._r
        await store.batches.put(_batch("batch_cut", "payer", BatchStatus.IN_PROGRESS))
        shard = Shard("batch_cut", 0, "m", 1)
        await store.ledger.put_shards("batch_cut", [shard])
        await store.ledger.record_results(shard, [Result(line=1, custom_id="c1", status_code=200, body={}, model="m",
                                                         cost_usd=0.5)], SpendTo("payer"))
        await store.ledger.drop_journal(shard)
        owed = await r.hgetall(keys.spend_owed("batch_cut"))
        # the settle's team step, then a crash before it deletes the batch's `spend-owed`
        await SpendMover(r, keys).move("batch_cut", "payer", {"0": owed["payer:0"]}, final=True)
        assert await r.exists(keys.spend_owed("batch_cut"))
        await store.ledger.settle_spend("batch_cut")  # the finalizer again: the tombstone turns it away
        assert await store.quota.spend("payer", 0) == pytest.approx(0.5)
        assert not await r.exists(keys.spend_owed("batch_cut"))
        assert await r.hgetall(keys.spend_moved("payer")) == {}


async def test_the_sweep_removes_them_once_the_create_is_older_than_the_grace(
    any_redis: RedisServer | RedisClusterServers, tmp_path: Path,
) -> None:
    """The sweeper of a shared runtime (an API replica's) calls the tidy: a half create of a moment ago stays,
    one that began 11 minutes ago (its note's time moved back, as the clock would have) goes."""
    any_redis.flush()
    config = parse_config(shared_config("http://127.0.0.1:9/v1", ("m",)))
    api = await open_shared(config, any_redis.url, tmp_path / "blobs")
    try:
        keys, r = Keys(), api.store.batches._r  # type: ignore[attr-defined]
        _, note = await api.store.batches._index(_batch("batch_half", "team"))  # type: ignore[attr-defined]
        await api.sweeper.sweep()
        assert await r.zrange(keys.batches("team"), 0, -1) == ["batch_half"]  # under way, for all it knows
        await r.zadd(keys.creating("batches"), {note: time.time() - LATER}, xx=True)
        api.sweeper._files_swept_at = 0.0  # the sweep's 5-second pace for this part: due now
        await api.sweeper.sweep()
        assert await r.zrange(keys.batches("team"), 0, -1) == []
        assert await r.zrange(keys.active, 0, -1) == []
    finally:
        await api.aclose()
