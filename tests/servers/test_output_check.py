"""Replies checked against their request's schema, bad lines re-run (gateway.lines.output_check,
gateway.pipeline.output_reruns), on the embedded runtime against the loopback upstream, which answers a request
that names a schema with JSON made from it, wrong in the way its `#schema:KIND` directive says (on the first
attempt only with `xN`, always without; tests/fakes/upstream/structured.py).

- a line wrong on its first attempt (invalid JSON, a wrong type, a missing key, an extra key under
  `additionalProperties: false`, a cut-off reply, a strict tool's bad arguments) holds its second, valid reply,
  in input order, with `reruns: 1` in the journal and the batch's `routes`;
- a line wrong every time keeps its last reply (200 and its body) and fails with `output_invalid`, the message
  naming the first failing place as a JSON pointer; it counts as failed, and each attempt is paid;
- `output_reruns: 0` checks without re-running; a line without a schema is never checked or re-run;
- a schema over 64 KB, or one that cannot compile, fails a batch at validation, naming its line;
- the counts are the store's live route counts too (and a data dir from before them gains them);
- a native route re-runs its bad lines in one follow-up provider job a round, at batch price, found again after
  a restart; with no time left in the batch's window for a job, in real time at the real-time price.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from openai.types import Batch

from gateway.api.dashboard.view import batch_view
from gateway.config.schema import parse_config
from gateway.domain import BatchRequest, BatchStatus, Endpoint, Result, RouteStats, Shard
from gateway.json_codec import loads
from gateway.runtime.runtime import Runtime
from gateway.store.records import BatchOptions, BatchRecord, now
from gateway.store.sqlite.store import SQLiteStore
from providers.native.runner import NativeBatchBackend, native_route_summary
from tests.fakes.upstream.server import Upstream
from tests.servers.test_metrics import scrape, value
from tests.support.native_config import native_route
from tests.support.server_helpers import (
    chat_line,
    embedded_runtime,
    gateway_config,
    jsonl,
    read_jsonl,
    start_gateway,
    submit,
    wait_batch,
)

MODEL = "gpt-4o-mini"  # priced by LiteLLM's cost map: every attempt's cost shows
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}},
                                                          "required": ["n"], "additionalProperties": False}}},
    "required": ["name", "age", "items"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}
TOOL = {"type": "function", "function": {"name": "record", "strict": True, "parameters": SCHEMA}}


def _config(upstream: Upstream, reruns: int | None = None) -> Any:
    team: dict[str, Any] = {"team_id": "alpha", "api_keys": ["sk-alpha"]}
    if reruns is not None:
        team["output_check"] = {"reruns": reruns}
    return parse_config(gateway_config(upstream, models=(MODEL,), teams=[team], shard_size=4))


async def _run(runtime: Runtime, lines: list[dict[str, Any]], options: BatchOptions | None = None,
               endpoint: str = "/v1/chat/completions") -> tuple[BatchRecord, list[dict[str, Any]]]:
    async def chunks() -> AsyncIterator[bytes]:
        yield jsonl(lines)

    source = await runtime.service.upload_file("alpha", "in.jsonl", "batch", chunks())
    batch = await runtime.service.create_batch("alpha", input_file_id=source.id, endpoint=endpoint,
                                               completion_window="24h", options=options)
    done = await runtime.service.wait(batch.id)
    rows: list[dict[str, Any]] = []
    for file_id in (done.output_file_id, done.error_file_id):
        if file_id is not None:
            record = await runtime.store.files.get(file_id)
            assert record is not None
            data = b"".join([chunk async for chunk in runtime.blobs.read(record.blob_key)])
            rows += [loads(raw) for raw in data.splitlines() if raw]
    return done, sorted(rows, key=lambda r: int(r["custom_id"].split("-")[1]))


def _content(row: dict[str, Any]) -> Any:
    message = row["response"]["body"]["choices"][0]["message"]
    if message.get("tool_calls"):
        return orjson.loads(message["tool_calls"][0]["function"]["arguments"])
    return orjson.loads(message["content"])


async def test_a_line_wrong_once_holds_its_second_reply_and_one_wrong_always_fails(upstream: Upstream,
                                                                                   tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]  # the upstream counts attempts per exact text
    kinds = ["badjson", "wrongtype", "missing", "extra", "length"]
    lines = [chat_line("c-0", MODEL, f"{tag} fine", response_format=FORMAT)]
    lines += [chat_line(f"c-{i + 1}", MODEL, f"{tag} #schema:{k}x1", response_format=FORMAT)
              for i, k in enumerate(kinds)]
    lines.append(chat_line("c-6", MODEL, f"{tag} #schema:badtoolx1", tools=[TOOL]))
    lines.append(chat_line("c-7", MODEL, f"{tag} #schema:wrongtype #count", response_format=FORMAT))
    lines.append(chat_line("c-8", MODEL, f"{tag} no schema #schema:wrongtype #count"))
    lines.append(chat_line("c-9", MODEL, f"{tag} object #schema:extrax1", response_format={"type": "json_object"}))
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        batch, rows = await _run(runtime, lines)
        live = (await runtime.store.ledger.route_stats(batch.id))[MODEL]  # what a running batch's object shows

    assert batch.status is BatchStatus.COMPLETED
    assert [r["custom_id"] for r in rows] == [f"c-{i}" for i in range(10)]
    for row in rows[:7]:
        assert row["error"] is None and row["response"]["status_code"] == 200, row
        assert _content(row) == {"name": "text", "age": 7, "items": [{"n": 7}]}
    assert rows[6]["response"]["body"]["choices"][0]["finish_reason"] == "tool_calls"
    # json_object: any object, an extra key included; never re-run
    assert rows[9]["error"] is None and "unexpected_key" in _content(rows[9])

    invalid = rows[7]
    assert invalid["response"]["status_code"] == 200  # the last reply is kept whole
    assert _content(invalid)["name"] == []
    assert invalid["error"]["code"] == "output_invalid"
    assert invalid["error"]["message"].startswith("The output does not match the request's schema after 3 attempts: "
                                                  "/name: [] is not of type \"string\"")
    stats = upstream.stats()["by_custom"]
    assert stats[f"{tag} #schema:wrongtype #count"] == 3  # the first attempt and two re-runs (the default)
    assert stats[f"{tag} no schema #schema:wrongtype #count"] == 1  # no schema: never checked
    assert rows[8]["error"] is None

    assert (batch.counts.completed, batch.counts.failed) == (9, 1)
    route = batch.routes[MODEL]
    assert route["reruns"] == 6 + 2 and route["output_invalid"] == 1
    assert (live.reruns, live.output_invalid) == (8, 1)  # counted as the results were recorded, not at finalize
    assert batch.summary is not None and batch.summary["by_model"][MODEL] == {"200": 9, "output_invalid": 1}


async def test_every_attempt_is_paid_and_zero_reruns_only_checks(upstream: Upstream, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    text = f"{tag} #schema:missing"
    async with embedded_runtime(_config(upstream, reruns=1), tmp_path) as runtime:
        team, team_rows = await _run(runtime, [chat_line("c-0", MODEL, text, response_format=FORMAT)])
        once, once_rows = await _run(runtime, [chat_line("c-0", MODEL, text, response_format=FORMAT)],
                                     BatchOptions(output_reruns=0))
    assert team_rows[0]["error"]["message"].startswith(
        "The output does not match the request's schema after 2 attempts: /: \"name\" is a required property")
    assert once_rows[0]["error"]["message"].startswith("The output does not match the request's schema after 1 "
                                                       "attempt: ")
    assert team.routes[MODEL]["reruns"] == 1 and once.routes[MODEL]["reruns"] == 0
    assert once.routes[MODEL]["output_invalid"] == team.routes[MODEL]["output_invalid"] == 1
    single = once.routes[MODEL]["cost_usd"]
    assert single > 0
    assert abs(team.routes[MODEL]["cost_usd"] - 2 * single) < 1e-12  # the same reply twice, both paid


async def test_a_responses_line_is_checked_against_its_text_format(upstream: Upstream, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    fmt = {"text": {"format": {"type": "json_schema", "name": "person", "strict": True, "schema": SCHEMA}}}
    lines = [{"custom_id": f"c-{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": MODEL, "input": f"{tag} {directive}", **fmt}}
             for i, directive in enumerate(["#schema:lengthx1", "#schema:wrongtype"])]
    async with embedded_runtime(_config(upstream, reruns=1), tmp_path) as runtime:
        batch, rows = await _run(runtime, lines, endpoint="/v1/responses")
    assert rows[0]["error"] is None and rows[0]["response"]["body"]["status"] == "completed"
    assert rows[1]["error"]["code"] == "output_invalid"
    assert batch.routes[MODEL]["reruns"] == 2


async def test_a_schema_too_large_or_that_cannot_compile_fails_validation(upstream: Upstream,
                                                                          tmp_path: Path) -> None:
    huge = {**SCHEMA, "description": "x" * 70_000}
    broken = {"type": "object", "properties": {"a": {"type": "wat"}}}
    cases = [(huge, "The schema is "), (broken, "The schema cannot be compiled: ")]
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        for schema, message in cases:
            fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
            lines = [chat_line("c-0", MODEL, "fine"), chat_line("c-1", MODEL, "bad", response_format=fmt)]
            batch, _ = await _run(runtime, lines)
            assert batch.status is BatchStatus.FAILED
            assert batch.errors is not None
            [error] = batch.errors
            assert error["line"] == 2 and error["param"] == "body.response_format.json_schema.schema"
            assert error["message"].startswith(message)


def test_through_serve_with_the_openai_sdk_then_its_retry(upstream: Upstream, tmp_path: Path) -> None:
    """`serve` end to end: the openai SDK's batch, its output and error files, `routes`, the dashboard's card, the
    Prometheus counters, and the API's retry taking the `output_invalid` line like any failed one."""
    tag = uuid.uuid4().hex[:8]
    master = "sk-master-output-check"
    config = gateway_config(upstream, master_key=master, models=(MODEL,),
                            teams=[{"team_id": "alpha", "api_keys": ["sk-alpha"], "output_check": {"reruns": 1}}])
    lines = [chat_line(f"c-{i}", MODEL, f"{tag} {d}", response_format=FORMAT)
             for i, d in enumerate(["fine", "#schema:missingx1", "#schema:wrongtypex2"])]
    with start_gateway(config, tmp_path / "data") as gw:
        client = gw.client("sk-alpha")
        batch = wait_batch(client, submit(client, lines).id)
        assert batch.status == "completed"
        assert batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
        output, errors = read_jsonl(client, batch.output_file_id), read_jsonl(client, batch.error_file_id)
        assert [r["custom_id"] for r in output] == ["c-0", "c-1"] and [r["custom_id"] for r in errors] == ["c-2"]
        [invalid] = errors
        assert invalid["response"]["status_code"] == 200 and invalid["error"]["code"] == "output_invalid"
        assert "after 2 attempts: /name: " in invalid["error"]["message"]
        routes = client.get(f"/batches/{batch.id}", cast_to=httpx.Response).json()["routes"]
        assert routes[MODEL]["reruns"] == 2 and routes[MODEL]["output_invalid"] == 1

        with httpx.Client(base_url=gw.url) as browser:  # the dashboard's card of the batch
            login = browser.post("/ui/login", data={"api_key": "sk-alpha"}, headers={"Origin": gw.url})
            assert login.status_code == 303, login.text
            cards = browser.get("/ui/api/batches").json()["cards"]
            assert "2 re-runs for the schema, 1 output_invalid" in cards[batch.id]

        samples = scrape(gw.url, master)
        assert value(samples, "batchyard_output_reruns_total", team="alpha", route=MODEL) == 2
        assert value(samples, "batchyard_output_invalid_total", team="alpha", route=MODEL) == 1

        # the third attempt of `#schema:wrongtypex2` is valid: the retry's batch answers it
        again = wait_batch(client, client.post(f"/batches/{batch.id}/retry", cast_to=Batch).id)
        assert again.request_counts is not None and again.request_counts.total == 1
        [row] = read_jsonl(client, again.output_file_id)
        assert row["custom_id"] == "c-2" and row["error"] is None


