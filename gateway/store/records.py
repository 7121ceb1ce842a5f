"""The records the stores hold, and what a caller may change in a batch record.

- `FileRecord`, `BatchRecord` (with its `RequestCounts` and `BatchOptions`): what `FileStore` and `BatchStore`
  keep (`gateway.store.protocols`); `Page`: a page of either.
- `BatchFields`: the fields `BatchStore.update` may set, typed: a misspelled or ill-typed field fails the type
  check (and, at run time, `batch_fields` refuses a name it does not know) instead of every later read.
- `Delivery`: a shard handed out by a `Queue`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from gateway.domain import MESSAGE_BATCH_KIND, BatchStatus, RouteStats, Shard, Usage


def now() -> int:
    return int(time.time())


@dataclass(slots=True)
class FileRecord:
    id: str
    owner: str  # team id; "" when auth is off
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int | None = None
    blob_key: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": self.expires_at,
            "status_details": None,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileRecord:
        return cls(**data)


@dataclass(slots=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(slots=True)
class BatchOptions:
    """How a batch is run: the server follows OpenAI, the CLI follows vLLM's run_batch."""

    # Validation problems fail the whole batch (OpenAI); otherwise only bad
    # JSON/missing fields/duplicates do, and the rest become per-line errors.
    strict: bool = True
    # Failed requests go to a separate error file (OpenAI); otherwise inline.
    split_errors: bool = True
    # The models this batch's owner may use; None: all.
    allowed_models: list[str] | None = None
    # Error replies written as vLLM's run_batch writes them (`response.body`
    # null, the error body in `error`): `batchyard run --model`, the drop-in.
    run_batch_errors: bool = False
    # Re-runs of a reply that does not match its schema (`batchyard run --output-reruns`); None: the team's
    # `output_check`, else `batch_settings.output_check`.
    output_reruns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchOptions:
        return cls(**data)


def message_batch_files_owner(owner: str) -> str:
    """The owner of a Message Batch's files (its input, its results): not the team's, so that the team's
    OpenAI files list (and its ids) never shows them; the batch record names them."""
    return f"{owner}\x1f{MESSAGE_BATCH_KIND}"


def storage_team(owner: str) -> str:
    """The team whose storage quota a file of `owner` counts against: the team itself, whatever door made
    the file (a Message Batch's files are owned apart only to keep them out of the team's files list)."""
    return owner.partition("\x1f")[0]


@dataclass(slots=True)
class BatchRecord:
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    counts: RequestCounts = field(default_factory=RequestCounts)
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    options: BatchOptions = field(default_factory=BatchOptions)
    shards_total: int = 0
    output_expires_after: dict[str, Any] | None = None
    # Per route (model name): its facts for summaries and native batches (token totals, upstream ids, cost).
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the run ended with (`gateway.pipeline.merge.Summary.to_json`): counts by model and status, token
    # totals; set when the batch is finalized. Records written before it kept it as `routes["summary"]`.
    summary: dict[str, Any] | None = None
    # The W3C context (`traceparent`, `tracestate`) of the batch's `batch.create` span, so that every process
    # working on the batch puts its spans in that trace (`gateway.tracing`); None with tracing off.
    trace_context: dict[str, str] | None = None
    # The input file's blob (`FileRecord.blob_key`), kept from the create: the batch reads it until it ends,
    # and deletes it then if the file was deleted meanwhile (`gateway.pipeline.input_files`). None: a record
    # from before it was kept.
    input_key: str | None = None

    @property
    def files_owner(self) -> str:
        """The owner of the batch's output and error files: the team's, a Message Batch's own for its."""
        return message_batch_files_owner(self.owner) if self.id.startswith(MESSAGE_BATCH_KIND + "_") else self.owner

    def to_openai(self, live_routes: dict[str, RouteStats] | None = None) -> dict[str, Any]:
        """OpenAI's batch object, plus batchyard's `routes`: per route (model name) `requests`, `completed`,
        `failed`, tokens and `cost_usd` (and a native route's `upstream_batch_ids`). `live_routes`: the
        store's running counts, for a batch not yet finalized."""
        routes = {name: dict(facts) for name, facts in self.routes.items()}
        for name, stats in (live_routes or {}).items():
            if name:
                routes[name] = {**routes.get(name, {}), **stats.to_json()}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": asdict(self.counts),
            "metadata": self.metadata,
            "model": self.model,
            "usage": self.usage.to_openai(),
            "routes": routes,
        }

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchRecord:
        data = dict(data)
        data["status"] = BatchStatus(data["status"])
        data["counts"] = RequestCounts(**data["counts"])
        data["usage"] = Usage(**data["usage"])
        data["options"] = BatchOptions.from_json(data["options"])
        routes = data.get("routes") or {}
        if "summary" in routes and data.get("summary") is None:  # a record from before the summary had a field
            routes = dict(routes)
            data["summary"] = routes.pop("summary")
            data["routes"] = routes
        return cls(**data)


@dataclass(slots=True)
class Page:
    data: list[Any]
    has_more: bool


@dataclass(slots=True)
class Delivery:
    shard: Shard
    token: str  # the queue's handle for ack

class BatchFields(TypedDict, total=False):
    """The fields of a `BatchRecord` that `BatchStore.update` sets (any subset). `counts`: only its `total`
    is the record's own (`completed` and `failed` are the ledger's counters)."""

    status: BatchStatus
    in_progress_at: int
    finalizing_at: int
    completed_at: int
    failed_at: int
    expired_at: int
    cancelling_at: int
    cancelled_at: int
    errors: list[dict[str, Any]]
    counts: RequestCounts
    model: str | None
    shards_total: int
    output_file_id: str
    error_file_id: str
    routes: dict[str, dict[str, Any]]
    summary: dict[str, Any]


BATCH_FIELDS = frozenset(BatchFields.__annotations__)


def batch_fields(fields: BatchFields) -> dict[str, Any]:
    """The fields as the record's JSON holds them (`BatchRecord.to_json`), for a store to write. Refuses a
    name `BatchFields` does not list: a caller that got past the type check (a dict built at run time)
    fails here, before the record is touched."""
    unknown = fields.keys() - BATCH_FIELDS
    if unknown:
        raise TypeError(f"not an updatable batch field: {', '.join(sorted(unknown))}")
    encoded: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, BatchStatus):
            value = value.value
        elif isinstance(value, RequestCounts):
            value = asdict(value)
        encoded[name] = value
    return encoded


__all__ = [
    "BATCH_FIELDS",
    "BatchFields",
    "BatchOptions",
    "BatchRecord",
    "Delivery",
    "FileRecord",
    "Page",
    "RequestCounts",
    "batch_fields",
    "now",
]
