"""The storage interfaces and the records they hold.

- `Store`: the records, in parts by concept: `files` (`FileStore`),
  `batches` (`BatchStore`), the shard `ledger` (`ShardLedger`: shards,
  attempts, the result journal - results recorded per request, so a retried
  shard skips finished ones - and route stats), `backend_state`, `webhooks`,
  the teams' `quota` (`gateway.store.quota`), `rates` (`gateway.store.rates`) and `storage`
  (`gateway.store.storage`).
- `Blobs`: file bytes by key (uploads, shard files, outputs).
- `Queue`: shards waiting for a worker, and the ones workers hold.
- `Coordination`: leases and worker heartbeats, for the steps two processes
  must not do at once and for knowing which workers are alive.

Each has an embedded implementation (SQLite, local directory, a SQLite queue
that works across the processes of one machine) and a shared one (Redis, S3,
Redis Streams). The runtime's parts see only these protocols.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gateway.records import BatchStatus, Result, RouteStats, Shard, Usage
from gateway.store.lines import split_lines
from gateway.store.quota import QuotaLedger, SpendTo
from gateway.store.rates import RateWindows
from gateway.store.storage import StorageLedger
from gateway.store.webhook_deliveries import WebhookDeliveries


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchOptions:
        return cls(**data)


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
    # Per-route facts for summaries and native batches (token totals, upstream ids, cost).
    routes: dict[str, Any] = field(default_factory=dict)

    def to_openai(self, live_routes: dict[str, RouteStats] | None = None) -> dict[str, Any]:
        """OpenAI's batch object, plus batchyard's `routes`: per route (model name) `requests`, `completed`,
        `failed`, tokens and `cost_usd` (and a native route's `upstream_batch_ids`). `live_routes`: the
        store's running counts, for a batch not yet finalized."""
        routes = {name: dict(facts) for name, facts in self.routes.items()
                  if name != "summary" and isinstance(facts, dict)}
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
        return cls(**data)


@dataclass(slots=True)
class Page:
    data: list[Any]
    has_more: bool


class FileStore(Protocol):
    """File records (the bytes are in `Blobs`)."""

    async def put(self, rec: FileRecord) -> None: ...
    async def get(self, file_id: str, owner: str | None = None) -> FileRecord | None:
        """None when missing or, with `owner` given, owned by someone else."""
    async def page(self, owner: str, *, purpose: str | None, limit: int, order: str, after: str | None) -> Page:
        """By (created_at, id), `order` "asc" or "desc", after the file `after` (ignored when not the owner's)."""
    async def delete(self, file_id: str, owner: str | None = None) -> bool: ...
    async def expired(self, at: int, limit: int = 100) -> list[FileRecord]:
        """Files whose `expires_at` is before `at` (oldest first)."""


class BatchStore(Protocol):
    """Batch records. Their `request_counts` and `usage` are the ledger's counters (see `ShardLedger`)."""

    async def put(self, rec: BatchRecord) -> None: ...
    async def get(self, batch_id: str, owner: str | None = None) -> BatchRecord | None: ...
    async def page(self, owner: str, *, limit: int, after: str | None) -> Page:
        """Newest first (by creation, not `created_at`), as OpenAI lists them."""
    async def update(
        self, batch_id: str, fields: dict[str, Any], *, if_status: Collection[BatchStatus] | None = None
    ) -> bool:
        """Set record fields; with `if_status`, only when the status is one of those (atomic). True if applied."""
    async def active(self) -> list[BatchRecord]:
        """Batches not yet finished (for recovery and expiry)."""


class ShardLedger(Protocol):
    """What happened to each shard of a batch: the shard table, attempts, the result journal, route stats.

    `record_results` moves the batch's counters (`request_counts`, `usage`), its route stats and its team's
    spend in the same atomic step as the journal, so a line counts once however often it is recorded: that
    is why the ledger shares its connection with the `BatchStore` and the `QuotaLedger`.
    """

    async def put_shards(self, batch_id: str, shards: Sequence[Shard]) -> None:
        """Add shards; one already there is kept as it is."""
    async def get_shards(self, batch_id: str) -> list[Shard]: ...
    async def unfinished_shards(self, batch_id: str) -> list[Shard]: ...
    async def finish_shard(self, shard: Shard) -> int:
        """Mark a shard finished (idempotent); returns how many shards of its batch are still unfinished."""
    async def begin_attempt(self, shard: Shard) -> int:
        """Count one more attempt at running the shard (by any process); returns the count so far."""
    async def record_results(self, shard: Shard, results: Sequence[Result], spend: SpendTo | None = None) -> None:
        """Record results and count them; a result for a line already recorded is ignored. `spend`: add the
        cost of the newly recorded ones to that team's spend, in the same step."""
    async def record_answered(self, shard: Shard, count: int) -> None:
        """Count `count` lines answered at validation as failed requests, and seal the shard. They are
        not journaled: the planner wrote their results straight into the shard's results blob and
        counted them as it went. Once per shard: a second call counts nothing."""
    async def journal(self, shard: Shard) -> list[Result]: ...
    async def recorded_lines(self, shard: Shard) -> set[int]: ...
    async def drop_journal(self, shard: Shard) -> None:
        """The shard is sealed: its results are in a blob now."""
    async def route_stats(self, batch_id: str) -> dict[str, RouteStats]:
        """Per route (model_name; "" for lines answered at validation): counts, tokens and cost so far."""


class BackendState(Protocol):
    """Small durable state of backends (e.g. the upstream batch ids of native shards), by key."""

    async def put(self, key: str, value: dict[str, Any]) -> None: ...
    async def get(self, key: str) -> dict[str, Any] | None: ...
    async def delete(self, key: str) -> None: ...


class Store(Protocol):
    """The records, by concept. One object hands out the parts because they share one connection
    (one SQLite file, one Redis client) and the ledger writes the batches' counters atomically with its
    journal; a caller names the concept at each call (`store.ledger.record_results(...)`). `webhooks`:
    the teams' webhook deliveries (`gateway.store.webhook_deliveries`); `quota`: the teams' admitted
    batches and spend (`gateway.store.quota`); `rates`: their rpm/tpm windows (`gateway.store.rates`); `storage`:
    the bytes of their uploads (`gateway.store.storage`)."""

    @property
    def files(self) -> FileStore: ...
    @property
    def batches(self) -> BatchStore: ...
    @property
    def ledger(self) -> ShardLedger: ...
    @property
    def backend_state(self) -> BackendState: ...
    @property
    def webhooks(self) -> WebhookDeliveries: ...
    @property
    def quota(self) -> QuotaLedger: ...
    @property
    def rates(self) -> RateWindows: ...
    @property
    def storage(self) -> StorageLedger: ...
    async def aclose(self) -> None: ...


class BlobWriter(Protocol):
    async def write(self, data: bytes) -> None: ...
    async def commit(self) -> int:
        """Make the blob visible under its key; returns its size."""
    async def abort(self) -> None: ...


class Blobs(Protocol):
    def writer(self, key: str) -> BlobWriter:
        """A writer the caller must commit or abort; `writing` does that for a block."""
    def writing(self, key: str) -> AbstractAsyncContextManager[BlobWriter]:
        """`async with blobs.writing(key) as w:` the blob appears when the block ends, not at all if it raises."""
    def read(self, key: str, chunk_size: int = 1 << 16) -> AsyncIterator[bytes]: ...
    async def size(self, key: str) -> int | None: ...
    async def delete(self, key: str) -> None: ...
    async def delete_prefix(self, prefix: str) -> None: ...
    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Delivery:
    shard: Shard
    token: str  # the queue's handle for ack


class Queue(Protocol):
    # Called with a delivery's token when the queue finds the shard taken over by another worker
    # (this one stalled past the claim timeout): the runner stops running it.
    on_lost: Callable[[str], None] | None

    async def put(self, shard: Shard) -> None: ...
    async def put_missing(self, shard: Shard) -> bool:
        """Enqueue the shard unless an entry already carries it; True if it was enqueued."""
    async def get(self, routes: Collection[str] | None, timeout: float, skip_teams: Collection[str] = (),
                  skip_batches: Collection[str] = ()) -> Delivery | None:
        """The next shard for one of `routes` (None: any), of a team not in `skip_teams` and a batch not in
        `skip_batches`, or None after `timeout` seconds. Which shard: the fair pick (`gateway.scheduling.fairness`)
        between teams and batches.

        A shard held by a worker that is no longer alive is delivered again."""
    async def ack(self, delivery: Delivery) -> None: ...
    async def hand_back(self, delivery: Delivery) -> None:
        """Give a shard up unacked: the next `get` anywhere may take it at once."""
    async def queued(self) -> Collection[str]:
        """The keys of every shard the queue carries (waiting or held)."""
    async def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(waiting, held) shards per route; routes with none are left out."""
    async def tidy(self, alive: Collection[str]) -> None:
        """Forget what consumers that are not alive left behind (bookkeeping only)."""
    async def aclose(self) -> None: ...


class Coordination(Protocol):
    """Leases and heartbeats shared by every process of one deployment."""

    def lease(self, what: str) -> AbstractAsyncContextManager[bool]:
        """Hold the lease `what` for the block (renewed while held): yields False if another holds it."""
    async def acquire(self, what: str, ttl: float) -> bool: ...
    async def release(self, what: str) -> None: ...
    async def held(self, what: str) -> bool: ...
    async def beat(self, name: str, info: dict[str, Any], ttl: float) -> None:
        """Say that worker `name` is alive for `ttl` more seconds."""
    async def gone(self, name: str) -> None:
        """Worker `name` stopped."""
    async def live_workers(self) -> list[dict[str, Any]]: ...
    async def aclose(self) -> None: ...


async def read_lines(blobs: Blobs, key: str) -> AsyncIterator[bytes]:
    """The lines of a blob, streamed, without their line ends (in linear time: `split_lines`)."""
    async for line in split_lines(blobs.read(key)):
        if isinstance(line, bytes):  # always, without a cap
            yield line


@asynccontextmanager
async def commit_or_abort(writer: BlobWriter) -> AsyncIterator[BlobWriter]:
    """`Blobs.writing`, for every implementation: commit when the block ends, abort when it raises
    (a half-written blob never appears, and a multipart upload is not left behind)."""
    try:
        yield writer
    except BaseException:
        await writer.abort()
        raise
    await writer.commit()


async def write_lines(blobs: Blobs, key: str, lines: AsyncIterable[bytes]) -> int:
    """Write the lines (each given without its line end); returns the blob's size."""
    size = 0
    async with blobs.writing(key) as w:
        async for line in lines:
            await w.write(line + b"\n")
            size += len(line) + 1
    return size