BATCH_PRICE = {"input_cost_per_token_batches": 1e-6, "output_cost_per_token_batches": 4e-6}
REALTIME_PRICE = {"input_cost_per_token": 1e-5, "output_cost_per_token": 3e-5}


def _native_params(upstream: Upstream) -> dict[str, Any]:
    return {"model": f"openai/{MODEL}", "api_base": upstream.v1_url, "api_key": upstream.api_key}


def _billed(upstream: Upstream) -> tuple[int, int]:
    """The tokens the loopback provider billed its batch jobs' answered lines so far."""
    tokens = upstream.stats()["billed"].get(MODEL) or {"input": 0, "output": 0}
    return int(tokens["input"]), int(tokens["output"])


async def test_a_native_route_reruns_its_bad_lines_in_one_follow_up_job_at_batch_price(upstream: Upstream,
                                                                                       tmp_path: Path) -> None:
    """A native route's bad lines go into one follow-up provider job a round (docs/output-check.md): the line wrong
    on its first attempt holds its second, valid reply; the one wrong always fails `output_invalid` after its two
    attempts; the provider saw two jobs, and every attempt is paid at the batch price, in the team's spend as in
    the route's cost."""
    tag = uuid.uuid4().hex[:8]
    entry = {"model_name": MODEL, "litellm_params": _native_params(upstream),
             "model_info": {"batch_mode": "native", "native_poll_max_seconds": 0.2, **BATCH_PRICE, **REALTIME_PRICE}}
    config = parse_config({"model_list": [entry], "batch_settings": {
        "teams": [{"team_id": "alpha", "output_check": {"reruns": 1}}]}})
    lines = [chat_line(f"c-{i}", MODEL, f"{tag} {d}", response_format=FORMAT)
             for i, d in enumerate(["fine", "#schema:wrongtypex1", "#schema:missing"])]
    jobs, billed = upstream.stats()["batches_created"], _billed(upstream)
    async with embedded_runtime(config, tmp_path) as runtime:
        batch, rows = await _run(runtime, lines)
        spent = await runtime.store.quota.spend("alpha", 0)
    assert upstream.stats()["batches_created"] - jobs == 2  # the first pass's job and one follow-up job
    assert [r["custom_id"] for r in rows] == ["c-0", "c-1", "c-2"]
    for row in rows[:2]:
        assert row["error"] is None and _content(row) == {"name": "text", "age": 7, "items": [{"n": 7}]}
    assert rows[2]["response"]["status_code"] == 200
    assert rows[2]["error"]["message"].startswith("The output does not match the request's schema after 2 "
                                                  'attempts: /: "name" is a required property')
    assert (batch.counts.completed, batch.counts.failed) == (2, 1)
    route = batch.routes[MODEL]
    assert route["reruns"] == 2 and route["output_invalid"] == 1 and len(route["upstream_batch_ids"]) == 2

    tokens_in, tokens_out = (now - then for now, then in zip(_billed(upstream), billed, strict=True))
    assert route["input_tokens"] == tokens_in > 0 and route["output_tokens"] == tokens_out > 0  # five attempts
    bill = tokens_in * BATCH_PRICE["input_cost_per_token_batches"] + tokens_out * BATCH_PRICE[
        "output_cost_per_token_batches"]
    assert spent == pytest.approx(bill, rel=1e-9) and route["cost_usd"] == pytest.approx(bill, rel=1e-9)


