"""Every Redis key batchyard uses, in one place (as arq does).

All keys start with a prefix (default `batchyard:`) so one Redis can hold
several deployments. On a Redis Cluster the prefix is a hash tag (`{batchyard}:`, `slot_prefix`):
every key of a deployment is in one slot, where every script and transaction may touch them together.

Names never collide: a key built from a team id (`files:`, `batches:`,
`webhooks:`, `quota:`, `quota-models:`, `spend:`) is the only kind of key in its
family, and no fixed key has that shape (a fixed key has no `:` after the prefix:
`active-batches`, `webhooks-all`, `webhooks-due`). Team ids match
`gateway.config.sections.TEAM_ID_PATTERN` (checked at config load: no `:`), so
`files:{team}` and `files:{team}:{purpose}` cannot meet either. Keys that hold a
team id next to other names (`stream:`, `ready:`, `rate:`, `idempotency:`) carry lengths.
Earlier versions kept the three fixed sets at `batches:active`, `webhooks:all`
and `webhooks:due`, the keys a team named `active`, `all` or `due` reads:
`gateway.store.redis.layout` moves them at start.

The shapes:

records (`RedisStore`: files, batches, ledger, backend state)
    file:{id}                 string  FileRecord JSON
    files:{owner}             zset    file ids, score created_at (ties: by id, Redis' own order)
    files:{owner}:{purpose}   zset    the same, for one purpose
    batch:{id}                hash    one field per BatchRecord field (JSON), plus the counters
    batches:{owner}           zset    batch ids, score = creation sequence
    active-batches            zset    unfinished batch ids, score = creation sequence
    batch-seq                 string  the creation sequence counter
    shards:{batch}            hash    shard index -> {"route", "size"}
    shards-done:{batch}       set     finished shard indexes
    attempts:{batch}          hash    shard index -> attempts at running it (any worker)
    file-expiry               zset    file ids with an expiry, score expires_at
    journal:{batch}:{shard}   hash    line -> Result JSON (HSETNX: one result per line)
    route-stats:{batch}       hash    "{route}:{completed|failed|input_tokens|output_tokens|cost_usd}" -> number
    sealed:{batch}            set     shard indexes whose journal was dropped (sealed): late results are ignored
    results:{batch}           stream  entry `0-{seq}` -> {"r": Result JSON}: every journaled result in order, until
                                      the batch is finalized (`GET /v1/batches/{id}/results` reads it)
    meta:{key}                string  backend state JSON
    webhook:{id}              string  WebhookDelivery JSON (expires 30 days after its last write)
    webhooks-due              zset    pending delivery ids, score = when next tried
    webhooks:{owner}          zset    one team's delivery ids, score = the add sequence (newest 1000 kept)
    webhooks-all              zset    every team's, the same way (the admin's dashboard)
    webhook-seq               string  the add sequence counter

queue (`RedisStreamQueue`): one hash slot per (route, team) queue, tagged `{q:…}`, and one per route for its
team registry, tagged `{r:…}`; on a single Redis and a cluster alike. The deployment prefix stays in front,
untagged (Redis hashes the FIRST `{…}`: a tagged prefix would put every queue back in one slot). In a tag
`%`, `{` and `}` of a name are written `%25`, `%7B`, `%7D`, so the tag ends where it should whatever a route or
team is named; the route's length makes `{q:…}` unambiguous. Below, Q = `{q:{n}:{route}:{team}}`.
    Q:stream:{batch}          stream  waiting and in-flight shards of one batch on one route
    Q:ready                   zset    the team's batch streams on the route, score = the batch's expires_at
    Q:streams                 set     the team's batch streams on the route (reclaim, counts, upkeep)
    Q:queued                  hash    shard key -> `entry id@stream` of the entry that carries it
    {r:{route}}:teams         hash    team -> its `ready` key, for every team that queued on the route
                                      (written before the team's first PUT: its own slot, not the queue's)
    A put, an ack, a refresh and a reclaim each touch one Q slot. The fair claim compares teams: it reads
    each route's registry, then each team's candidate in its own slot, and picks in Python
    (`gateway.store.redis.queue` says what that bounds).

quotas (`RedisQuotaLedger`, `RedisRates`, `RedisStorageLedger`)
    quota:{team}              hash    batch id -> requests it enqueued, for each admitted batch still counted
    quota-at                  zset    admitted batch ids, score = when (the sweep lets go of finished ones)
    quota-team                hash    admitted batch id -> its team
    quota-models:{team}       hash    batch id -> {model_name: requests} JSON (teams with per-model limits)
    spend:{team}              hash    budget period start (epoch seconds, 0: for ever) -> USD spent
                                      (moved by the ledger's record_results, with the journal)
    storage:{team}            hash    file id -> bytes, for each upload counted against the team's storage
                                      (RedisStorageLedger, gateway.store.storage)
    storage-pending:{team}    hash    file id -> when last checked, for the entries of running uploads and
                                      of files being deleted
    rate:{n}:{team}:{route}:{window}
                              hash    `requests`, `tokens` started/reported in one rate window (RedisRates;
                                      expires two windows after it starts)
    idempotency:{n}:{team}:{key}
                              hash    one team's `Idempotency-Key` (`RedisIdempotencyKeys`,
                                      gateway.store.idempotency): token, fingerprint, created_at, result
                                      JSON once done; expires when its reservation lapses, or 24 h after
                                      it was made once done (the caller's key last: any text, no ambiguity)

dashboard (`RedisDashboardSessions`)
    session:{digest}          hash    one dashboard login (gateway.store.sessions): `key_digest`, `expires_at`;
                                      keyed by the SHA-256 of the cookie's id (64 hex digits), expires with it

coordination (`RedisCoordination`, for `gateway.pipeline.sweeper`)
    worker:{name}             string  heartbeat JSON (routes, pid, host), with a TTL
    workers                   zset    worker names, score = last heartbeat
    lease:{what}              string  holder name, with a TTL (validate/finalize a batch, the sweep)
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "batchyard:"
GROUP = "workers"  # the one consumer group every worker joins, on every stream
STREAM_FIELD = "shard"  # the stream entry's field holding the shard JSON


def slot_prefix(prefix: str) -> str:
    """`prefix` as a Redis Cluster hash tag (`batchyard:` -> `{batchyard}:`): every key then hashes to one slot.

    Why one slot: the scripts read keys they find as they go (the fair pick walks every team's ready set and
    its batch streams; a batch's finish moves its record, its owner's list and the global indexes together),
    which a cluster allows only within one slot. The bound: a deployment's records and queue live on one
    master (its memory and its commands per second), as on a single Redis; the cluster adds managed
    failover and the endpoint operators have, not throughput. A prefix that already starts with a tag is kept."""
    if prefix.startswith("{") and "}" in prefix:
        return prefix
    return "{" + prefix.rstrip(":") + "}:"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    # -- records -----------------------------------------------------------------
    def file(self, file_id: str) -> str:
        return f"{self.prefix}file:{file_id}"

    def files(self, owner: str, purpose: str | None = None) -> str:
        return f"{self.prefix}files:{owner}" + (f":{purpose}" if purpose else "")

    def batch(self, batch_id: str) -> str:
        return f"{self.prefix}batch:{batch_id}"

    def batches(self, owner: str) -> str:
        return f"{self.prefix}batches:{owner}"

    @property
    def active(self) -> str:
        return f"{self.prefix}active-batches"

    @property
    def batch_seq(self) -> str:
        return f"{self.prefix}batch-seq"

    def shards(self, batch_id: str) -> str:
        return f"{self.prefix}shards:{batch_id}"

    def shards_done(self, batch_id: str) -> str:
        return f"{self.prefix}shards-done:{batch_id}"

    def attempts(self, batch_id: str) -> str:
        return f"{self.prefix}attempts:{batch_id}"

    @property
    def file_expiry(self) -> str:
        return f"{self.prefix}file-expiry"

    def journal(self, batch_id: str, index: int) -> str:
        return f"{self.prefix}journal:{batch_id}:{index}"

    def route_stats(self, batch_id: str) -> str:
        return f"{self.prefix}route-stats:{batch_id}"

    def sealed(self, batch_id: str) -> str:
        return f"{self.prefix}sealed:{batch_id}"

    def results_log(self, batch_id: str) -> str:
        return f"{self.prefix}results:{batch_id}"

    def meta(self, key: str) -> str:
        return f"{self.prefix}meta:{key}"

    def webhook(self, delivery_id: str) -> str:
        return f"{self.prefix}webhook:{delivery_id}"

    def webhooks(self, owner: str | None) -> str:
        return f"{self.prefix}webhooks-all" if owner is None else f"{self.prefix}webhooks:{owner}"

    @property
    def webhooks_due(self) -> str:
        return f"{self.prefix}webhooks-due"

    @property
    def webhook_seq(self) -> str:
        return f"{self.prefix}webhook-seq"

    # -- queue -------------------------------------------------------------------
    @staticmethod
    def _escaped(name: str) -> str:
        """`name` with no brace left: a hash tag ends at its first `}` (injective: `%` is escaped too)."""
        return name.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")

    def _queue_prefix(self) -> str:
        """The deployment prefix with no tag of its own (a `{batchyard}:` from `slot_prefix` loses its braces)."""
        p = self.prefix
        if p.startswith("{") and "}" in p:
            p = p[1:].replace("}", "", 1)
        return self._escaped(p)

    def _queue_slot(self, route: str, team: str) -> str:
        route = self._escaped(route)
        return f"{self._queue_prefix()}{{q:{len(route)}:{route}:{self._escaped(team)}}}"

    def stream(self, route: str, team: str, batch_id: str) -> str:
        return f"{self._queue_slot(route, team)}:stream:{batch_id}"

    def ready(self, route: str, team: str) -> str:
        return f"{self._queue_slot(route, team)}:ready"

    def streams(self, route: str, team: str) -> str:
        return f"{self._queue_slot(route, team)}:streams"

    def queued(self, route: str, team: str) -> str:
        return f"{self._queue_slot(route, team)}:queued"

    def teams(self, route: str) -> str:
        return f"{self._queue_prefix()}{{r:{self._escaped(route)}}}:teams"

    # -- quotas ------------------------------------------------------------------
    def quota(self, team: str) -> str:
        return f"{self.prefix}quota:{team}"

    @property
    def quota_admitted_at(self) -> str:
        return f"{self.prefix}quota-at"

    @property
    def quota_team(self) -> str:
        return f"{self.prefix}quota-team"

    def quota_models(self, team: str) -> str:
        return f"{self.prefix}quota-models:{team}"

    def spend(self, team: str) -> str:
        return f"{self.prefix}spend:{team}"

    def storage(self, team: str) -> str:
        return f"{self.prefix}storage:{team}"

    def storage_pending(self, team: str) -> str:
        return f"{self.prefix}storage-pending:{team}"

    def rate(self, team: str, route: str, window: int) -> str:
        return f"{self.prefix}rate:{len(team)}:{team}:{route}:{window}"

    def idempotency(self, team: str, key: str) -> str:
        return f"{self.prefix}idempotency:{len(team)}:{team}:{key}"

    def session(self, name: str) -> str:
        return f"{self.prefix}session:{name}"

    # -- upkeep ------------------------------------------------------------------
    def worker(self, name: str) -> str:
        return f"{self.prefix}worker:{name}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}workers"

    def lease(self, what: str) -> str:
        return f"{self.prefix}lease:{what}"


__all__ = ["DEFAULT_PREFIX", "GROUP", "STREAM_FIELD", "Keys", "slot_prefix"]
