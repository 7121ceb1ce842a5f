"""Anthropic's Message Batches as words: each merged output line as a Message Batch result (the one
mapping), the batch's `request_counts`, the create envelope, and the batch object the anthropic SDK reads."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from gateway.domain import BatchStatus
from gateway.message_batches.envelope import MAX_REQUEST_BYTES, MAX_REQUEST_VALUES, read_create
from gateway.message_batches.outcomes import message_result, request_counts
from gateway.message_batches.wire import MAX_PARAMS_DEPTH, MAX_REQUESTS, EnvelopeError, batch_object
from gateway.store.records import BatchRecord, RequestCounts

MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [
    {"type": "text", "text": "hi"}], "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1}}


def _reply(status: int, body: Any) -> dict[str, Any]:
    return {"id": "r", "custom_id": "c", "response": {"status_code": status, "request_id": "q", "body": body},
            "error": None}


def _stopped(code: str, message: str = "m") -> dict[str, Any]:
    return {"id": "r", "custom_id": "c", "response": None, "error": {"code": code, "message": message}}


def _openai_error(status: int, code: str | None) -> dict[str, Any]:
    return _reply(status, {"error": {"message": "why", "type": "x", "param": None, "code": code}})


ANTHROPIC_ERROR = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("a 2xx reply succeeded with its message", _reply(200, MESSAGE), {"type": "succeeded", "message": MESSAGE}),
    ("an expired request", _stopped("batch_expired"), {"type": "expired"}),
    ("a cancelled request", _stopped("batch_cancelled"), {"type": "canceled"}),
    ("a route's own Anthropic error, as it gave it", _reply(529, ANTHROPIC_ERROR),
     {"type": "errored", "error": ANTHROPIC_ERROR}),
    ("an unknown model, answered by the checks", _openai_error(404, "model_not_found"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "why"}}}),
    ("a missing field, answered by the checks", _openai_error(400, "missing_required_parameter"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "why"}}}),
    ("an upstream 404", _openai_error(404, None),
     {"type": "errored", "error": {"type": "error", "error": {"type": "not_found_error", "message": "why"}}}),
    ("an upstream 429", _openai_error(429, "rate_limit_exceeded"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "rate_limit_error", "message": "why"}}}),
    ("an upstream 503", _openai_error(503, None),
     {"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error", "message": "why"}}}),
    ("an upstream 502", _openai_error(502, None),
     {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "why"}}}),
    ("a parameter the route cannot honour", _stopped("unknown_parameter", "no such field"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error",
                                                              "message": "no such field"}}}),
    ("an unknown model without a reply", _stopped("model_not_found", "no model"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "invalid_request_error",
                                                              "message": "no model"}}}),
    ("a spent budget", _stopped("budget_exceeded", "spent"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "billing_error", "message": "spent"}}}),
    ("a request the route could not reach", _stopped("model_unavailable", "down"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error", "message": "down"}}}),
    ("a lost request", _stopped("internal_error", "lost"),
     {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "lost"}}}),
    ("a reply that did not match its schema", {**_reply(200, MESSAGE), "error": {"code": "output_invalid",
                                                                                 "message": "/a: wrong"}},
     {"type": "errored", "error": {"type": "error", "error": {"type": "api_error", "message": "/a: wrong"}}}),
]


@pytest.mark.parametrize(("rule", "line", "result"), CASES, ids=[c[0] for c in CASES])
def test_each_output_line_is_one_anthropic_result(rule: str, line: dict[str, Any], result: dict[str, Any]) -> None:
    """The rule in the case's name; every result parses as the SDK's `MessageBatchIndividualResponse`."""
    mapped = message_result(line)
    assert mapped == {"custom_id": "c", "result": result}
    assert MessageBatchIndividualResponse.model_validate(mapped).result.type == result["type"]


def _record(status: BatchStatus, **fields: Any) -> BatchRecord:
    return BatchRecord(id="msgbatch_1", owner="t", endpoint="/v1/messages", input_file_id="file-1",
                       completion_window="24h", status=status, created_at=1_700_000_000,
                       expires_at=1_700_086_400, **fields)


def test_running_counts_are_the_ledgers_live_counters() -> None:
    """While a batch runs, a request not yet answered is `processing`; answered ones count as they land."""
    rec = _record(BatchStatus.IN_PROGRESS, counts=RequestCounts(total=10, completed=3, failed=2))
    assert request_counts(rec) == {"processing": 5, "succeeded": 3, "errored": 2, "canceled": 0, "expired": 0}


def test_ended_counts_come_from_the_kept_summary() -> None:
    """Once ended, the counts come from the summary the finalizer kept (failures by error code): no GET
    reads the results again."""
    summary = {"by_model": {"a": {"200": 4, "400": 1, "batch_cancelled": 2}, "b": {"batch_cancelled": 1, "500": 1}},
               "succeeded": 4, "failed": 5}
    rec = _record(BatchStatus.CANCELLED, counts=RequestCounts(total=9, completed=4, failed=5), summary=summary)
    assert request_counts(rec) == {"processing": 0, "succeeded": 4, "errored": 2, "canceled": 3, "expired": 0}


def test_a_batch_cancelled_before_it_ran_counts_every_request_canceled() -> None:
    rec = _record(BatchStatus.CANCELLED, counts=RequestCounts(total=7))
    assert request_counts(rec) == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 7, "expired": 0}


def test_the_batch_object_is_the_sdks_message_batch() -> None:
    """RFC 3339 times, `processing_status` in Anthropic's words, `results_url` only once ended."""
    running = batch_object(_record(BatchStatus.CANCELLING, cancelling_at=1_700_000_100), request_counts(
        _record(BatchStatus.CANCELLING)), "http://h/v1/messages/batches/msgbatch_1/results")
    parsed = MessageBatch.model_validate(running)
    assert parsed.processing_status == "canceling" and parsed.results_url is None and parsed.ended_at is None
    assert running["created_at"] == "2023-11-14T22:13:20Z" and parsed.cancel_initiated_at is not None
    ended = MessageBatch.model_validate(batch_object(_record(BatchStatus.COMPLETED, completed_at=1_700_000_200),
                                                     request_counts(_record(BatchStatus.COMPLETED)), "u"))
    assert ended.processing_status == "ended" and ended.results_url == "u" and ended.ended_at is not None