async def test_a_native_rerun_with_no_time_left_for_a_job_runs_in_real_time(upstream: Upstream,
                                                                           tmp_path: Path) -> None:
    """A round of re-runs whose batch expires before a provider job may end (an hour left, no earlier job's time
    known: a provider's window is 24 hours) runs in real time on the route's deployment, at the real-time price,
    and makes no job."""
    tag = uuid.uuid4().hex[:8]
    store = SQLiteStore(tmp_path / "store.sqlite3")
    try:
        created = now()
        await store.batches.put(BatchRecord(id="batch_rt", owner="alpha", endpoint="/v1/chat/completions",
                                            input_file_id="file-x", completion_window="1h",
                                            status=BatchStatus.IN_PROGRESS, created_at=created,
                                            expires_at=created + 3600))
        shard = Shard(batch_id="batch_rt", index=0, route=MODEL, size=1)
        await store.ledger.put_shards("batch_rt", [shard])
        backend = NativeBatchBackend(native_route(_native_params(upstream), MODEL, **BATCH_PRICE, **REALTIME_PRICE),
                                     {}, store)
        line = chat_line("c-0", MODEL, f"{tag} fine #count", response_format=FORMAT)
        request = BatchRequest(line=1, custom_id="c-0", url=Endpoint.CHAT, body=line["body"])
        jobs = upstream.stats()["batches_created"]
        try:
            [result] = [r async for r in backend.execute_shard(shard, [request], rerun=1)]
        finally:
            await backend.aclose()
    finally:
        await store.aclose()
    assert upstream.stats()["batches_created"] == jobs
    assert upstream.stats()["by_custom"][f"{tag} fine #count"] == 1  # one real-time call
    assert result.ok and result.body is not None
    assert orjson.loads(result.body["choices"][0]["message"]["content"])["age"] == 7
    usage = result.usage
    assert result.cost_usd == pytest.approx(usage.input_tokens * REALTIME_PRICE["input_cost_per_token"]
                                            + usage.output_tokens * REALTIME_PRICE["output_cost_per_token"])


