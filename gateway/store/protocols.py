"""Every storage interface: the protocols the runtime's parts see, whatever backs them.

- `Store`: the records, in parts by concept: `files` (`FileStore`), `batches` (`BatchStore`), the shard
  `ledger` (`ShardLedger`: shards, attempts, the result journal - results recorded per request, so a
  retried shard skips finished ones - and route stats), `backend_state`, `webhooks` (`WebhookDeliveries`),
  the teams' `quota` (`QuotaLedger`), `rates` (`RateWindows`), `storage` (`StorageLedger`) and `idempotency`
  (`IdempotencyKeys`), and the dashboard's login `sessions` (`DashboardSessions`).
- `Blobs`: file bytes by key (uploads, shard files, outputs).
- `Queue`: shards waiting for a worker, and the ones workers hold.
- `Coordination`: leases and worker heartbeats, for the steps two processes
  must not do at once and for knowing which workers are alive; and the concurrency a background route's
  workers share (`share_concurrency`).

Each has an embedded implementation (`gateway.store.sqlite`: SQLite, with a queue that works across the
processes of one machine; `gateway.store.blobs.directory`: a local directory) and a shared one
(`gateway.store.redis`: Redis, Redis Streams; `gateway.store.blobs.s3`: S3). The records they hold are in
`gateway.store.records`; the rules both backends apply sit beside the records they rule (`quota.exceeded`,
`rates.grantable`, the `storage` meter, the webhook delivery states).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from gateway.domain import BatchStatus, Result, RouteStats, Shard
from gateway.scheduling.busy_server import ShareAsk, ShareState
from gateway.scheduling.pacing import RateWindows  # the contract scheduling owns; each store implements it
from gateway.store.idempotency import IdempotencyEntry
from gateway.store.quota import SpendTo, TeamLimits, TeamUsage
from gateway.store.records import BatchFields, BatchRecord, Delivery, FileRecord, Page
from gateway.store.sessions import Session
from gateway.store.webhook_deliveries import WebhookDelivery


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
    async def tidy(self, at: float) -> int:
        """Remove what puts that stopped half way long before `at` left in the indexes (the sweep calls it);
        how many had. A store that writes a record and its indexes in one transaction (SQLite): 0."""


class BatchStore(Protocol):
    """Batch records. Their `request_counts` and `usage` are the ledger's counters (see `ShardLedger`)."""

    async def put(self, rec: BatchRecord) -> None: ...
    async def get(self, batch_id: str, owner: str | None = None) -> BatchRecord | None: ...
    async def page(self, owner: str, *, limit: int, after: str | None, before: str | None = None,
                   kind: str | None = None) -> Page:
        """Newest first (by creation, not `created_at`), as OpenAI lists them: those created before `after`
        or, with `before`, the `limit` created just after it (Anthropic's `before_id`). `kind`: only ids of
        that kind (`batch`, `msgbatch`: one API family's); None: every kind (the dashboard)."""
    async def update(
        self, batch_id: str, fields: BatchFields, *, if_status: Collection[BatchStatus] | None = None
    ) -> bool:
        """Set record fields; with `if_status`, only when the status is one of those (atomic). True if applied."""
    async def delete(self, batch_id: str, owner: str) -> bool:
        """Remove a finished batch's record (Anthropic's `DELETE`); False when there is none of the owner's
        or it is not finished."""
    async def active(self) -> list[BatchRecord]:
        """Batches not yet finished (for recovery and expiry)."""
    async def tidy(self, at: float) -> int:
        """Remove what creates that stopped half way long before `at` left in the indexes (the sweep calls it);
        how many had. A store that writes a record and its indexes in one transaction (SQLite): 0."""


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
    async def return_attempt(self, shard: Shard) -> int:
        """Take back one attempt (never below 0): the attempt met a fault of the machine (a full disk, a store
        or S3 outage), not of the work, so it must not bring the shard closer to being given up. Returns the
        count so far."""
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
        """The shard is sealed: its results are in a blob now. A result recorded for it later (the shard run
        twice, by a worker taken for dead) is ignored: no journal is left to dedupe it against."""
    async def route_stats(self, batch_id: str) -> dict[str, RouteStats]:
        """Per route (model_name; "" for lines answered at validation): counts, tokens and cost so far."""
    async def logged(self, batch_id: str, after: int, limit: int) -> list[Result]:
        """The batch's result log: each result `record_results` journaled for a shard not yet sealed, in that
        order, numbered by its `seq` (1, 2, …, set by the ledger as it journals it, and kept in the journal's
        copy too): those after `after`, at most `limit`. A shard's results leave it at `drop_journal` (they are
        in the shard's results blob then, with their seq: `sealed_seqs` says which seqs), so the store never
        holds a whole batch's results."""
    async def sealed_seqs(self, batch_id: str) -> dict[int, tuple[int, int]]:
        """Each sealed shard's span of seqs, by its index: (the first, the last) of the results it journaled.
        A shard sealed without a journaled result (lines answered at validation) has none."""
    async def drop_log(self, batch_id: str) -> None:
        """The batch is finished: its results are in its output files (the log's order with them). The log
        and the sealed shards' spans go."""
    async def settle_spend(self, batch_id: str) -> None:
        """Make sure the cost of every result journaled for the batch is in its team's spend (the finalizer
        calls it). A store that moves the spend in `record_results`' own step (SQLite) has nothing to do; one
        whose batch and team live apart (Redis Cluster's slots) moves what a crash left behind, and then
        forgets what it kept per batch to move each USD once. Only once every shard is sealed (the batch owes
        nothing more); a second call moves nothing."""


