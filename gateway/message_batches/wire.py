"""Anthropic's Message Batches on the wire: what `POST /v1/messages/batches` accepts, the batch object the
anthropic SDK's `MessageBatch` type reads, and Anthropic's error shape.

Only the envelope is checked at create (`requests` within Anthropic's limits, each `custom_id` by its rule,
`params` an object), as Anthropic checks it, request by request as the body is read (`envelope`); each
request's `params` are checked per request while the batch runs, and a bad one is that request's `errored`
result, never a failed batch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints

from gateway.domain import BatchStatus
from gateway.lines.body_fields import MAX_LINE_DEPTH
from gateway.store.records import BatchRecord

MAX_REQUESTS = 100_000  # Anthropic's limits on one Message Batch
MAX_BODY_BYTES = 256 * 1024 * 1024
CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
COMPLETION_WINDOW = "24h"  # a Message Batch expires 24 hours after it is created
# Containers a request's params may nest: its input line (the params one level down) within the intake's
# bound, so that a request accepted here is never a line the intake cannot read (which would fail the batch).
MAX_PARAMS_DEPTH = MAX_LINE_DEPTH - 1

# Anthropic's error types by HTTP status (its "Errors" reference): the one table of Anthropic's door, for
# our own refusals, a route's errors and a Message Batch's results alike. Another 5xx is an api_error,
# another 4xx a bad request.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 504: "timeout_error",
               529: "overloaded_error"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(type_: str, message: str) -> dict[str, Any]:
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def anthropic_type(status: int, said: Any = None) -> str:
    """The Anthropic type of an error: the one its sender named when that is an Anthropic type, else the
    status's."""
    return str(said) if said in ERROR_TYPES.values() or said == "api_error" else error_type(status)


def anthropic_error(status: int, body: dict[str, Any] | None) -> dict[str, Any]:
    """An error reply in Anthropic's shape, from a route's error body in OpenAI's shape (a provider's,
    the local engine's) or Anthropic's own: the route's words, Anthropic's type for the status (an Anthropic
    type the route named is kept)."""
    inner = (body or {}).get("error")
    inner = inner if isinstance(inner, dict) else (body or {})  # an older vLLM's error object is the body
    message = inner.get("message")
    return error_body(anthropic_type(status, inner.get("type")),
                      message if isinstance(message, str) else f"upstream {status}")


class MessageBatchRequest(BaseModel):
    """One of `requests`: the SDK's `batch_create_params.Request`."""

    model_config = ConfigDict(extra="forbid")
    custom_id: Annotated[str, StringConstraints(strict=True, pattern=CUSTOM_ID_PATTERN)]
    params: dict[str, Any]


class EnvelopeError(ValueError):
    """A create body Anthropic refuses whole (400 invalid_request_error); the message names the field."""


def input_line(request: MessageBatchRequest) -> dict[str, Any]:
    """The pipeline's input line for one request: a `/v1/messages` call with its params as the body."""
    return {"custom_id": request.custom_id, "method": "POST", "url": "/v1/messages", "body": request.params}


def rfc3339(at: int | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def processing_status(status: BatchStatus) -> str:
    if status.finished:
        return "ended"
    return "canceling" if status is BatchStatus.CANCELLING else "in_progress"


def ended_at(rec: BatchRecord) -> int | None:
    if not rec.status.finished:
        return None
    return rec.completed_at or rec.cancelled_at or rec.expired_at or rec.failed_at or rec.finalizing_at \
        or rec.cancelling_at or rec.created_at


def batch_object(rec: BatchRecord, request_counts: dict[str, int], results_url: str) -> dict[str, Any]:
    """The SDK's `MessageBatch`: `results_url` only once the batch has ended, as Anthropic's."""
    ended = rec.status.finished
    return {
        "id": rec.id,
        "type": "message_batch",
        "processing_status": processing_status(rec.status),
        "request_counts": request_counts,
        "created_at": rfc3339(rec.created_at),
        "expires_at": rfc3339(rec.expires_at),
        "ended_at": rfc3339(ended_at(rec)),
        "cancel_initiated_at": rfc3339(rec.cancelling_at),
        "archived_at": None,
        "results_url": results_url if ended else None,
    }


__all__ = [
    "COMPLETION_WINDOW", "CUSTOM_ID_PATTERN", "ERROR_TYPES", "MAX_BODY_BYTES", "MAX_PARAMS_DEPTH", "MAX_REQUESTS",
    "EnvelopeError", "MessageBatchRequest", "anthropic_error", "anthropic_type", "batch_object", "error_body",
    "error_type", "input_line",
    "processing_status", "rfc3339",
]