def _request(custom_id: Any, params: Any = None) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": {"model": "m"} if params is None else params}


BAD_ENVELOPES = [
    ("no requests", {}, "requests: Field required"),
    ("an empty list", {"requests": []}, "requests: List should have at least 1 item"),
    ("too many", {"requests": [_request(f"c{i}") for i in range(MAX_REQUESTS + 1)]},
     f"requests: List should have at most {MAX_REQUESTS} items"),
    ("a custom_id with a space", {"requests": [_request("a b")]}, "requests.0.custom_id: String should match"),
    ("a custom_id of 65 characters", {"requests": [_request("a" * 65)]}, "requests.0.custom_id: String should match"),
    ("a custom_id that is a number", {"requests": [_request(7)]},
     "requests.0.custom_id: Input should be a valid string"),
    ("params that are a list", {"requests": [_request("a", [])]}, "requests.0.params: Input should be a valid dict"),
    ("a repeated custom_id", {"requests": [_request("a"), _request("b"), _request("a")]},
     "requests.2.custom_id: Duplicate custom_id 'a'"),
    ("an unknown key", {"requests": [_request("a")], "extra": 1}, "extra: Extra inputs are not permitted"),
]


def _read(body: bytes) -> list[dict[str, Any]]:
    """The input lines `read_create` writes for `body`."""
    sink = io.BytesIO()
    count = read_create(io.BytesIO(body), sink)
    lines = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert len(lines) == count
    return lines


