"""Every Redis key batchyard uses, in one place (as arq does).

All keys start with a prefix (default `batchyard:`) so one Redis can hold
several deployments. The shapes:

records (`RedisStore`)
    file:{id}                 string  FileRecord JSON
    files:{owner}             zset    file ids, score created_at (ties: by id, Redis' own order)
    files:{owner}:{purpose}   zset    the same, for one purpose
    batch:{id}                hash    one field per BatchRecord field (JSON), plus the counters
    batches:{owner}           zset    batch ids, score = creation sequence
    batches:active            zset    unfinished batch ids, score = creation sequence
    batch-seq                 string  the creation sequence counter
    shards:{batch}            hash    shard index -> {"route", "size"}
    shards-done:{batch}       set     finished shard indexes
    attempts:{batch}          hash    shard index -> attempts at running it (any worker)
    file-expiry               zset    file ids with an expiry, score expires_at
    journal:{batch}:{shard}   hash    line -> Result JSON (HSETNX: one result per line)
    route-stats:{batch}       hash    "{route}:{completed|failed|input_tokens|output_tokens|cost_usd}" -> number
    sealed:{batch}            set     shard indexes whose journal was dropped (sealed): late results are ignored
    meta:{key}                string  backend state JSON

queue (`RedisStreamQueue`)
    stream:{route}            stream  waiting and in-flight shards of one route
    queued                    hash    shard key -> the stream entry that carries it

coordination (`RedisCoordination`, for `gateway.pipeline.coordinator`)
    worker:{name}             string  heartbeat JSON (routes, pid, host), with a TTL
    workers                   zset    worker names, score = last heartbeat
    lease:{what}              string  holder name, with a TTL (validate/finalize a batch, the sweep)
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "batchyard:"
GROUP = "workers"  # the one consumer group every worker joins, on every stream
STREAM_FIELD = "shard"  # the stream entry's field holding the shard JSON


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
        return f"{self.prefix}batches:active"

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

    def meta(self, key: str) -> str:
        return f"{self.prefix}meta:{key}"

    # -- queue -------------------------------------------------------------------
    def stream(self, route: str) -> str:
        return f"{self.prefix}stream:{route}"

    def route_of(self, stream: str) -> str:
        return stream.removeprefix(f"{self.prefix}stream:")

    @property
    def stream_pattern(self) -> str:
        return f"{self.prefix}stream:*"

    @property
    def queued(self) -> str:
        return f"{self.prefix}queued"

    # -- upkeep ------------------------------------------------------------------
    def worker(self, name: str) -> str:
        return f"{self.prefix}worker:{name}"

    @property
    def workers(self) -> str:
        return f"{self.prefix}workers"

    def lease(self, what: str) -> str:
        return f"{self.prefix}lease:{what}"


__all__ = ["DEFAULT_PREFIX", "GROUP", "STREAM_FIELD", "Keys"]