async def test_a_follow_up_job_is_found_again_after_a_restart(upstream: Upstream, tmp_path: Path) -> None:
    """A round's follow-up job is recorded beside the first pass's, as a part of its round: a shard run again (a
    restart) reads each round's job back and makes none, and the route's summary holds both jobs."""
    tag = uuid.uuid4().hex[:8]
    store = SQLiteStore(tmp_path / "store.sqlite3")
    backend = NativeBatchBackend(native_route(_native_params(upstream), MODEL, **BATCH_PRICE), {}, store)
    try:
        await store.batches.put(BatchRecord(id="batch_nx", owner="alpha", endpoint="/v1/chat/completions",
                                            input_file_id="file-x", completion_window="none",
                                            status=BatchStatus.IN_PROGRESS, created_at=now(), expires_at=None))
        shard = Shard(batch_id="batch_nx", index=0, route=MODEL, size=1)
        await store.ledger.put_shards("batch_nx", [shard])
        line = chat_line("c-0", MODEL, f"{tag} #schema:wrongtypex1", response_format=FORMAT)
        request = BatchRequest(line=1, custom_id="c-0", url=Endpoint.CHAT, body=line["body"])
        jobs = upstream.stats()["batches_created"]

        async def answers(rerun: int) -> Any:
            [result] = [r async for r in backend.execute_shard(shard, [request], rerun)]
            assert result.ok and result.body is not None
            return orjson.loads(result.body["choices"][0]["message"]["content"])["name"]

        assert await answers(0) == []  # the first attempt, wrong
        assert await answers(1) == "text"  # round 1's follow-up job, valid
        assert upstream.stats()["batches_created"] - jobs == 2
        assert (await answers(0), await answers(1)) == ([], "text")  # run again: each round's job read back
        assert upstream.stats()["batches_created"] - jobs == 2
        summary = await native_route_summary(store, "batch_nx", MODEL)
    finally:
        await backend.aclose()
        await store.aclose()
    assert len(summary["upstream_batch_ids"]) == 2 and summary["cost_usd"] > 0


