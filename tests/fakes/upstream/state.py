"""The loopback upstream's state (options, counters, files, batch jobs) and the helpers its parts share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tests.fakes.upstream.replies import ApiError, _dumps, _id, _invalid, _loads, _now, request_text

JSON = dict[str, Any]
Reply = tuple[int, JSON, dict[str, str] | None]
Endpoint = Callable[[Request], Awaitable[Response]]
RawHeaders = Iterable[tuple[bytes, bytes]]
RawReply = tuple[int, bytes, list[tuple[bytes, bytes]]]


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_dumps(payload), status_code=status, headers=headers, media_type="application/json")


def _raw(
    status: int, payload: JSON | bytes, extra: dict[str, str] | None = None, content_type: bytes = b"application/json"
) -> RawReply:
    data = payload if isinstance(payload, bytes) else _dumps(payload)
    headers = [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]
    if extra:
        headers += [(name.encode(), value.encode()) for name, value in extra.items()]
    return status, data, headers


def _error(exc: ApiError) -> Response:
    return _json(exc.body(), exc.status)



@dataclass(slots=True)
class Options:
    latency_ms: float = 0.0
    batch_delay: float = 0.5
    api_key: str | None = None




@dataclass
class Counters:
    requests: int = 0
    batch_lines: int = 0
    files_created: int = 0
    batches_created: int = 0
    by_path: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    by_custom: Counter[str] = field(default_factory=Counter)
    # the W3C `traceparent` headers the real-time requests carried (the gateway's request spans), in order
    traceparents: list[str] = field(default_factory=list)
    # any other trace header they carried (`tracestate`, `baggage`, ...), as "name: value"
    trace_headers: list[str] = field(default_factory=list)
    # model -> the tokens its batch jobs' answered lines are billed, {"input": n, "output": n}
    billed: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "requests": self.requests,
            "by_path": dict(self.by_path),
            "by_model": dict(self.by_model),
            "by_status": dict(self.by_status),
            "by_custom": dict(self.by_custom),
            "batch_lines": self.batch_lines,
            "files_created": self.files_created,
            "batches_created": self.batches_created,
            "traceparents": self.traceparents,
            "trace_headers": self.trace_headers,
            "billed": self.billed,
        }


BATCH_ENDPOINTS = {
    "/chat/completions": "chat",
    "/completions": "completions",
    "/embeddings": "embeddings",
    "/responses": "responses",
    "/moderations": "moderations",
    "/images/generations": "images",
    "/images/edits": "image_edits",
}
FILE_PURPOSES = {"batch", "batch_output", "fine-tune", "assistants", "vision", "user_data", "evals"}


@dataclass(slots=True)
class StoredFile:
    obj: JSON
    content: bytes


@dataclass(slots=True)
class BatchLine:
    custom_id: str
    kind: str
    body: JSON
    model: str


@dataclass(slots=True)
class BatchJob:
    obj: JSON
    lines: list[BatchLine]
    poison: str | None  # "fail" or "expire" from a #batch: directive
    hang_polls: int = 0  # `#batch:hangxN`: the batch's first N retrieves are never answered


# --------------------------------------------------------------------------- batch helpers


def _batch_endpoint(value: Any, strict: bool, endpoints: dict[str, str] = BATCH_ENDPOINTS) -> tuple[str, str]:
    """Check a batch's `endpoint`; OpenAI takes only `/v1/…`, Azure also the bare form."""
    if isinstance(value, str):
        bare = value[3:] if value.startswith("/v1/") else value
        if bare in endpoints and (value.startswith("/v1/") or not strict):
            return value, endpoints[bare]
    allowed = ", ".join(f"'/v1{e}'" for e in endpoints)
    raise _invalid("endpoint", f"Invalid value for 'endpoint': {value!r}. Supported values are: {allowed}.")


def _parse_batch_lines(content: bytes, endpoint: str, kind: str) -> list[BatchLine]:
    """Validate an input file like OpenAI does; a bad line is a 400 naming the line."""

    def bad(line: int, code: str, message: str) -> ApiError:
        return ApiError(400, f"Line {line}: {message}", param="input_file_id", code=code)

    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            data = _loads(raw)
        except ValueError:
            raise bad(number, "invalid_json_line", "this line is not valid JSON.") from None
        if not isinstance(data, dict):
            raise bad(number, "invalid_json_line", "each line must be a JSON object.")
        for name in ("custom_id", "method", "url"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise bad(number, "missing_required_parameter", f"missing required parameter '{name}'.")
        custom_id: str = data["custom_id"]
        body = data.get("body")
        if not isinstance(body, dict):
            raise bad(number, "missing_required_parameter", "missing required parameter 'body'.")
        if data["method"] != "POST":
            raise bad(number, "invalid_request", "only the POST method is supported.")
        if data["url"] != endpoint:
            raise bad(number, "invalid_url", f"the url {data['url']!r} does not match the batch endpoint {endpoint!r}.")
        if custom_id in seen:
            raise bad(number, "duplicate_custom_id", f"the custom_id {custom_id!r} is not unique.")
        if body.get("stream"):
            raise bad(number, "streaming_unsupported", "streaming is not supported in batches.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise bad(number, "missing_required_parameter", "missing required parameter 'model'.")
        if lines and model != lines[0].model:
            raise bad(number, "mismatched_model", f"one model per batch; got {model!r} and {lines[0].model!r}.")
        try:
            request_text(kind, body)
        except ApiError as exc:
            raise bad(number, "invalid_request", exc.message) from None
        seen.add(custom_id)
        lines.append(BatchLine(custom_id, kind, body, model))
    if not lines:
        raise ApiError(400, "The input file is empty.", param="input_file_id", code="empty_file")
    return lines


def _poison(content: bytes) -> str | None:
    """A batch-level directive in the input file: "fail", "expire" or None."""
    if b"#batch:fail" in content:
        return "fail"
    return "expire" if b"#batch:expire" in content else None


def _new_batch(body: JSON, endpoint: str, model: str) -> JSON:
    now = _now()
    return {
        "id": _id("batch_"),
        "object": "batch",
        "endpoint": endpoint,
        "errors": None,
        "input_file_id": body["input_file_id"],
        "completion_window": body["completion_window"],
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + 24 * 3600,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": body.get("metadata"),
        "model": model,
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }


def _add_usage(total: JSON, usage: JSON) -> None:
    inp = usage.get("prompt_tokens", usage.get("input_tokens")) or 0
    out = usage.get("completion_tokens", usage.get("output_tokens")) or 0
    total["input_tokens"] += inp
    total["output_tokens"] += out
    total["total_tokens"] += inp + out


def _jsonl(lines: list[bytes]) -> bytes:
    return b"\n".join(lines) + b"\n"


def _limit(value: str | None, default: int, maximum: int | None = None) -> int:
    try:
        limit = int(value) if value is not None else default
    except ValueError:
        raise _invalid("limit", f"Invalid value for 'limit': {value!r}.") from None
    if limit < 1 or (maximum is not None and limit > maximum):
        raise _invalid("limit", f"'limit' must be between 1 and {maximum or 'any'}.")
    return limit


def _page(items: list[JSON], after: str | None, limit: int) -> JSON:
    """OpenAI's cursor page: {object, data, first_id, last_id, has_more}."""
    if after:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    data = items[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }


