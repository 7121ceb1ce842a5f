"""Our extensions `GET /v1/batches/{id}/results` and `POST /v1/batches/{id}/retry`, in both modes (real
processes: the gateway, its worker, redis-server in the shared mode, the loopback upstream; the openai SDK's
raw verbs as the client, as the docs show them).

- Results are read while the batch runs, a page at a time; the cursor (`x-next-cursor`) fetches only what
  is new; after a cancel the same cursor brings the rest (the lines that ran meanwhile and the cancelled
  ones, marked `"kind": "error"`), each line exactly once in all. Read from scratch, a finished batch's
  results are its output and error files' lines in input order.
- A retry makes a new batch of exactly the lines without a 2xx (failed on an upstream that fails them the
  first time; cancelled before they ran), with their custom_ids, in input order, `metadata.retry_of`;
  it completes them. A running batch is 409 `batch_not_finished`, one with nothing left 409
  `nothing_to_retry`; another team's batch is 404 on both. Once its output file is deleted, its results are
  409 `results_deleted` and its retry 409 `retry_unavailable`.
- The dashboard links a batch's results (its own team's only).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types import Batch

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, read_jsonl, submit, wait_batch
from tests.support.team_helpers import MODEL, MODES, serve
from tests.support.waiting import eventually

TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]


@pytest.fixture(scope="module", params=MODES)
def gateway(request: pytest.FixtureRequest, upstream: Upstream,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # Small shards, one at a time: a batch of slow lines runs for seconds, a few results at a time.
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, master_key="sk-admin", shard_size=4,
                            max_shards_in_flight=1)
    with serve(request.param, config, tmp_path_factory.mktemp(request.param) / "data") as server:
        yield server


def line(tag: str, i: int, text: str) -> dict[str, Any]:
    return {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"{text} {tag} {i}"}]}}


def results(client: OpenAI, batch_id: str, after: str | None = None,
            limit: int | None = None) -> tuple[list[dict[str, Any]], str, bool, str]:
    """One page: its lines, the next cursor, has_more, and the batch's status when it was read."""
    params = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
    reply = client.get(f"/batches/{batch_id}/results", cast_to=httpx.Response, options={"params": params})
    assert reply.headers["content-type"].startswith("application/jsonl")
    page = [json.loads(raw) for raw in reply.text.splitlines() if raw]
    return page, reply.headers["x-next-cursor"], reply.headers["x-has-more"] == "true", reply.headers["x-batch-status"]


def drain(client: OpenAI, batch_id: str, after: str | None, limit: int = 3) -> tuple[list[dict[str, Any]], str, str]:
    """Every page from `after` on: the lines, the last cursor, the status at the last read."""
    got: list[dict[str, Any]] = []
    while True:
        page, after, more, status = results(client, batch_id, after, limit)
        assert len(page) <= limit
        got += page
        if not more:
            return got, after, status


def retry(client: OpenAI, batch_id: str) -> Batch:
    return client.post(f"/batches/{batch_id}/retry", cast_to=Batch)


def ids(lines: list[dict[str, Any]]) -> list[str]:
    return [x["custom_id"] for x in lines]


def order(custom_id: str) -> int:
    return int(custom_id.rsplit("-", 1)[1])


def check_kinds(lines: list[dict[str, Any]]) -> None:
    for x in lines:
        ok = x["response"] is not None and 200 <= x["response"]["status_code"] < 300
        assert x["kind"] == ("output" if ok else "error"), x