class BackendState(Protocol):
    """Small durable state of backends (e.g. the upstream batch ids of native shards), by key."""

    async def put(self, key: str, value: dict[str, Any]) -> None: ...
    async def get(self, key: str) -> dict[str, Any] | None: ...
    async def delete(self, key: str) -> None: ...
    async def scan(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every entry whose key begins with `prefix`, by key."""


class WebhookDeliveries(Protocol):
    """The teams' webhook deliveries (`gateway.store.webhook_deliveries`)."""

    async def add(self, delivery: WebhookDelivery) -> bool:
        """Record a new delivery; False (and nothing changed) when one with its id exists."""
    async def due(self, now: float, limit: int) -> list[WebhookDelivery]:
        """PENDING deliveries whose `next_at` has come, soonest first."""
    async def save(self, delivery: WebhookDelivery) -> None:
        """Write back an attempt's outcome (state, attempts, next_at, last_*)."""
    async def recent(self, owner: str | None, limit: int) -> list[WebhookDelivery]:
        """The newest deliveries of one team (None: every team), newest first."""


class QuotaLedger(Protocol):
    """The teams' admitted batches and spend (`gateway.store.quota`)."""

    async def admit(self, team: str, batch_id: str, requests: int, limits: TeamLimits,
                    by_model: Mapping[str, int] | None = None) -> str | None:
        """Count the batch against its team's quotas if it fits all of them; else the name of the first
        quota it would exceed (`MAX_ACTIVE_BATCHES`, `MAX_ENQUEUED_REQUESTS`, `MODEL_MAX_ENQUEUED_REQUESTS`),
        and nothing is counted. `by_model`: the batch's requests per model_name (when the team has
        per-model limits)."""
    async def usage(self, team: str) -> TeamUsage: ...
    async def admitted(self) -> dict[str, float]:
        """Every batch counted now -> when it was admitted (epoch seconds)."""
    async def release(self, batch_ids: Collection[str]) -> None: ...
    async def spend(self, team: str, period: int) -> float:
        """The team's spend in the budget period that starts at `period` (see `SpendTo`)."""
    async def reserve(self, team: str, period: int, holder: str, costs: Sequence[float], limit: float) -> int:
        """Hold for `holder` the cost of the longest prefix of `costs` that fits `limit` less the team's spend in
        `period` and what its other holders hold, in the one atomic step that reads them (`quota.fitting`); the
        holder's earlier hold is replaced (0 fitting: it holds nothing). Returns how many fit."""
    async def shrink(self, team: str, holder: str, usd: float) -> None:
        """The holder's hold less `usd` (results it stood for are in the spend now); never below nothing."""
    async def unreserve(self, team: str, prefix: str) -> None:
        """Let go of every hold of the team whose holder starts with `prefix` (a holder, or a batch's `id/`)."""
    async def reserved(self, team: str) -> dict[str, float]:
        """The team's holds now: holder -> USD."""


class StorageLedger(Protocol):
    """The bytes of the teams' uploads (`gateway.store.storage`)."""

    async def reserve(self, team: str, file_id: str, size: int, limit: int) -> bool:
        """Hold `size` bytes for the file being uploaded (pending) if the team's other files and uploads plus
        `size` fit `limit`; else drop the file's entry and return False (in one atomic step)."""
    async def settle(self, team: str, file_id: str, size: int) -> None:
        """The file is stored with `size` bytes: counted until `release`."""
    async def hold(self, team: str, file_id: str) -> None:
        """The file is about to be deleted: its entry (if any) goes pending, so a crash before `release`
        cannot leave it counted for ever."""
    async def release(self, team: str, file_id: str) -> None:
        """Forget the file (deleted, or its upload refused or aborted)."""
    async def used(self, team: str) -> int:
        """The team's counted bytes: stored files and running uploads."""


class IdempotencyKeys(Protocol):
    """The teams' `Idempotency-Key`s (`gateway.store.idempotency`), by team and key."""

    async def reserve(self, team: str, key: str, token: str, fingerprint: str, hold: float) -> IdempotencyEntry | None:
        """Reserve the key for the request `token` for `hold` seconds if no live entry has it (None: reserved;
        an entry whose reservation has lapsed is taken over), in one atomic step; else the live entry."""
    async def complete(self, team: str, key: str, token: str, fingerprint: str, result: dict[str, Any]) -> bool:
        """The request `token` made its object: keep `result` and its fingerprint until `KEY_TTL_SECONDS`
        after the entry was made. False (nothing changed) when the reservation is no longer the token's."""
    async def release(self, team: str, key: str, token: str) -> None:
        """The request `token` failed: its reservation (if still its own and not completed) goes."""


class DashboardSessions(Protocol):
    """The dashboard's login sessions (`gateway.store.sessions`), by the digest of their id."""

    async def open(self, name: str, session: Session) -> None:
        """Keep the session until its `expires_at`."""
    async def get(self, name: str) -> Session | None:
        """The session, or None when there is none or it has lapsed."""
    async def close(self, name: str) -> None:
        """End the session (logout); nothing happens for one that is gone."""


class Store(Protocol):
    """The records, by concept. One object hands out the parts because they share one connection
    (one SQLite file, one Redis client) and the ledger writes the batches' counters atomically with its
    journal; a caller names the concept at each call (`store.ledger.record_results(...)`). `webhooks`:
    the teams' webhook deliveries (`gateway.store.webhook_deliveries`); `quota`: the teams' admitted
    batches and spend (`gateway.store.quota`); `rates`: their rpm/tpm windows (`gateway.store.rates`);
    `storage`: the bytes of their uploads (`gateway.store.storage`); `idempotency`: their idempotency keys
    (`gateway.store.idempotency`); `sessions`: the dashboard's logins (`gateway.store.sessions`)."""

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
    @property
    def idempotency(self) -> IdempotencyKeys: ...
    @property
    def sessions(self) -> DashboardSessions: ...
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
    def read(self, key: str, chunk_size: int = 1 << 16, *, start: int = 0,
             end: int | None = None) -> AsyncIterator[bytes]:
        """The blob's bytes, streamed; with `start`/`end`, only [start, end) of them (a shard's lines in its
        batch's input file: `gateway.pipeline.shard_input`)."""
    async def size(self, key: str) -> int | None: ...
    async def delete(self, key: str, *, manifest: bool = True) -> None:
        """The blob (a manifest: its parts too). A plain key's manifest (`composed`), which stands for it where
        its own blob is absent, goes with it, unless `manifest=False`: the plain key's own blob only."""
    async def delete_prefix(self, prefix: str) -> None:
        """Every blob under the folder `prefix`, and the writes a killed process left unfinished there."""
    async def discard_unfinished(self, prefix: str) -> None:
        """The writes a killed process left unfinished under the folder `prefix` (S3's multipart uploads, the
        directory's temporary files); the blobs there stay. Only where no writer of that folder still runs."""
    async def compose(self, key: str, parts: Sequence[tuple[str, int]]) -> str:
        """One blob of `parts` (key, bytes) in order, without their bytes passing through this process; the key
        it is read at (`key`, or its manifest's when the parts stay its bytes: `composed.is_composed`). The
        parts are left in place: the caller deletes them once the result no longer reads them. A compose of
        the same `key` that a kill cut short is discarded first (S3 bills an unfinished multipart upload)."""
    async def aclose(self) -> None: ...


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
    async def share_concurrency(self, ask: ShareAsk) -> ShareState:
        """A background route's turn at its shared concurrency (`gateway.scheduling.busy_server.exchange`)."""
    async def aclose(self) -> None: ...


__all__ = [
    "BackendState",
    "BatchStore",
    "BlobWriter",
    "Blobs",
    "Coordination",
    "DashboardSessions",
    "FileStore",
    "IdempotencyKeys",
    "Queue",
    "QuotaLedger",
    "RateWindows",
    "ShardLedger",
    "StorageLedger",
    "Store",
    "WebhookDeliveries",
]