async def test_a_data_dir_from_before_the_check_gains_the_live_counts(tmp_path: Path) -> None:
    """A SQLite store whose `route_stats` table predates `reruns` and `output_invalid` gets both columns at open,
    its rows kept, and counts them from then on."""
    path = tmp_path / "store.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE route_stats (batch_id TEXT NOT NULL, route TEXT NOT NULL, completed INTEGER NOT "
                   "NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0, "
                   "output_tokens INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0, "
                   "PRIMARY KEY (batch_id, route))")
        db.execute("INSERT INTO route_stats (batch_id, route, completed) VALUES ('batch_old', 'm', 4)")
    db.close()
    store = SQLiteStore(path)
    try:
        created = now()
        await store.batches.put(BatchRecord(id="batch_old", owner="alpha", endpoint="/v1/chat/completions",
                                            input_file_id="file-x", completion_window="24h",
                                            status=BatchStatus.IN_PROGRESS, created_at=created,
                                            expires_at=created + 86_400))
        shard = Shard(batch_id="batch_old", index=0, route="m", size=1)
        await store.ledger.put_shards("batch_old", [shard])
        invalid = Result(line=1, custom_id="c-1", status_code=200, body={}, reruns=2,
                         error={"code": "output_invalid", "message": "/: no"})
        await store.ledger.record_results(shard, [invalid])
        stats = (await store.ledger.route_stats("batch_old"))["m"]
    finally:
        await store.aclose()
    assert (stats.completed, stats.failed, stats.reruns, stats.output_invalid) == (4, 1, 2, 1)


def test_the_dashboard_shows_a_running_batchs_live_counts_and_a_finished_ones_summary() -> None:
    """The dashboard's route row takes `reruns` and `output_invalid` from the live counts while the batch runs,
    and from the batch's finalized `routes` once it is done."""
    created = now()
    running = BatchRecord(id="batch_dv", owner="alpha", endpoint="/v1/chat/completions", input_file_id="file-x",
                          completion_window="24h", status=BatchStatus.IN_PROGRESS, created_at=created,
                          expires_at=created + 86_400)
    live = {MODEL: RouteStats(completed=3, failed=1, reruns=4, output_invalid=1)}
    [row] = batch_view(running, live).routes
    assert (row.reruns, row.output_invalid) == (4, 1)
    done = replace(running, status=BatchStatus.COMPLETED,
                   routes={MODEL: {"completed": 3, "failed": 1, "reruns": 5, "output_invalid": 2}})
    [row] = batch_view(done, live).routes
    assert (row.reruns, row.output_invalid) == (5, 2)