def test_results_while_running_then_after_cancel_and_retry(gateway: Gateway, request: pytest.FixtureRequest) -> None:
    tag = f"run-{request.node.callspec.id}"
    client, other = gateway.client("sk-alpha"), gateway.client("sk-beta")
    n = 40  # 10 shards of 0.7 s lines: it runs for seconds after the first results
    batch = submit(client, [line(tag, i, "#sleep:700") for i in range(n)])

    with pytest.raises(openai.ConflictError) as running:
        retry(client, batch.id)
    assert running.value.code == "batch_not_finished"
    with pytest.raises(openai.NotFoundError):
        other.get(f"/batches/{batch.id}/results", cast_to=httpx.Response)
    with pytest.raises(openai.NotFoundError):
        retry(other, batch.id)

    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    statuses: list[str] = []

    def read_more(at_least: int) -> bool | None:
        nonlocal cursor
        page, cursor, status = drain(client, batch.id, cursor)
        seen.extend(page)
        statuses.append(status)
        return len(seen) >= at_least or None

    eventually(lambda: read_more(4), 60, "the first results while the batch runs")
    first = len(seen)
    eventually(lambda: read_more(first + 1), 60, "more results, through the cursor")
    assert statuses[-1] == "in_progress", statuses  # read while it ran
    assert len(set(ids(seen))) == len(seen)  # the cursor fetched only what was new
    assert all(x["kind"] == "output" and x["response"]["status_code"] == 200 for x in seen)

    client.batches.cancel(batch.id)
    cancelled = wait_batch(client, batch.id)
    assert cancelled.status == "cancelled"
    rest, cursor, status = drain(client, batch.id, cursor)
    assert status == "cancelled"
    every = seen + rest
    assert sorted(ids(every), key=order) == [f"{tag}-{i}" for i in range(n)]  # each line once, in all
    check_kinds(every)
    unrun = [x for x in every if x["kind"] == "error"]
    assert unrun and all(x["error"]["code"] == "batch_cancelled" for x in unrun)
    assert results(client, batch.id, cursor)[:2] == ([], cursor)  # nothing new since

    # From scratch: the files' lines in input order, each marked.
    scratch, _, _ = drain(client, batch.id, None, limit=5)
    assert ids(scratch) == sorted(ids(scratch), key=order)
    files = {x["custom_id"]: x for x in read_jsonl(client, cancelled.output_file_id)
             + read_jsonl(client, cancelled.error_file_id)}
    assert {x["custom_id"]: {k: v for k, v in x.items() if k != "kind"} for x in scratch} == files

    again = retry(client, batch.id)
    assert again.metadata == {"retry_of": batch.id}
    assert (again.endpoint, again.completion_window) == (batch.endpoint, batch.completion_window)
    retried = [json.loads(raw) for raw in client.files.content(again.input_file_id).text.splitlines()]
    assert ids(retried) == sorted(ids(unrun), key=order)
    assert retried == [line(tag, order(cid), "#sleep:700") for cid in ids(retried)]  # the lines as they were
    finished = wait_batch(client, again.id, timeout=120)
    assert finished.status == "completed"
    assert finished.request_counts is not None
    assert (finished.request_counts.completed, finished.request_counts.failed) == (len(unrun), 0)


def test_retry_completes_lines_that_failed_the_first_time(gateway: Gateway, request: pytest.FixtureRequest) -> None:
    tag = f"flaky-{request.node.callspec.id}"
    client = gateway.client("sk-alpha")
    flaky = {1, 4, 6}  # the upstream answers these 400 once, then 200 (a 400 is not retried within the batch)
    batch = submit(client, [line(tag, i, "#fail:400x1" if i in flaky else "hello") for i in range(8)],
                   metadata={"project": "x"})
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None and done.request_counts.failed == len(flaky)
    everything, _, _ = drain(client, batch.id, None, limit=100)
    check_kinds(everything)
    assert sorted(order(x["custom_id"]) for x in everything if x["kind"] == "error") == sorted(flaky)

    again = retry(client, batch.id)
    assert again.metadata == {"project": "x", "retry_of": batch.id}
    retried = [json.loads(raw) for raw in client.files.content(again.input_file_id).text.splitlines()]
    assert ids(retried) == [f"{tag}-{i}" for i in sorted(flaky)]
    finished = wait_batch(client, again.id)
    assert finished.status == "completed"
    assert finished.request_counts is not None
    assert (finished.request_counts.completed, finished.request_counts.failed) == (len(flaky), 0)
    assert sorted(ids(read_jsonl(client, finished.output_file_id))) == sorted(ids(retried))
    page, _, more, _ = results(client, again.id)
    assert not more and ids(page) == ids(retried) and {x["kind"] for x in page} == {"output"}

    # The dashboard links each batch's results, for its own team only.
    with httpx.Client(base_url=gateway.url, headers={"Origin": gateway.url}, timeout=30) as browser:
        assert browser.post("/ui/login", data={"api_key": "sk-alpha"}).status_code == 303
        link = f"/ui/batches/{again.id}/results"
        assert f'href="{link}"' in browser.get("/ui").text
        shown = browser.get(link)
        assert shown.status_code == 200 and [json.loads(x) for x in shown.text.splitlines()] == page
    with httpx.Client(base_url=gateway.url, headers={"Origin": gateway.url}, timeout=30) as stranger:
        stranger.post("/ui/login", data={"api_key": "sk-beta"})
        assert stranger.get(f"/ui/batches/{again.id}/results").status_code == 404

    with pytest.raises(openai.ConflictError) as nothing:
        retry(client, again.id)
    assert nothing.value.code == "nothing_to_retry"
    with pytest.raises(openai.BadRequestError) as bad:
        results(client, batch.id, "not-a-cursor")
    assert bad.value.code == "invalid_cursor"

    # The results' order lives as long as the output files: deleting one deletes it (the segments it was merged
    # in too), and both extensions say so.
    assert list(gateway.data_dir.parent.rglob(f"{batch.id}.order*"))
    assert done.output_file_id is not None and client.files.delete(done.output_file_id).deleted
    assert not list(gateway.data_dir.parent.rglob(f"{batch.id}.order*"))
    with pytest.raises(openai.ConflictError) as gone:
        results(client, batch.id)
    assert gone.value.code == "results_deleted"
    with pytest.raises(openai.ConflictError) as unknown:
        retry(client, batch.id)
    assert unknown.value.code == "retry_unavailable" and "deleted" in unknown.value.message
