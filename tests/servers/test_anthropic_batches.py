"""Anthropic's Message Batches API, spoken by the `anthropic` SDK unmodified, on an upstream route (the
loopback upstream behind LiteLLM's Anthropic-messages adapter): one gateway for both families of clients.

The batch runs through the same pipeline as an OpenAI batch; the two families stay apart: neither list
shows the other's batches, an id of one family is a 404 in the other, and every error on these routes is
in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic import Anthropic
from anthropic.types.messages import MessageBatch

from gateway.config.sections import BatchSettings
from gateway.message_batches.wire import MAX_BODY_BYTES, MAX_PARAMS_DEPTH
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, chat_line, gateway_config, jsonl, start_gateway, wait_batch
from tests.support.team_helpers import metric
from tests.support.waiting import eventually

ALPHA, BETA, ADMIN = "sk-alpha-0123456789", "sk-beta-0123456789", "sk-admin"
MODEL = "gpt-mini"


def request(custom_id: str, text: str, model: str | None = MODEL, **params: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": 32, "messages": [{"role": "user", "content": text}], **params}
    if model is not None:
        body["model"] = model
    return {"custom_id": custom_id, "params": body}


def ended(client: Anthropic, batch_id: str, timeout: float = 60) -> MessageBatch:
    seen: list[MessageBatch] = []

    def check() -> MessageBatch | None:
        seen[:] = [client.messages.batches.retrieve(batch_id)]
        return seen[0] if seen[0].processing_status == "ended" else None

    return eventually(check, timeout, f"message batch {batch_id} to end", detail=lambda: str(seen[-1:]))


def results(client: Anthropic, batch_id: str) -> dict[str, Any]:
    return {r.custom_id: r.result for r in client.messages.batches.results(batch_id)}


def assert_anthropic_error(reply: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == type_ and body["error"]["message"], body
    assert set(body) == {"type", "error"}
    return body


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    teams = [{"team_id": "alpha", "api_keys": [ALPHA]}, {"team_id": "beta", "api_keys": [BETA]}]
    config = gateway_config(upstream, master_key=ADMIN, teams=teams, models=[MODEL])
    with start_gateway(config, tmp_path_factory.mktemp("anthropic") / "data") as server:
        yield server


@pytest.fixture(scope="module")
def alpha(gateway: Gateway) -> Anthropic:
    return Anthropic(base_url=gateway.url, api_key=ALPHA, max_retries=0)


def test_create_retrieve_and_results(alpha: Anthropic, gateway: Gateway) -> None:
    """A batch is created `in_progress` with a `msgbatch_` id, every request `processing`, expiring 24 hours
    after it was created; once it has ended, `results()` streams one result per request: a reply is
    `succeeded` with its Anthropic `message`, a request the gateway cannot honour is `errored`
    (invalid_request_error) without failing the batch."""
    reqs = [request(f"ok-{i}", f"hello {i}") for i in range(5)]
    reqs += [request("no-model", "hi", model=None), request("unknown", "hi", model="no-such-model"),
             request("streamed", "hi", stream=True),
             # params nested as deep as a request's may: taken, and only that request's error (no max_tokens)
             {"custom_id": "deep", "params": {"model": MODEL, "messages": _nested(MAX_PARAMS_DEPTH - 1)}}]
    created = alpha.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    assert created.id.startswith("msgbatch_") and created.type == "message_batch"
    assert created.processing_status == "in_progress" and created.results_url is None and created.ended_at is None
    assert created.request_counts.processing == len(reqs)
    assert (created.expires_at - created.created_at).total_seconds() == 24 * 3600
    batch = ended(alpha, created.id)
    assert batch.ended_at is not None and batch.results_url == f"{gateway.url}/v1/messages/batches/{batch.id}/results"
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (0, 5, 4, 0, 0)
    got = results(alpha, batch.id)
    assert list(got) == [r["custom_id"] for r in reqs]  # one each, in input order
    for i in range(5):
        result = got[f"ok-{i}"]
        assert result.type == "succeeded" and result.message.type == "message"
        assert result.message.content[0].type == "text" and f"hello {i}" in result.message.content[0].text
    for custom_id in ("no-model", "unknown", "streamed", "deep"):
        result = got[custom_id]
        assert result.type == "errored" and result.error.error.type == "invalid_request_error", result
    raw = gateway.http("GET", f"/v1/messages/batches/{batch.id}/results", headers={"x-api-key": ALPHA})
    assert raw.status_code == 200 and len(raw.text.splitlines()) == len(reqs)
    assert json.loads(raw.text.splitlines()[0])["result"]["type"] == "succeeded"


def test_x_api_key_and_bearer_are_the_same_key(gateway: Gateway) -> None:
    """`x-api-key` (the SDK's) and `Authorization: Bearer` name the same team; `anthropic-version` and
    `anthropic-beta` are accepted."""
    headers = {"x-api-key": ALPHA, "anthropic-version": "2023-06-01", "anthropic-beta": "message-batches-2024-09-24"}
    by_header = gateway.http("GET", "/v1/messages/batches", headers=headers)
    by_bearer = gateway.http("GET", "/v1/messages/batches", ALPHA)
    assert by_header.status_code == by_bearer.status_code == 200
    assert [b["id"] for b in by_header.json()["data"]] == [b["id"] for b in by_bearer.json()["data"]]


def test_list_pages_newest_first(gateway: Gateway) -> None:
    """`limit`, `after_id` (older) and `before_id` (newer) page a team's Message Batches newest first;
    `first_id`, `last_id` and `has_more` say where a page is; the SDK's auto-paging walks them all."""
    client = Anthropic(base_url=gateway.url, api_key=BETA, max_retries=0)
    made = [client.messages.batches.create(requests=[request("a", f"page {i}")]).id  # type: ignore[list-item]
            for i in range(5)]
    newest_first = made[::-1]
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first  # the SDK follows after_id
    first = client.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == newest_first[:2] and first.has_more is True
    assert first.first_id == newest_first[0] and first.last_id == newest_first[1]
    older = client.messages.batches.list(limit=2, after_id=newest_first[1])
    assert [b.id for b in older.data] == newest_first[2:4] and older.has_more is True
    last = client.messages.batches.list(limit=2, after_id=newest_first[3])
    assert [b.id for b in last.data] == newest_first[4:] and last.has_more is False
    newer = client.messages.batches.list(limit=2, before_id=newest_first[4])
    assert [b.id for b in newer.data] == newest_first[2:4] and newer.has_more is True
    top = client.messages.batches.list(limit=5, before_id=newest_first[2])
    assert [b.id for b in top.data] == newest_first[:2] and top.has_more is False
    empty = gateway.http("GET", "/v1/messages/batches?limit=3", ADMIN).json()
    assert empty == {"data": [], "has_more": False, "first_id": None, "last_id": None}  # the admin has none
    for bad in ("0", "1001", "many"):
        assert_anthropic_error(gateway.http("GET", f"/v1/messages/batches?limit={bad}", BETA), 400,
                               "invalid_request_error")
    for batch_id in made:
        ended(client, batch_id)


def test_families_apart(alpha: Anthropic, gateway: Gateway) -> None:
    """The OpenAI list does not show Message Batches, nor the Anthropic list OpenAI batches; an id of one
    family is a 404 in the other; the OpenAI create refuses `/v1/messages` (an endpoint OpenAI does not
    have); a Message Batch's input and results files are not in the team's files list."""
    openai = gateway.client(ALPHA)
    file = openai.files.create(file=("in.jsonl", jsonl([chat_line("o", MODEL, "openai side")])), purpose="batch")
    theirs = openai.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    ours = alpha.messages.batches.create(requests=[request("m", "anthropic side")])  # type: ignore[list-item]
    assert [b.id for b in openai.batches.list()] == [theirs.id]
    assert theirs.id not in [b.id for b in alpha.messages.batches.list()]
    assert ours.id in [b.id for b in alpha.messages.batches.list()]
    for path in (f"/v1/batches/{ours.id}", f"/v1/batches/{ours.id}/results"):
        reply = gateway.http("GET", path, ALPHA)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    assert gateway.http("POST", f"/v1/batches/{ours.id}/cancel", ALPHA).status_code == 404
    for method, path in (("GET", ""), ("GET", "/results"), ("POST", "/cancel"), ("DELETE", "")):
        assert_anthropic_error(gateway.http(method, f"/v1/messages/batches/{theirs.id}{path}", ALPHA), 404,
                               "not_found_error")
    refused = gateway.http("POST", "/v1/batches", ALPHA, json={
        "input_file_id": file.id, "endpoint": "/v1/messages", "completion_window": "24h"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "endpoint"
    assert [f.id for f in openai.files.list(purpose="batch")] == [file.id]
    done = ended(alpha, ours.id)
    # the results file of each: the OpenAI batch's in the team's files, the Message Batch's only at its URL
    listed = [f.id for f in openai.files.list()]
    assert wait_batch(openai, theirs.id).output_file_id in listed and len(listed) == 2, listed
    path = f"/v1/messages/batches/{ours.id}/results"
    assert done.results_url == gateway.url + path and gateway.http("GET", path, ALPHA).status_code == 200


def test_dashboard_and_metrics_count_a_message_batch(alpha: Anthropic, gateway: Gateway) -> None:
    """A Message Batch shows in the team's dashboard and its requests in `/metrics`, like any batch."""
    before = metric(gateway, "batchyard_requests_total", team="alpha", route=MODEL, status="200") or 0
    batch = ended(alpha, alpha.messages.batches.create(requests=[request(f"d{i}", "dash") for i in range(3)]).id)
    assert batch.request_counts.succeeded == 3
    after = metric(gateway, "batchyard_requests_total", team="alpha", route=MODEL, status="200")
    assert after == before + 3
    browser = httpx.Client(base_url=gateway.url, headers={"Origin": gateway.url}, timeout=10)
    assert browser.post("/ui/login", data={"api_key": ALPHA}).status_code == 303  # a session cookie, kept
    board = browser.get("/ui/api/batches")
    assert board.status_code == 200 and batch.id in board.json()["ids"]
    assert f"/ui/batches/{batch.id}/results" in board.json()["cards"][batch.id]
    shown = browser.get(f"/ui/batches/{batch.id}/results")
    browser.close()
    assert shown.status_code == 200 and len(shown.text.splitlines()) == 3


def test_delete_only_an_ended_batch(alpha: Anthropic, gateway: Gateway) -> None:
    """Deleting a running batch is refused (invalid_request_error); an ended one goes, with its results."""
    slow = alpha.messages.batches.create(requests=[request("s", "#sleep:20000 slow")])  # type: ignore[list-item]
    assert_anthropic_error(gateway.http("DELETE", f"/v1/messages/batches/{slow.id}", ALPHA), 400,
                           "invalid_request_error")
    assert_anthropic_error(gateway.http("GET", f"/v1/messages/batches/{slow.id}/results", ALPHA), 400,
                           "invalid_request_error")
    alpha.messages.batches.cancel(slow.id)
    ended(alpha, slow.id)
    deleted = alpha.messages.batches.delete(slow.id)
    assert deleted.id == slow.id and deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        alpha.messages.batches.retrieve(slow.id)
    assert slow.id not in [b.id for b in alpha.messages.batches.list()]


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# (case, body, the start of the refusal's message: the field it names, as the reader in the validation process
# words it, unchanged across the process boundary)
BAD_BODIES: list[tuple[str, Any, str]] = [
    ("no requests", {}, "requests: Field required"),
    ("an empty list", {"requests": []}, "requests: List should have at least 1 item"),
    ("a bad custom_id", {"requests": [request("has space", "x")]}, "requests.0.custom_id: String should match pattern"),
    ("a repeated custom_id", {"requests": [request("a", "x"), request("a", "y")]},
     "requests.1.custom_id: Duplicate custom_id 'a'"),
    ("params not an object", {"requests": [{"custom_id": "a", "params": "hi"}]},
     "requests.0.params: Input should be a valid dictionary"),
    ("not JSON", "{", "The request body is not valid JSON"),
    ("a list", [], "body: Input should be a valid dictionary"),
    ("params nested past the bound", {"requests": [{"custom_id": "a", "params": {"x": _nested(MAX_PARAMS_DEPTH)}}]},
     f"requests.0.params: nested more than {MAX_PARAMS_DEPTH} levels deep"),
]


@pytest.mark.parametrize(("case", "body", "words"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_a_bad_envelope_is_a_400_in_anthropics_shape(gateway: Gateway, case: str, body: Any, words: str) -> None:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    reply = gateway.http("POST", "/v1/messages/batches", headers={"x-api-key": ALPHA,
                                                                  "content-type": "application/json"}, content=content)
    assert assert_anthropic_error(reply, 400, "invalid_request_error")["error"]["message"].startswith(words), reply.text


def test_a_body_past_the_doors_limit_is_a_413_as_anthropics(gateway: Gateway) -> None:
    """The limit is Anthropic's 256 MB or the operator's `max_file_bytes`, whichever is lower (200 MiB by
    default): refused once the bytes read pass it (streamed here, without a length), never a 5xx."""
    limit = min(MAX_BODY_BYTES, BatchSettings().max_file_bytes)
    chunk = b" " * (1 << 20)

    def body() -> Iterator[bytes]:
        yield b'{"requests": ['
        for _ in range(limit // len(chunk) + 1):
            yield chunk

    reply = gateway.http("POST", "/v1/messages/batches", content=body(),
                         headers={"x-api-key": ALPHA, "content-type": "application/json"})
    assert_anthropic_error(reply, 413, "request_too_large")
    assert str(limit) in reply.json()["error"]["message"]


def test_errors_are_anthropics(alpha: Anthropic, gateway: Gateway) -> None:
    """Unknown ids, another team's ids and bad keys answer as Anthropic does, and the SDK raises its own
    error classes."""
    mine = alpha.messages.batches.create(requests=[request("x", "mine")])  # type: ignore[list-item]
    beta = Anthropic(base_url=gateway.url, api_key=BETA, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        beta.messages.batches.retrieve(mine.id)
    with pytest.raises(anthropic.NotFoundError):
        beta.messages.batches.cancel(mine.id)
    with pytest.raises(anthropic.NotFoundError):
        alpha.messages.batches.retrieve("msgbatch_0000")
    with pytest.raises(anthropic.AuthenticationError):
        Anthropic(base_url=gateway.url, api_key="sk-wrong", max_retries=0).messages.batches.list()
    assert_anthropic_error(gateway.http("GET", "/v1/messages/batches"), 401, "authentication_error")
    assert_anthropic_error(gateway.http("GET", "/v1/messages/batches/x/nowhere", ALPHA), 404, "not_found_error")
    ended(alpha, mine.id)


def test_cancel_keeps_finished_results(alpha: Anthropic) -> None:
    """Cancelling a running batch: `canceling`, then `ended`; requests answered before keep their results,
    the rest are `canceled`, and the counts say so."""
    reqs = [request("fast0", "quick"), request("fast1", "quick too")]
    reqs += [request(f"slow{i}", f"#sleep:20000 slow {i}") for i in range(3)]
    created = alpha.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    eventually(lambda: alpha.messages.batches.retrieve(created.id).request_counts.succeeded >= 2, 30,
               "two requests done", interval=0.1)
    cancelling = alpha.messages.batches.cancel(created.id)
    assert cancelling.processing_status in ("canceling", "ended") and cancelling.cancel_initiated_at is not None
    batch = ended(alpha, created.id)
    counts = batch.request_counts
    assert (counts.succeeded, counts.canceled, counts.errored, counts.processing) == (2, 3, 0, 0)
    got = results(alpha, batch.id)
    assert [got[f"fast{i}"].type for i in range(2)] == ["succeeded", "succeeded"]
    assert [got[f"slow{i}"].type for i in range(3)] == ["canceled"] * 3
    again = alpha.messages.batches.cancel(batch.id)  # an ended batch stays as it ended
    assert again.processing_status == "ended" and again.request_counts == counts


def test_cancel_at_once_cancels_every_request(alpha: Anthropic) -> None:
    """A batch cancelled as soon as it is created (before any shard exists, or before any request was
    answered) ends with every request `canceled`, and its results say so."""
    reqs = [request(f"c{i}", f"#sleep:20000 never {i}") for i in range(4)]
    created = alpha.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
    alpha.messages.batches.cancel(created.id)
    batch = ended(alpha, created.id)
    assert batch.request_counts.canceled == 4 and batch.request_counts.processing == 0, batch
    got = results(alpha, batch.id)
    assert list(got) == [r["custom_id"] for r in reqs] and {r.type for r in got.values()} == {"canceled"}