BAD_TEXTS = [
    ("not JSON", b"{", "The request body is not valid JSON"),
    ("a list", b"[]", "body: Input should be a valid dictionary"),
    ("a trailing comma", b'{"requests": [{"custom_id": "a", "params": {}},]}', "The request body is not valid JSON"),
    ("NaN in params", b'{"requests": [{"custom_id": "a", "params": {"x": NaN}}]}', "The request body is not valid"),
    ("text after the body", b'{"requests": [{"custom_id": "a", "params": {}}]} x', "The request body is not valid"),
    ("a request that is no object", b'{"requests": [7]}', "requests.0: Input should be a valid dictionary"),
    ("params nested past the bound", b'{"requests": [{"custom_id": "a", "params": {"x": ' + b"[" * MAX_PARAMS_DEPTH
     + b"]" * MAX_PARAMS_DEPTH + b"}}]}", f"requests.0.params: nested more than {MAX_PARAMS_DEPTH} levels"),
    ("5,000,000 empty objects", b'{"requests": [{"custom_id": "a", "params": {"pad": [' + b",".join([b"{}"] * 5_000_000)
     + b"]}}]}", f"requests.0: more than {MAX_REQUEST_VALUES} values"),
    ("a million numbers", b'{"requests": [{"custom_id": "a", "params": {"pad": [' + b",".join([b"1.5"] * 1_000_000)
     + b"]}}]}", f"requests.0: more than {MAX_REQUEST_VALUES} values"),
    ("a request past the Messages API's 32 MB", b'{"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "b", '
     b'"params": {"text": "' + b"x" * (MAX_REQUEST_BYTES + 256 * 1024) + b'"}}]}',
     "requests.1: more than 33554432 bytes"),
]


@pytest.mark.parametrize(("case", "body", "message"), BAD_TEXTS, ids=[c[0] for c in BAD_TEXTS])
def test_a_body_is_bounded_request_by_request(case: str, body: bytes, message: str) -> None:
    """Strict JSON, and each request's values and depth bounded before it becomes Python objects: a 14 MB
    request of 5,000,000 `{}` is refused after its first 100,000 values, never read whole."""
    with pytest.raises(EnvelopeError) as refused:
        _read(body)
    assert str(refused.value).startswith(message)


def test_requests_are_split_whatever_their_strings_hold() -> None:
    """A request's end is where its brackets close, not where a string holds `},{"custom_id"`; requests
    larger than a chunk read at a time, escaped quotes and long integers come through as sent."""
    tricky = '"}, {"custom_id": "fake", "params": {}}, {\\"'
    params: list[Any] = [{"text": tricky}, {"big": "x" * 3_000_000, "n": 12345678901234567890123},
                         {"pad": [{}] * 5_000, "q": '\\"]}'}]
    body = json.dumps({"requests": [_request(f"r{i}", p) for i, p in enumerate(params)]}).encode()
    lines = _read(body)
    assert [line["custom_id"] for line in lines] == ["r0", "r1", "r2"]
    assert [line["body"] for line in lines] == params
    assert {line["url"] for line in lines} == {"/v1/messages"}


def test_escapes_are_read_in_linear_time_and_come_through_as_sent() -> None:
    """A long string of escapes (the shape that once cost regex stack per escape) is read by the tokenizer in
    one pass: 3 MB of surrogate-pair escapes reads back as the emoji it spells, in well under a second's
    work per MB, and numbers keep their kind (long integers exact, decimals floats)."""
    escapes = "\\ud83d\\ude00" * 250_000
    body = ('{"requests": [{"custom_id": "e", "params": {"t": "' + escapes + '", "n": [123456789012345678901234, 1.5, '
            '1E5, -0.0]}}]}').encode()
    started = time.perf_counter()
    lines = _read(body)
    assert time.perf_counter() - started < 10
    assert lines[0]["body"]["t"] == "\U0001F600" * 250_000
    assert lines[0]["body"]["n"] == [123456789012345678901234, 1.5, 100000.0, -0.0]


KEYS_AS_VALUES = {"pad": ["params", "custom_id"] * 40, "params": {"custom_id": "inner"}, "t": '}, {"params"'}
BODY_LAYOUTS = [
    ("compact", {"separators": (",", ":")}),
    ("pretty", {"indent": 2}),
    ("spaced", {"separators": (" ,\n ", " :  ")}),
]


