"""Anthropic's Message Batches as words: each merged output line as a Message Batch result (the one
mapping), the batch's `request_counts`, the create envelope, and the batch object the anthropic SDK reads."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from gateway.message_batches.outcomes import message_result, request_counts
from gateway.message_batches.wire import MAX_REQUESTS, EnvelopeError, batch_object, parse_create
from gateway.records import BatchStatus
from gateway.store.objects import BatchRecord, RequestCounts

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


@pytest.mark.parametrize(("case", "body", "message"), BAD_ENVELOPES, ids=[c[0] for c in BAD_ENVELOPES])
def test_the_envelope_is_refused_whole(case: str, body: Any, message: str) -> None:
    """Only the envelope is checked at create; the message names the field."""
    with pytest.raises(EnvelopeError) as refused:
        parse_create(body)
    assert str(refused.value).startswith(message)


def test_params_are_not_checked_at_create() -> None:
    """A request's params are its own business until it runs (Anthropic checks them asynchronously)."""
    body = parse_create({"requests": [_request("a", {"anything": True}), _request("b-_9" + "x" * 60)]})
    assert [r.custom_id for r in body.requests] == ["a", "b-_9" + "x" * 60]
