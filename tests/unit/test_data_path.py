"""A shard's data goes one way: what one stage parsed or counted, the next does not read back.

- The planner counts the lines it answers at validation as it writes them.
- Sealing a shard takes the requests its runner already parsed (the requests blob is not read again).
- A `Result`'s `Usage` is read from its body once, when the result is built (`from_json` too).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, BatchStatus, Endpoint, Result, Shard, Usage
from gateway.json_codec import loads
from gateway.pipeline.merge import seal_shard
from gateway.pipeline.plan import Planner
from gateway.store.blobs.directory import LocalBlobs
from gateway.store.blobs.keys import shard_lines_key, shard_results_key
from gateway.store.records import BatchRecord
from gateway.store.splitter import read_lines
from gateway.store.sqlite.store import SQLiteStore
from tests.support.services import shared_config

CONFIG = parse_config(shared_config("http://127.0.0.1:9/v1", ("gpt-mini",), shard_size=2))


async def _lines(*lines: dict[str, object] | str) -> AsyncIterator[bytes]:
    for line in lines:
        yield (line if isinstance(line, str) else json.dumps(line)).encode()


def _request(i: int, model: str = "gpt-mini") -> dict[str, object]:
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}}


async def test_the_planner_counts_answered_lines_as_it_writes_them(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    planner = Planner(CONFIG, blobs, "batch_p", "files/in", endpoint=Endpoint.CHAT, strict=False, allowed_models=None)
    outcome = await planner.plan(_lines(_request(1), _request(2, "nope"), _request(3), _request(4, "gone"),
                                        _request(5)))
    assert not outcome.failed and outcome.total == 5
    assert [(s.route, s.size) for s in outcome.shards] == [("gpt-mini", 2), ("gpt-mini", 1)]
    assert outcome.answered is not None and outcome.answered.size == 2
    key = shard_results_key(outcome.answered)
    written = [Result.from_json(loads(raw)) async for raw in read_lines(blobs, key) if raw]
    assert [r.line for r in written] == [2, 4]
    assert outcome.answered_statuses == {str(written[0].status_code): 2}


async def test_a_failed_plan_writes_no_shard_and_counts_nothing(tmp_path: Path) -> None:
    blobs = LocalBlobs(tmp_path / "blobs")
    planner = Planner(CONFIG, blobs, "batch_f", "files/in", endpoint=Endpoint.CHAT, strict=False, allowed_models=None)
    outcome = await planner.plan(_lines(_request(1), _request(2), _request(3), _request(4, "nope"), "not json"))
    assert outcome.failed and outcome.answered is None
    # the blob of the shards' lines (a full one among them) and the answered lines were aborted: nothing written
    assert await blobs.size(shard_lines_key("batch_f")) is None
    assert await blobs.size(shard_results_key(Shard("batch_f", 2, "", 0))) is None
    assert not (tmp_path / "blobs").exists() or not any(p.is_file() for p in (tmp_path / "blobs").rglob("*"))


async def test_seal_takes_the_requests_its_runner_parsed(tmp_path: Path) -> None:
    store, blobs = SQLiteStore(tmp_path / "s.sqlite3"), LocalBlobs(tmp_path / "blobs")
    try:
        await store.batches.put(BatchRecord(id="batch_s", owner="", endpoint="*", input_file_id="file_x",
                                            completion_window="24h", status=BatchStatus.IN_PROGRESS,
                                            created_at=1, expires_at=2))
        shard = Shard("batch_s", 0, "gpt-mini", 2)
        requests = [BatchRequest(line, f"c{line}", Endpoint.CHAT, {"model": "gpt-mini"}) for line in (3, 1)]
        await store.ledger.put_shards("batch_s", [shard])
        await store.ledger.record_results(shard, [Result(line=1, custom_id="c1", status_code=200, body={}),
                                                  Result(line=3, custom_id="c3", status_code=200, body={})])
        # no requests blob at all: sealing must not need one
        await seal_shard(store, blobs, shard, missing=None, requests=requests)
        sealed = [loads(raw) async for raw in read_lines(blobs, shard_results_key(shard)) if raw]
        assert [r["line"] for r in sealed] == [3, 1]  # in the order of the requests given
        assert await store.ledger.journal(shard) == []
    finally:
        await store.aclose()


def test_usage_is_read_once_when_a_result_is_built() -> None:
    body = {"usage": {"prompt_tokens": 3, "completion_tokens": 5,
                      "completion_tokens_details": {"reasoning_tokens": 2}}}
    result = Result(line=1, custom_id="c1", status_code=200, body=body)
    assert result.usage == Usage(input_tokens=3, output_tokens=5, reasoning_tokens=2)
    assert Result.from_json(result.to_json()).usage == result.usage  # the journal's form, read back
    body["usage"]["prompt_tokens"] = 99  # read at build time: later changes to the body do not count
    assert result.usage.input_tokens == 3
    failed = Result(line=2, custom_id="c2", status_code=500, body=body)
    assert failed.usage == Usage()  # a failed reply's tokens never count