@pytest.mark.parametrize("params_first", [False, True])
@pytest.mark.parametrize(("case", "layout"), BODY_LAYOUTS, ids=[c[0] for c in BODY_LAYOUTS])
def test_requests_are_split_whatever_their_layout(case: str, layout: dict[str, Any], params_first: bool) -> None:
    """Requests are read by a JSON tokenizer, not found by their text: whatever the spaces between requests,
    the keys' order, and values that are the keys' own names, every request comes through whole and in
    order."""
    requests = [{"params": KEYS_AS_VALUES | {"i": i}, "custom_id": f"r{i}"} if params_first
                else _request(f"r{i}", KEYS_AS_VALUES | {"i": i}) for i in range(40)]
    lines = _read(json.dumps({"requests": requests}, **layout).encode())
    assert [line["custom_id"] for line in lines] == [f"r{i}" for i in range(40)]
    assert [line["body"] for line in lines] == [KEYS_AS_VALUES | {"i": i} for i in range(40)]


@pytest.mark.parametrize(("case", "body", "message"), BAD_ENVELOPES, ids=[c[0] for c in BAD_ENVELOPES])
def test_the_envelope_is_refused_whole(case: str, body: Any, message: str) -> None:
    """Only the envelope is checked at create; the message names the field."""
    with pytest.raises(EnvelopeError) as refused:
        _read(json.dumps(body).encode())
    assert str(refused.value).startswith(message)


def test_params_are_not_checked_at_create() -> None:
    """A request's params are its own business until it runs (Anthropic checks them asynchronously)."""
    lines = _read(json.dumps({"requests": [_request("a", {"anything": True}), _request("b-_9" + "x" * 60)]}).encode())
    assert [line["custom_id"] for line in lines] == ["a", "b-_9" + "x" * 60]


LARGE_LAYOUTS = [
    ("custom_id first", '{"custom_id": "big", "params": %s}'),
    ("params first, pretty", '{\n  "params": %s,\n  "custom_id": "big"\n}'),
    ("a repeated params key", '{"custom_id": "big", "params": {"x": 1}, "params": %s}'),
    ("a repeated custom_id", '{"custom_id": "old", "params": %s, "custom_id": "big"}'),
    ("an escaped key", '{"custom_id": "big", "par\\u0061ms": %s}'),
]


@pytest.mark.parametrize(("case", "layout"), LARGE_LAYOUTS, ids=[c[0] for c in LARGE_LAYOUTS])
def test_a_large_request_keeps_its_params_whatever_its_layout(case: str, layout: str) -> None:
    """A request longer than the tokenizer's chunks, in any layout (pretty, params first, repeated or escaped
    keys), is written as JSON reads it: the last of a repeated key, an escaped key read as its name."""
    params = {"model": "m", "messages": [{"role": "user", "content": "x\ny" * 700_000}], "n": 2 ** 70}
    text = json.dumps(params, indent=1)
    body = ('{"requests": [' + layout % text + ', {"custom_id": "small", "params": {}}]}').encode()
    lines = _read(body)
    assert [line["custom_id"] for line in lines] == ["big", "small"]
    assert lines[0]["body"] == params and lines[0]["url"] == "/v1/messages"


def test_a_killed_api_processes_spools_are_removed_at_start_and_a_live_ones_kept(tmp_path: Path) -> None:
    import subprocess
    import sys

    from gateway.pipeline.message_batch_create import remove_stale_spools

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    live = os.getpid()
    for pid in (gone.pid, live):
        spool = tmp_path / f"batchyard-message-batch-{pid}-abc"
        spool.mkdir()
        (spool / "body.json").write_bytes(b"{}")
    (tmp_path / "batchyard-message-batch-notapid-x").mkdir()
    assert remove_stale_spools(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"batchyard-message-batch-{live}-abc",
                                                           "batchyard-message-batch-notapid-x"]
