"""A Message Batch's results: each merged output line as Anthropic's result, and the batch's request counts.

`message_result` is the one mapping from the pipeline's output line (OpenAI's batch output shape, whatever
route ran it) to the anthropic SDK's `MessageBatchIndividualResponse`:

- a 2xx reply: `succeeded`, its body (an Anthropic `message`) as the message; with our `output_invalid` (a
  reply that did not match its schema after its re-runs): `errored`, `api_error` with our message;
- no reply, stopped by the batch: `batch_expired` is `expired`, `batch_cancelled` is `canceled`;
- a request the checks refused (our `LineCode`s: an unknown model, a missing field, a stream): `errored`
  with `invalid_request_error`, as Anthropic answers a request it cannot honour;
- any other error: `errored`, the route's own Anthropic error when it gave one, else the type its HTTP
  status means (404 not_found_error, 429 rate_limit_error, 529/503 overloaded_error, 5xx api_error).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import LineCode
from gateway.message_batches.wire import anthropic_type, error_body, error_type
from gateway.store.records import BatchRecord

EXPIRED_CODE, CANCELLED_CODE = "batch_expired", "batch_cancelled"  # the pipeline's stop reasons
# Codes of a request refused before it was sent: the checks' (`LineCode`) and a route's that cannot honour
# a parameter (`unknown_parameter`, `unsupported_parameter`, `unsupported_value`).
_VALIDATION = frozenset({*(c.value for c in LineCode), "unknown_parameter", "unsupported_parameter",
                         "unsupported_value"})
# Error codes of lines without any reply: the HTTP status each stands for (its Anthropic type is the status's).
_CODE_STATUS = {"budget_exceeded": 402, "model_unavailable": 529, "rate_limit_exceeded": 429}


def message_result(line: Mapping[str, Any]) -> dict[str, Any]:
    """One output line as `{custom_id, result: {type: succeeded|errored|canceled|expired, …}}`."""
    custom_id = line.get("custom_id")
    response = line.get("response") or None
    error = line.get("error") if isinstance(line.get("error"), dict) else None
    if response is not None:
        status = response.get("status_code") or 0
        body = response.get("body")
        if 200 <= status < 300:
            if error is None:
                return {"custom_id": custom_id, "result": {"type": "succeeded", "message": body}}
            # a 2xx with our error: a reply that did not match its schema (`output_invalid`)
            message = str(error.get("message") or "The reply does not match the request's schema.")
            return {"custom_id": custom_id, "result": {"type": "errored", "error": error_body("api_error", message)}}
        return {"custom_id": custom_id, "result": {"type": "errored", "error": _reply_error(status, body, error)}}
    code = str((error or {}).get("code") or "")
    if code == EXPIRED_CODE:
        return {"custom_id": custom_id, "result": {"type": "expired"}}
    if code == CANCELLED_CODE:
        return {"custom_id": custom_id, "result": {"type": "canceled"}}
    message = str((error or {}).get("message") or "The request could not be run.")
    type_ = "invalid_request_error" if code in _VALIDATION else error_type(_CODE_STATUS.get(code, 500))
    return {"custom_id": custom_id, "result": {"type": "errored", "error": error_body(type_, message)}}


def _reply_error(status: int, body: Any, error: Mapping[str, Any] | None) -> dict[str, Any]:
    if isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict):
        inner = body["error"]
        return error_body(anthropic_type(status, inner.get("type")), str(inner.get("message") or ""))
    found = body.get("error") if isinstance(body, dict) else None  # OpenAI's shape: {"error": {message, code}}
    detail = found if isinstance(found, dict) else (error or {})
    message = detail.get("message") or (body if isinstance(body, str) else f"The request failed with {status}.")
    type_ = "invalid_request_error" if detail.get("code") in _VALIDATION else error_type(status)
    return error_body(type_, str(message))


def request_counts(rec: BatchRecord) -> dict[str, int]:
    """The SDK's `MessageBatchRequestCounts`. Ended: from the summary the finalizer kept in the record (its
    counts by model and status, failures by error code), so no GET reads the results. Running: the
    ledger's live counters (a request not yet answered is `processing`)."""
    total = rec.counts.total
    summary = rec.summary
    if rec.status.finished:
        if summary is None:  # ended before any request ran (cancelled or expired while validating, or failed)
            kind = {"cancelled": "canceled", "expired": "expired"}.get(rec.status.value, "errored")
            return {**_zero(), kind: total}
        by_code: dict[str, int] = {}
        for counts in (summary.get("by_model") or {}).values():
            for key, n in counts.items():
                by_code[key] = by_code.get(key, 0) + int(n)
        canceled, expired = by_code.get(CANCELLED_CODE, 0), by_code.get(EXPIRED_CODE, 0)
        succeeded = int(summary.get("succeeded", 0))
        errored = int(summary.get("failed", 0)) - canceled - expired
        return {"processing": 0, "succeeded": succeeded, "errored": errored, "canceled": canceled,
                "expired": expired}
    done = rec.counts.completed + rec.counts.failed
    return {**_zero(), "processing": max(total - done, 0), "succeeded": rec.counts.completed,
            "errored": rec.counts.failed}


def _zero() -> dict[str, int]:
    return {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}


__all__ = ["CANCELLED_CODE", "EXPIRED_CODE", "message_result", "request_counts"]
