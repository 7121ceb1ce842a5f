"""The shared store answers as the embedded one does, concept by concept, against a real redis-server.

- Each part of the `Store` (files, batches, the shard ledger, backend state, the teams' quota, rate
  windows and idempotency keys) runs one scenario on `SQLiteStore` and on `RedisStore`: the transcripts of what
  came back are equal, step by step. The team's spend moves with the journal (`record_results`), each line's cost once.
- A shard's results after its seal (`drop_journal`) count nothing, in both; the result log numbers each
  line's first result in the order journaled (`logged`, `drop_log`), and holds only the unsealed shards'
  results: a sealed shard's leave it, its span of seqs kept (`sealed_seqs`).
- `RedisStore` counts each result once when writers race, and `if_status` transitions are atomic.
The `Blobs` are in `test_blobs_parity.py`, the `Queue` and `Coordination` in `test_queue_parity.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.domain import BatchStatus, Result, Shard
from gateway.store.idempotency import IdempotencyEntry
from gateway.store.protocols import Store
from gateway.store.quota import SpendTo, TeamLimits
from gateway.store.records import BatchOptions, BatchRecord, FileRecord, RequestCounts
from gateway.store.redis.connection import connect_redis, open_redis
from gateway.store.redis.store import RedisStore
from gateway.store.sessions import Session, session_name
from gateway.store.sqlite.store import SQLiteStore
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]


@contextlib.asynccontextmanager
async def _stores(redis: RedisServer | RedisClusterServers, tmp_path: Path) -> AsyncIterator[tuple[Store, Store]]:
    """A fresh `SQLiteStore` and a `RedisStore` over an empty Redis or cluster (opened in the test's own event
    loop, as `open_shared` opens it: a cluster's keys in one slot)."""
    redis.flush()
    # An hour's rate window: a scenario never straddles two (a minute's could, between the two stores' runs).
    sqlite = SQLiteStore(tmp_path / "s.sqlite3", rate_window_seconds=3600)
    shared = RedisStore(*await open_redis(redis.url), rate_window_seconds=3600)
    try:
        yield sqlite, shared
    finally:
        await sqlite.aclose()
        await shared.aclose()


def _batch(batch_id: str, owner: str, created: int, status: BatchStatus = BatchStatus.VALIDATING) -> BatchRecord:
    return BatchRecord(id=batch_id, owner=owner, endpoint="/v1/chat/completions", input_file_id="file_in",
                       completion_window="24h", status=status, created_at=created, expires_at=created + 86_400,
                       metadata={"k": "v"}, options=BatchOptions(strict=False, allowed_models=["m"]))


def _result(line: int, status: int | None, tokens: int = 0) -> Result:
    body = {"usage": {"prompt_tokens": tokens, "completion_tokens": 2 * tokens}} if status == 200 else None
    error = None if status else {"code": "batch_cancelled", "message": "no"}
    return Result(line=line, custom_id=f"c{line}", status_code=status, body=body, error=error,
                  request_id=f"req_{line}", id=f"batch_req_{line}", model="m")


def _page(p: Any) -> Any:
    return [[r.id for r in p.data], p.has_more]


async def _files(store: Store) -> list[Any]:
    """Every `FileStore` call, in the order the runtime makes them; the transcript of what came back."""
    files, out = store.files, []
    for i, (fid, created, purpose) in enumerate([("file_b", 100, "batch"), ("file_a", 100, "batch"),
                                                  ("file_c", 101, "batch_output"), ("file_d", 99, "batch")]):
        await files.put(FileRecord(fid, "team", 10 + i, created, f"{fid}.jsonl", purpose, None, f"files/{fid}"))
    await files.put(FileRecord("file_x", "other", 1, 100, "x", "batch", None, "files/file_x"))
    await files.put(FileRecord("file_e", "other", 1, 100, "e", "batch", 150, "files/file_e"))
    out.append([[f.id for f in await files.expired(at)] for at in (150, 151)])
    await files.delete("file_e")
    out.append([f.id for f in await files.expired(151)])
    out.append((await files.get("file_a")).to_json())  # type: ignore[union-attr]
    out.append([await files.get("file_a", "other"), await files.get("nope")])
    for order in ("asc", "desc"):
        for after in (None, "file_a", "file_b", "file_c", "gone"):
            for purpose in (None, "batch"):
                for limit in (1, 2, 10):
                    p = await files.page("team", purpose=purpose, limit=limit, order=order, after=after)
                    out.append([order, after, purpose, limit, _page(p)])
    out.append([await files.delete("file_a", "other"), await files.delete("file_a", "team"),
                await files.delete("file_a")])
    out.append(_page(await files.page("team", purpose=None, limit=10, order="asc", after=None)))
    # a record put again under another owner and purpose moves between their lists
    await files.put(FileRecord("file_b", "other", 10, 100, "b", "batch_output", 170, "files/file_b"))
    out.append([_page(await files.page(owner, purpose=purpose, limit=10, order="asc", after=None))
                for owner in ("team", "other") for purpose in (None, "batch", "batch_output")])
    out.append([f.id for f in await files.expired(171)])
    return out


async def _batches(store: Store) -> list[Any]:
    """Every `BatchStore` call: lists by creation order, conditional updates, the active set."""
    batches, out = store.batches, []
    for i, bid in enumerate(["batch_1", "batch_2", "batch_3"]):
        await batches.put(_batch(bid, "team", 1000 - i))  # creation order, not created_at, decides
    await batches.put(_batch("batch_o", "other", 5))
    for after in (None, "batch_3", "batch_2", "batch_1", "gone"):
        for limit in (1, 2, 5):
            out.append([after, limit, _page(await batches.page("team", limit=limit, after=after))])
    out.append(await batches.update("batch_1", {"status": BatchStatus.IN_PROGRESS, "in_progress_at": 7},
                                    if_status={BatchStatus.VALIDATING}))
    out.append(await batches.update("batch_1", {"status": BatchStatus.FAILED},
                                    if_status={BatchStatus.VALIDATING, BatchStatus.CANCELLING}))
    out.append(await batches.update("batch_1", {"counts": RequestCounts(total=5), "model": "m", "shards_total": 3,
                                                "routes": {"a": {"n": [1, 2.5]}}, "summary": {"failed": 1}}))
    out.append(await batches.update("missing", {"model": "m"}))
    rec = await batches.get("batch_1")
    assert rec is not None
    out.append([rec.to_json(), rec.to_openai()])
    out.append([await batches.get("batch_1", "other"), await batches.get("missing")])
    out.append([b.id for b in await batches.active()])
    out.append(await batches.update("batch_2", {"status": BatchStatus.COMPLETED, "completed_at": 9}))
    out.append([b.id for b in await batches.active()])
    out.append(await batches.update("batch_2", {"status": BatchStatus.CANCELLING}))
    with pytest.raises(TypeError, match="not an updatable batch field: modle"):
        await batches.update("batch_2", {"modle": "m"})  # type: ignore[typeddict-unknown-key]
    out.append([b.id for b in await batches.active()])
    return out


async def _batch_kinds(store: Store) -> list[Any]:
    """A page of one kind of id (`batch`, `msgbatch`: one API family's) or all, either way from a cursor
    (`after`: older, `before`: newer); `delete` takes only a finished batch of its owner's."""
    batches, out = store.batches, []
    ids = ["batch_1", "msgbatch_1", "batch_2", "msgbatch_2", "msgbatch_3", "batch_3"]
    for i, bid in enumerate(ids):
        await batches.put(_batch(bid, "team", 1000 + i))
    await batches.put(_batch("msgbatch_o", "other", 5))
    for kind in (None, "batch", "msgbatch"):
        for cursor in (None, "msgbatch_1", "batch_2", "msgbatch_3"):
            for limit in (1, 2, 5):
                out.append([kind, cursor, limit, _page(await batches.page("team", limit=limit, after=cursor,
                                                                          kind=kind)),
                            _page(await batches.page("team", limit=limit, after=None, before=cursor, kind=kind))])
    await batches.update("msgbatch_2", {"status": BatchStatus.COMPLETED, "completed_at": 9})
    out.append([await batches.delete("msgbatch_1", "team"), await batches.delete("msgbatch_2", "other"),
                await batches.delete("missing", "team")])  # running, another's, none
    out.append([await batches.delete("msgbatch_2", "team"), await batches.get("msgbatch_2")])
    out.append([_page(await batches.page("team", limit=10, after=None, kind="msgbatch")),
                [b.id for b in await batches.active()]])
    return out


async def _ledger(store: Store) -> list[Any]:
    """Every `ShardLedger` call: shards, attempts, the journal, and the counters it moves in the batch."""
    ledger, out = store.ledger, []
    await store.batches.put(_batch("batch_1", "team", 1000))
    await store.batches.update("batch_1", {"counts": RequestCounts(total=5), "shards_total": 3})
    shards = [Shard("batch_1", 0, "m", 2), Shard("batch_1", 1, "m", 2), Shard("batch_1", 2, "", 1)]
    await ledger.put_shards("batch_1", shards)
    await ledger.put_shards("batch_1", [Shard("batch_1", 0, "changed", 9)])  # ignored: already there
    out.append([s.to_json() for s in await ledger.get_shards("batch_1")])
    await ledger.record_results(shards[0], [_result(1, 200, 3), _result(2, 500)])
    await ledger.record_results(shards[0], [_result(1, 200, 3), _result(2, 200, 4)])  # both already recorded
    priced = _result(4, 200, 1)
    priced.cost_usd, priced.reruns = 0.125, 2  # valid at its third attempt
    invalid = _result(6, 200, 1)  # still not matching its schema after one re-run: counted failed, live
    invalid.reruns, invalid.error = 1, {"code": "output_invalid", "message": "/: no"}
    await ledger.record_results(shards[1], [_result(3, None), priced, invalid])
    await ledger.record_results(Shard("missing", 0, "m", 1), [_result(1, 200, 5)])
    out.append(sorted(r.to_json()["line"] for r in await ledger.journal(shards[0])))
    out.append([r.to_json() for r in sorted(await ledger.journal(shards[1]), key=lambda r: r.line)])
    out.append(sorted(await ledger.recorded_lines(shards[1])))
    await ledger.drop_journal(shards[1])
    sealed = await store.batches.get("batch_1")
    # after the seal: the same shard run again (a worker taken for dead) counts nothing, new lines or not
    await ledger.record_results(shards[1], [_result(3, 200, 9), _result(5, 200, 1)], SpendTo("team"))
    again = await store.batches.get("batch_1")
    assert sealed is not None and again is not None
    assert (again.counts, again.usage) == (sealed.counts, sealed.usage)
    assert await store.quota.spend("team", 0) == 0
    out.append([await ledger.journal(shards[1]), sorted(await ledger.recorded_lines(shards[0]))])
    # The sealed shard's results left the log (its results blob holds them): its span of seqs is what is kept,
    # and the next result still takes the next seq.
    await ledger.record_results(shards[0], [_result(7, 200, 1)])
    assert [(r.seq, r.line) for r in await ledger.logged("batch_1", 0, 100)] == [(1, 1), (2, 2), (6, 7)]
    assert await ledger.sealed_seqs("batch_1") == {1: (3, 5)}
    out.append([await ledger.sealed_seqs("batch_1"), await ledger.sealed_seqs("missing")])
    out.append([await ledger.finish_shard(shards[0]), await ledger.finish_shard(shards[0]),
                await ledger.finish_shard(Shard("batch_1", 9, "m", 1))])
    out.append([s.index for s in await ledger.unfinished_shards("batch_1")])
    await ledger.record_answered(shards[2], 0)  # nothing to count: the shard is not sealed by it
    await ledger.record_answered(shards[2], 1)  # the lines answered at validation: counted failed…
    await ledger.record_answered(shards[2], 1)  # …once
    stats = await ledger.route_stats("batch_1")
    assert (stats[""].failed, stats["m"].completed, stats["m"].failed) == (1, 3, 3)
    assert (stats["m"].reruns, stats["m"].output_invalid) == (3, 1)
    out.append({route: s.to_json() for route, s in sorted(stats.items())})
    out.append([await ledger.begin_attempt(shards[0]), await ledger.begin_attempt(shards[0]),
                await ledger.begin_attempt(shards[1])])
    # An attempt given back (a fault of the machine) is not counted; never below 0.
    out.append([await ledger.return_attempt(shards[0]), await ledger.begin_attempt(shards[0]),
                await ledger.return_attempt(shards[2]), await ledger.return_attempt(shards[2])])
    rec = await store.batches.get("batch_1")  # request_counts and usage are the ledger's counters
    assert rec is not None
    out.append([rec.to_json(), rec.to_openai(await ledger.route_stats("batch_1"))])
    out.append([await ledger.finish_shard(shards[1]), await ledger.finish_shard(shards[2])])
    out.append([await ledger.get_shards("missing"), await ledger.unfinished_shards("missing")])
    # The result log: each line's first result, numbered in the order journaled (none after the seal).
    out.append([(r.seq, r.line) for r in await ledger.logged("batch_1", 0, 100)])
    out.append([r.to_json() for r in await ledger.logged("batch_1", 2, 1)])
    await ledger.drop_log("batch_1")
    assert await ledger.sealed_seqs("batch_1") == {}
    out.append([await ledger.logged("batch_1", 0, 100), [r.to_json() for r in await ledger.logged("missing", 0, 9)]])
    return out


async def _backend_state(store: Store) -> list[Any]:
    """Every `BackendState` call."""
    state, out = store.backend_state, []
    await state.put("native:x", {"ids": ["a", "b"], "n": 1})
    await state.put("native:y", {"n": 2})
    await state.put("native:y", {"n": 3})  # replaced, not merged
    out.append([await state.get("native:x"), await state.get("native:y"), await state.get("none")])
    await state.delete("native:x")
    await state.delete("none")
    out.append([await state.get("native:x"), await state.get("native:y")])
    for key in ("upload:u1", "upload:u1:part:p1", "upload:u2", "uploads", "up_%:x", "up*[x]"):
        await state.put(key, {"k": key})
    # a prefix's glob and LIKE characters are plain characters
    out.append([sorted(await state.scan(p)) for p in ("upload:", "upload:u1:part:", "up_%", "up*[", "none")])
    return out


async def _quota(store: Store) -> list[Any]:
    """Every `QuotaLedger` call: admissions against each quota, per team; release; spend (moved by the ledger)."""
    quota, out = store.quota, []
    limits = TeamLimits(max_enqueued_requests=10, max_active_batches=3, model_max_enqueued_requests={"m": 4})
    for team, batch, requests, by_model in [("t", "b1", 3, {"m": 3}), ("t", "b2", 2, {"m": 2}),  # m: 5 > 4
                                            ("t", "b2", 2, {"n": 2}), ("t", "b3", 6, {"n": 6}),  # 11 > 10
                                            ("t", "b3", 1, {}), ("t", "b4", 1, {}),  # a 4th active batch
                                            ("u", "b5", 1, {"m": 4})]:  # another team counts apart
        out.append(await quota.admit(team, batch, requests, limits, by_model))
    usage = [await quota.usage(t) for t in ("t", "u", "none")]
    out.append([(u.active_batches, u.enqueued_requests, dict(u.by_model)) for u in usage])
    out.append(sorted(await quota.admitted()))
    await quota.release(["b1", "b5", "nope"])
    out.append([(u.active_batches, u.enqueued_requests, dict(u.by_model)) for u in
                [await quota.usage(t) for t in ("t", "u")]])
    out.append(await quota.admit("t", "b6", 1, limits, {"m": 4}))  # b1's place on m is free again
    await store.batches.put(_batch("batch_s", "t", 1))
    shard = Shard("batch_s", 0, "m", 3)
    priced = [_result(line, 200, 1) for line in (1, 2, 3)]
    for r, usd in zip(priced, (0.25, 0.5, 0.125), strict=True):
        r.cost_usd = usd
    await store.ledger.record_results(shard, priced[:2], SpendTo("t", 100))
    await store.ledger.record_results(shard, priced[1:], SpendTo("t", 100))  # line 2 is journaled already
    await store.ledger.record_results(Shard("batch_s", 1, "m", 1), [priced[0]])  # no SpendTo: no spend
    journaled = sum(r.cost_usd or 0 for r in await store.ledger.journal(shard))
    out.append([await quota.spend("t", 100), await quota.spend("t", 0), await quota.spend("u", 100), journaled])
    assert await quota.spend("t", 100) == journaled == 0.875  # the spend is the cost of what is journaled
    # Holds against a $1 budget: the spend (0.875 in period 100) and the other holds leave the room.
    out.append(await quota.reserve("t", 100, "b/0/1/", [0.05, 0.05, 0.05], 1.0))  # room 0.125: two fit
    out.append(await quota.reserve("t", 100, "c/0/1/", [0.02, 0.01], 1.0))  # room 0.025: one
    out.append(await quota.reserve("t", 100, "b/0/1/", [0.05, 0.05, 0.05], 1.0))  # its own hold replaced: two
    out.append(await quota.reserve("t", 0, "d/0/1/", [0.5, 0.5], 1.0))  # no spend in period 0: 0.88 left, one
    out.append(await quota.reserve("t", 100, "e/0/1/", [0.001], 1.0))  # nothing left: none, and no hold
    out.append(await quota.reserve("t", 100, "f/0/1/", [], 1.0))
    out.append(await quota.reserve("u", 100, "b/0/1/", [0.4], 0.5))  # another team holds apart
    out.append({h: round(usd, 9) for h, usd in (await quota.reserved("t")).items()})
    await quota.shrink("t", "c/0/1/", 0.015)
    await quota.shrink("t", "d/0/1/", 0.75)  # never below nothing
    await quota.shrink("t", "nope/", 0.1)  # nothing held: nothing made
    out.append({h: round(usd, 9) for h, usd in (await quota.reserved("t")).items()})
    await quota.unreserve("t", "b/")
    await quota.unreserve("t", "nope/")
    out.append({h: round(usd, 9) for h, usd in (await quota.reserved("t")).items()})
    out.append({h: round(usd, 9) for h, usd in (await quota.reserved("u")).items()})
    assert out[-11:-4] == [2, 1, 2, 1, 0, 0, 1] and out[-4] == {"b/0/1/": 0.1, "c/0/1/": 0.02, "d/0/1/": 0.5}
    assert out[-3] == {"b/0/1/": 0.1, "c/0/1/": 0.005, "d/0/1/": 0.0}, out[-3]
    return out


async def _rates(store: Store) -> list[Any]:
    """Every `RateWindows` call: rpm grants up to the limit, tpm closes the window, each (team, route) apart."""
    rates, out = store.rates, []
    for team, route, want, rpm, tpm in [("t", "m", 5, 8, None), ("t", "m", 5, 8, None), ("t", "m", 1, 8, None),
                                        ("t", "n", 5, 8, None), ("u", "m", 5, 8, None), ("t", "x", 2, None, 100)]:
        out.append((await rates.take(team, route, want, rpm, tpm)).granted)
    await rates.add_tokens("t", "x", 60)
    out.append((await rates.take("t", "x", 2, None, 100)).granted)  # 60 < 100: still open
    await rates.add_tokens("t", "x", 40)
    out.append([(await rates.take("t", "x", 2, 50, 100)).granted, await rates.used("t", "x"),
                await rates.used("t", "m"), await rates.used("none", "m")])
    # tpm with an estimate reserved per request: 3 fit 100 at 30; then one while under; a correction reopens
    out.append([(await rates.take("t", "y", 5, None, 100, 30)).granted for _ in range(3)])
    await rates.add_tokens("t", "y", -50)
    out.append([(await rates.take("t", "y", 5, None, 100, 30)).granted, await rates.used("t", "y")])
    assert out[-2:] == [[3, 1, 0], [1, (5, 100)]]
    assert 0 < (await rates.take("t", "m", 1, 8, None)).wait <= 3600
    return out


async def _idempotency(store: Store) -> list[Any]:
    """Every `IdempotencyKeys` call: one reservation of racing ones; only its token completes or releases it;
    a completed entry answers every later reserve; a failed one goes; a lapsed one is taken over; per team."""
    keys, out = store.idempotency, []

    def seen(entry: IdempotencyEntry | None) -> Any:
        return None if entry is None else [entry.token, entry.fingerprint, entry.done, entry.result,
                                           entry.created_at > 0]

    out.append(seen(await keys.reserve("t", "k:1", "a", "fp-a", 60)))
    out.append([seen(e) for e in await asyncio.gather(*(keys.reserve("t", "k:1", f"b{i}", "fp-b", 60)
                                                         for i in range(4)))])
    out.append(seen(await keys.reserve("u", "k:1", "c", "fp", 60)))  # another team's key of the same text
    out.append(await keys.complete("t", "k:1", "b0", "fp-b", {"id": "no"}))  # not its reservation
    await keys.release("t", "k:1", "b0")
    result = {"kind": "batch", "id": "batch_1", "status": 200, "body": {"id": "batch_1", "n": 1.5}}
    out.append([await keys.complete("t", "k:1", "a", "fp-final", result),
                await keys.complete("t", "k:1", "a", "again", {})])  # once
    await keys.release("t", "k:1", "a")  # completed: kept
    out.append(seen(await keys.reserve("t", "k:1", "d", "fp-d", 60)))
    await keys.release("u", "k:1", "c")  # its request failed: the key is free
    out.append(seen(await keys.reserve("u", "k:1", "e", "fp", 0.2)))
    await asyncio.sleep(0.3)
    out.append([seen(await keys.reserve("u", "k:1", "f", "fp", 60)),  # e's lapsed: taken over
                await keys.complete("u", "k:1", "e", "fp", result), seen(await keys.reserve("u", "k:1", "g", "", 60))])
    assert out[1] == [["a", "fp-a", False, None, True]] * 4 and out[5][:4] == ["a", "fp-final", True, result]
    return out


async def _sessions(store: Store) -> list[Any]:
    """Every `DashboardSessions` call: a session reads back as opened until it lapses or is closed; another
    name reads nothing; opening a name again replaces it; closing what is gone is fine."""
    sessions, out = store.sessions, []
    now = time.time()
    a, b = session_name("cookie-a"), session_name("cookie-b")
    await sessions.open(a, Session("digest-a", now + 60))
    await sessions.open(b, Session("digest-b", now + 0.2))
    out.append([await sessions.get(a) == Session("digest-a", now + 60),
                (await sessions.get(b) or Session("", 0)).key_digest, await sessions.get(session_name("cookie-c"))])
    await asyncio.sleep(0.3)
    out.append(await sessions.get(b))  # lapsed
    await sessions.open(a, Session("digest-a2", now + 60))
    out.append((await sessions.get(a) or Session("", 0)).key_digest)
    await sessions.close(a)
    await sessions.close(a)
    out.append([await sessions.get(a), await sessions.get(b)])
    assert out == [[True, "digest-b", None], None, "digest-a2", [None, None]]
    return out


SCENARIOS: dict[str, Callable[[Store], Awaitable[list[Any]]]] = {
    "files": _files, "batches": _batches, "batch_kinds": _batch_kinds, "ledger": _ledger,
    "backend_state": _backend_state, "quota": _quota,
    "rates": _rates, "idempotency": _idempotency, "sessions": _sessions,
}


@pytest.mark.parametrize("concept", sorted(SCENARIOS))
async def test_redis_store_answers_as_sqlite_does(concept: str, any_redis: RedisServer | RedisClusterServers,
                                                  tmp_path: Path) -> None:
    async with _stores(any_redis, tmp_path) as (sqlite, shared):
        expected = await SCENARIOS[concept](sqlite)
        got = await SCENARIOS[concept](shared)
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert g == e, f"{concept}, step {i}"


async def test_store_counts_each_result_once_under_concurrency(any_redis: RedisServer | RedisClusterServers,
                                                               tmp_path: Path) -> None:
    async with _stores(any_redis, tmp_path) as (_, store):
        await store.batches.put(_batch("batch_c", "t", 1))
        shard = Shard("batch_c", 0, "m", 200)
        results = [_result(i, 200 if i % 2 else 429, 1) for i in range(1, 201)]
        # eight writers race over overlapping halves: every line must count once
        await asyncio.gather(*(store.ledger.record_results(shard, results[(k * 25) % 100:(k * 25) % 100 + 100])
                               for k in range(8)))
        await asyncio.gather(*(store.ledger.record_results(shard, results) for _ in range(4)))
        rec = await store.batches.get("batch_c")
        assert rec is not None
        assert (rec.counts.completed, rec.counts.failed) == (100, 100)
        assert rec.usage.input_tokens == 100 and rec.usage.output_tokens == 200
        # if_status is atomic: of many racing transitions exactly one applies
        applied = await asyncio.gather(*(store.batches.update("batch_c", {"status": BatchStatus.IN_PROGRESS},
                                                              if_status={BatchStatus.VALIDATING}) for _ in range(20)))
        assert sum(applied) == 1


async def test_rate_windows_grant_rpm_once_under_concurrency_and_reopen(redis_server: RedisServer,
                                                                      tmp_path: Path) -> None:
    with redis_server.client() as c:
        c.flushall()
    stores = [SQLiteStore(tmp_path / "r.sqlite3", rate_window_seconds=1),
              RedisStore(connect_redis(redis_server.url), rate_window_seconds=1)]
    try:
        for store in stores:
            await asyncio.sleep(_rates_left(store))  # at a window's start: the takes below fall in one window
            grants = await asyncio.gather(*(store.rates.take("t", "m", 2, 7, None) for _ in range(10)))
            assert sum(g.granted for g in grants) == 7  # never more than rpm, however many ask at once
            closed = await store.rates.take("t", "m", 1, 7, None)
            assert closed.granted == 0 and 0 < closed.wait <= 1
            await asyncio.sleep(closed.wait + 0.01)
            assert (await store.rates.take("t", "m", 3, 7, None)).granted == 3  # the next window is open
    finally:
        for store in stores:
            await store.aclose()


def _rates_left(store: Store) -> float:
    return 1 - time.time() % store.rates.window_seconds + 0.01
