"""Every Redis key batchyard uses, in one place (as arq does).

All keys start with a prefix (default `batchyard:`) so one Redis can hold several deployments. The prefix is
plain text (no `{` or `}`: Redis hashes the FIRST `{...}` of a name). One layout on a single Redis and on a
Redis Cluster: a key that a script or MULTI touches together with others carries a hash tag right after the
prefix, so every multi-key step stays in one slot, and a deployment's keys spread over every master:

- a batch's keys: `{b:<batch id>}` (`Keys.batch_tag`): its record, shards, journal, stats, result log, and
  the spend it owes its team;
- a team's ledgers and indexes: `{t:<team>}` (`Keys.team_tag`): its file and batch lists, quota, spend,
  storage, rate windows, idempotency keys, webhook list; so the quota, rate and budget rules stay one atomic
  step per team (one script in the team's slot);
- records looked up by id alone (`file:`, `webhook:`, `session:`, `worker:`, `lease:`) and the few global
  indexes (`active-batches`, `file-expiry`, `webhooks-due`, `creating:…`, ...) are single keys, each in its
  own slot: no script or MULTI touches one of them together with any other key. Where a record and an index change
  together, the store writes them in ordered single-slot steps whose every prefix leaves a state the readers
  tolerate (see each module: an index names ids, and the records say whether and whose they are).

A tag's name is the batch or team id as is; one with `{`, `}` or a leading `~` (never ours, nor a configured
team's: `gateway.config.sections.TEAM_ID_PATTERN`) is written `~` + its UTF-8 in hex, so a tag always ends
where its id does and two ids never share one. After the tag, names are unambiguous: a family name, then at
most one free-form part last (a purpose, a route before a numeric window, a caller's idempotency key).

The previous layout (every key untagged, `batchyard:batch:{id}`, or on a cluster all under one tag,
`{batchyard}:…`) is renamed at start by `gateway.store.redis.migration` (the marker `layout` = "2").

The shapes (`{b}`: the batch's tag, `{t}`: the team's, after the prefix):

records (`RedisStore`: files, batches, ledger, backend state)
    file:{id}                 string  FileRecord JSON
    {t}:files                 zset    the team's file ids, score created_at (ties: by id, Redis' own order)
    {t}:files:{purpose}       zset    the same, for one purpose
    {b}:batch                 hash    one field per BatchRecord field (JSON), plus the counters
    {t}:batches               zset    the team's batch ids, score = creation sequence
    active-batches            zset    unfinished batch ids, score = creation sequence
    batch-seq                 string  the creation sequence counter
    creating:{kind}           zset    creates under way, `batches` or `files`: member = JSON [id, owner(,
                                      purpose), token], score = when begun; let go of once the record is
                                      written (`gateway.store.redis.creates`: the sweep removes the index
                                      entries of one older than 10 minutes whose record is missing)
    {b}:shards                hash    shard index -> {"route", "size"}
    {b}:shards-done           set     finished shard indexes
    {b}:attempts              hash    shard index -> attempts at running it (any worker)
    file-expiry               zset    file ids with an expiry, score expires_at
    {b}:journal:{shard}       hash    line -> Result JSON (HSETNX: one result per line)
    {b}:route-stats           hash    "{route}:{completed|failed|input_tokens|output_tokens|cost_usd}" -> number
    {b}:sealed                set     shard indexes whose journal was dropped (sealed): late results are ignored
    {b}:results               stream  entry `0-{seq}` -> {"r": Result JSON}: every journaled result in order, until
                                      the batch is finalized (`GET /v1/batches/{id}/results` reads it)
    {b}:spend-owed            hash    "{team}:{budget period}" -> USD the batch's journaled results cost, ever
                                      (moved to the team's `spend` by `gateway.store.redis.spend`; deleted
                                      once the finalizer settles the batch)
    meta:{key}                string  backend state JSON
    webhook:{id}              string  WebhookDelivery JSON (expires 30 days after its last write)
    webhooks-due              zset    pending delivery ids, score = when next tried
    {t}:webhooks              zset    one team's delivery ids, score = the add sequence (newest 1000 kept)
    webhooks-all              zset    every team's, the same way (the admin's dashboard)
    webhook-seq               string  the add sequence counter
    layout                    string  "2": the key layout this Redis holds (`gateway.store.redis.migration`)

queue (`RedisStreamQueue`): one hash slot per (route, team) queue, tagged `{q:…}`, and one per route for its
team registry, tagged `{r:…}`; on a single Redis and a cluster alike. A name goes into a tag as the batch and
team tags' do (`_tag_name`: as is, or `~` + hex where it holds a brace), so the tag ends where it should
whatever a route or team is named; the route's length makes `{q:…}` unambiguous. Below,
Q = `{q:{n}:{route}:{team}}`.
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
    {t}:quota                 hash    batch id -> requests it enqueued, for each admitted batch still counted
    quota-at                  zset    admitted batch ids, score = when (the sweep lets go of finished ones)
    quota-team                hash    admitted batch id -> its team
    {t}:quota-models          hash    batch id -> {model_name: requests} JSON (teams with per-model limits)
    {t}:spend                 hash    budget period start (epoch seconds, 0: for ever) -> USD spent
    {t}:spend-moved           hash    "{batch}:{period}" -> USD of that batch's `spend-owed` already in `spend`;
                                      a batch's fields go when it is settled (`gateway.store.redis.spend`)
    {t}:spend-settled:{batch} string  "1": the batch's spend is settled, later moves do nothing (expires a day
                                      after the settle)
    {t}:reserved              hash    holder ("{batch}/{shard}/{line}/": a native provider job) -> USD reserved of
                                      the budget until its results are in `spend` (gateway.store.quota)
    {t}:storage               hash    file id -> bytes, for each upload counted against the team's storage
                                      (RedisStorageLedger, gateway.store.storage)
    {t}:storage-pending       hash    file id -> when last checked, for the entries of running uploads and
                                      of files being deleted
    {t}:rate:{route}:{window} hash    `requests`, `tokens` started/reported in one rate window (RedisRates;
                                      expires two windows after it starts)
    {t}:idempotency:{key}     hash    one team's `Idempotency-Key` (`RedisIdempotencyKeys`,
                                      gateway.store.idempotency): token, fingerprint, created_at, result
                                      JSON once done; expires when its reservation lapses, or 24 h after
                                      it was made once done (the caller's key last: any text, no ambiguity)

dashboard (`RedisDashboardSessions`)
    session:{digest}          hash    one dashboard login (gateway.store.sessions): `key_digest`, `expires_at`;
                                      keyed by the SHA-256 of the cookie's id (64 hex digits), expires with it

coordination (`RedisCoordination`, for `gateway.pipeline.sweeper`)
    worker:{name}             string  heartbeat JSON (routes, pid, host), with a TTL
    workers                   zset    worker names, score = last heartbeat
    lease:{what}              string  holder name, with a TTL (validate/finalize a batch, the sweep, the migration)
    concurrency:{route}       string  a background route's shared concurrency (JSON), with a TTL
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "batchyard:"
GROUP = "workers"  # the one consumer group every worker joins, on every stream
STREAM_FIELD = "shard"  # the stream entry's field holding the shard JSON


def _tag_name(name: str) -> str:
    """`name` as it goes between a tag's braces: as is, or `~` + hex where it could end or fake a tag."""
    if "{" in name or "}" in name or name.startswith("~"):
        return "~" + name.encode().hex()
    return name


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if "{" in self.prefix or "}" in self.prefix:  # its tag would win over every key's own
            raise ValueError(f"a Redis key prefix may not hold '{{' or '}}': {self.prefix!r}")

    # -- hash tags -------------------------------------------------------------------
    def batch_tag(self, batch_id: str) -> str:
        """`{prefix}{b:<id>}`: every key of one batch, in one slot."""
        return f"{self.prefix}{{b:{_tag_name(batch_id)}}}"

    def team_tag(self, team: str) -> str:
        """`{prefix}{t:<team>}`: every ledger and index of one team, in one slot."""
        return f"{self.prefix}{{t:{_tag_name(team)}}}"

    # -- records -----------------------------------------------------------------
    def file(self, file_id: str) -> str:
        return f"{self.prefix}file:{file_id}"

    def files(self, owner: str, purpose: str | None = None) -> str:
        return f"{self.team_tag(owner)}:files" + (f":{purpose}" if purpose else "")

    def batch(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:batch"

    def batches(self, owner: str) -> str:
        return f"{self.team_tag(owner)}:batches"

    @property
    def active(self) -> str:
        return f"{self.prefix}active-batches"

    def creating(self, kind: str) -> str:
        return f"{self.prefix}creating:{kind}"

    @property
    def batch_seq(self) -> str:
        return f"{self.prefix}batch-seq"

    def shards(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:shards"

    def shards_done(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:shards-done"

    def attempts(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:attempts"

    @property
    def file_expiry(self) -> str:
        return f"{self.prefix}file-expiry"

    def journal(self, batch_id: str, index: int) -> str:
        return f"{self.batch_tag(batch_id)}:journal:{index}"

    def route_stats(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:route-stats"

    def sealed(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:sealed"

    def results_log(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:results"

    def results_seq(self, batch_id: str) -> str:
        """The last seq the batch's result log gave (its entries leave it as their shards are sealed)."""
        return f"{self.batch_tag(batch_id)}:results-seq"

    def sealed_seqs(self, batch_id: str) -> str:
        """Each sealed shard's span of seqs ("first last"): its results are in its results blob."""
        return f"{self.batch_tag(batch_id)}:sealed-seqs"

    def spend_owed(self, batch_id: str) -> str:
        return f"{self.batch_tag(batch_id)}:spend-owed"

    def meta(self, key: str) -> str:
        return f"{self.prefix}meta:{key}"

    def webhook(self, delivery_id: str) -> str:
        return f"{self.prefix}webhook:{delivery_id}"

    def webhooks(self, owner: str | None) -> str:
        return f"{self.prefix}webhooks-all" if owner is None else f"{self.team_tag(owner)}:webhooks"

    @property
    def webhooks_due(self) -> str:
        return f"{self.prefix}webhooks-due"

    @property
    def webhook_seq(self) -> str:
        return f"{self.prefix}webhook-seq"

    @property
    def layout(self) -> str:
        return f"{self.prefix}layout"

    # -- queue -------------------------------------------------------------------
    def _queue_slot(self, route: str, team: str) -> str:
        """`{prefix}{q:<len>:<route>:<team>}`: one (route, team) queue in one slot (the length keeps it
        unambiguous, `_tag_name` well-formed, whatever a route or team is named)."""
        route = _tag_name(route)
        return f"{self.prefix}{{q:{len(route)}:{route}:{_tag_name(team)}}}"

    def stream(self, route: str, team: str, batch_id: str) -> str:
        return f"{self._queue_slot(route, team)}:stream:{batch_id}"

    def ready(self, route: str, team: str) -> str:
        return f"{self._queue_slot(route, team)}:ready"

    def streams(self, route: str, team: str) -> str:
        return f"{self._queue_slot(route, team)}:streams"

    def queued(self, route: str, team: str) -> str:
        return f"{self._queue_slot(route, team)}:queued"

    def teams(self, route: str) -> str:
        return f"{self.prefix}{{r:{_tag_name(route)}}}:teams"

    # -- quotas ------------------------------------------------------------------
    def quota(self, team: str) -> str:
        return f"{self.team_tag(team)}:quota"

    @property
    def quota_admitted_at(self) -> str:
        return f"{self.prefix}quota-at"

    @property
    def quota_team(self) -> str:
        return f"{self.prefix}quota-team"

    def quota_models(self, team: str) -> str:
        return f"{self.team_tag(team)}:quota-models"

    def spend(self, team: str) -> str:
        return f"{self.team_tag(team)}:spend"

    def reserved(self, team: str) -> str:
        return f"{self.team_tag(team)}:reserved"

    def spend_moved(self, team: str) -> str:
        return f"{self.team_tag(team)}:spend-moved"

    def spend_settled(self, team: str, batch_id: str) -> str:
        return f"{self.team_tag(team)}:spend-settled:{batch_id}"

    def storage(self, team: str) -> str:
        return f"{self.team_tag(team)}:storage"

    def storage_pending(self, team: str) -> str:
        return f"{self.team_tag(team)}:storage-pending"

    def rate(self, team: str, route: str, window: int) -> str:
        return f"{self.team_tag(team)}:rate:{route}:{window}"

    def idempotency(self, team: str, key: str) -> str:
        return f"{self.team_tag(team)}:idempotency:{key}"

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

    def concurrency(self, route: str) -> str:
        return f"{self.prefix}concurrency:{route}"


__all__ = ["DEFAULT_PREFIX", "GROUP", "STREAM_FIELD", "Keys"]
