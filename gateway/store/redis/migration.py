"""At shared-mode start: a Redis written by the previous version gets the key layout of hash slots
(`gateway.store.redis.keys`), once.

The previous layout named every key `{prefix}{family}:{ids}` (`batchyard:batch:<id>`, `batchyard:spend:<team>`),
untagged on one Redis and all under one tag on a cluster (`{batchyard}:…`, one slot). Now a batch's keys carry
`{b:<id>}` and a team's `{t:<team>}`. The marker `{prefix}layout` = "2" says a Redis has the new layout; while
it is missing, the first process to start (under the lease `lease:layout`; the others wait for the marker):

1. merges the oldest version's fixed sets (`batches:active`, ...) into their own keys first, while their old names
   still hold them (`gateway.store.redis.migrate_global_sets`);
2. walks the previous layout's keys once: on one Redis `SCAN MATCH {prefix}*` (one node, one time: the only
   keyspace walk batchyard makes), on a cluster `SCAN` of the one master that holds the old tag's slot;
3. gives each key its new name by family (`new_name`): a batch's and a team's keys move into their slots, a
   record looked up by id and the global indexes keep their names (on a cluster they lose the old tag);
   RENAME on one Redis (atomic, keeps the TTL), DUMP + RESTORE (with the TTL) + DEL on a cluster, where a
   RENAME cannot cross slots;
4. DELETES the old queue keys (`stream:`, `ready:`, `teams:`, `streams:`, `queued`): the sweeper's recovery
   (an unfinished shard missing from the queue is enqueued again) rebuilds the queue in its new keys;
5. sets the marker and logs one line with how many keys moved.

Idempotent: a crash part-way leaves some keys under old names and some under new; the next start walks what
is left (a new name is never the old shape: it holds a `{` right after the prefix, or keeps its name), and a
RESTORE that had already run is replaced with the same value.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from redis.exceptions import ResponseError

from gateway.store.redis.keys import Keys
from gateway.store.redis.migrate_global_sets import upgrade_key_layout

log = logging.getLogger("batchyard.redis")

LAYOUT = "2"
LEASE_MS = 60_000  # renewed as the walk goes: a process that dies mid-way lets another take over in a minute
_QUEUE_FAMILIES = {"stream", "ready", "teams", "streams"}
_BATCH_FAMILIES = {"batch", "shards", "shards-done", "attempts", "route-stats", "sealed", "results"}
_TEAM_FAMILIES = {"batches", "webhooks", "quota", "quota-models", "spend", "storage", "storage-pending"}
_DROP = ""  # `new_name`'s answer for a key that goes


def old_cluster_prefix(prefix: str) -> str:
    """The previous version's prefix on a cluster: the whole prefix as one hash tag (`{batchyard}:`)."""
    return "{" + prefix.rstrip(":") + "}:"


def new_name(rest: str, keys: Keys) -> str:
    """The new name of the previous layout's key `{old prefix}{rest}`, or "" for an old queue key (dropped).
    Names not in the previous table (and the fixed ones) keep `rest` under the new prefix."""
    family, _, tail = rest.partition(":")
    if family in _QUEUE_FAMILIES or rest == "queued":
        return _DROP
    if tail:
        if family in _BATCH_FAMILIES:
            return f"{keys.batch_tag(tail)}:{family}"
        if family == "journal":  # journal:{batch}:{shard}
            batch, _, shard = tail.rpartition(":")
            return f"{keys.batch_tag(batch)}:journal:{shard}"
        if family in _TEAM_FAMILIES:
            return f"{keys.team_tag(tail)}:{family}"
        if family == "files":  # files:{owner}[:{purpose}] (a team id holds no `:`)
            owner, _, purpose = tail.partition(":")
            return keys.files(owner, purpose or None)
        if family in ("rate", "idempotency"):  # {n}:{team}:{rest}: the team's length first
            n, _, after = tail.partition(":")
            if n.isdigit() and len(after) > int(n) and after[int(n)] == ":":
                return f"{keys.team_tag(after[:int(n)])}:{family}:{after[int(n) + 1:]}"
    return keys.prefix + rest


async def migrate_layout(client: Any, keys: Keys, *, limit: int | None = None) -> int:
    """Bring the Redis behind `client` to the layout of `keys` (see the module's docstring); returns how many
    keys were moved or dropped by this call. `limit`: stop after that many (the marker stays unset, as if the
    process had died there: the next call finishes)."""
    if await client.get(keys.layout) == LAYOUT:
        return 0
    holder, lease = secrets.token_hex(8), keys.lease("layout")
    while not await client.set(lease, holder, nx=True, px=LEASE_MS):
        await asyncio.sleep(0.2)  # another process migrates: wait for its marker (or its lease to lapse)
        if await client.get(keys.layout) == LAYOUT:
            return 0
    try:
        if await client.get(keys.layout) == LAYOUT:
            return 0
        cluster = hasattr(client, "get_node_from_key")  # redis-py's cluster client
        old = old_cluster_prefix(keys.prefix) if cluster else keys.prefix
        await upgrade_key_layout(client, old)
        moved, dropped, done = await _walk(client, keys, old, cluster=cluster, lease=(lease, holder), limit=limit)
        if not done:
            return moved + dropped
        await client.set(keys.layout, LAYOUT)
        if moved or dropped:
            log.info("redis key layout %s: moved %d key(s) to their new names (hash slots per batch and per team), "
                     "dropped %d old queue key(s) (the sweeper queues their unfinished shards again)",
                     LAYOUT, moved, dropped)
        return moved + dropped
    finally:
        if await client.get(lease) == holder:
            await client.delete(lease)


async def _walk(client: Any, keys: Keys, old: str, *, cluster: bool, lease: tuple[str, str],
                limit: int | None) -> tuple[int, int, bool]:
    """Move or drop each key of the previous layout; (moved, dropped, finished)."""
    node: dict[str, Any] = {"target_nodes": client.get_node_from_key(old + "x")} if cluster else {}
    pattern = _glob_escape(old) + "*"
    moved = dropped = 0
    cursor: int | str = 0
    while True:
        cursor, names = await _scan(client, cursor, pattern, node)
        for name in names:
            target = new_name(name[len(old):], keys)
            if target == name:  # a name both layouts share, or one the new layout wrote (`{…}` after the prefix)
                continue
            if limit is not None and moved + dropped >= limit:
                return moved, dropped, False
            if target == _DROP:
                dropped += await client.delete(name)
            elif await _move(client, name, target, cluster=cluster):
                moved += 1
            if (moved + dropped) % 500 == 0:
                await client.pexpire(lease[0], LEASE_MS)
        if int(cursor) == 0:
            return moved, dropped, True


async def _scan(client: Any, cursor: int | str, pattern: str, node: dict[str, Any]) -> tuple[int | str, list[str]]:
    if not node:
        found, names = await client.scan(cursor, match=pattern, count=1000)
        return found, [str(n) for n in names]
    found, names = await client.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000, **node)
    if isinstance(found, dict):  # redis-py's cluster client answers the cursor per node asked: one here
        found = next(iter(found.values()))
    return int(found), [n.decode() if isinstance(n, bytes) else str(n) for n in names]


async def _move(client: Any, name: str, target: str, *, cluster: bool) -> bool:
    """One key to its new name (False: it was gone, expired meanwhile)."""
    if not cluster:
        try:
            await client.rename(name, target)
        except ResponseError as exc:  # "no such key": it expired meanwhile, nothing to move
            if "no such key" not in str(exc).lower():
                raise
            return False
        return True
    dumped, ttl = await client.dump(name), await client.pttl(name)
    if dumped is None:
        return False
    await client.restore(target, max(int(ttl), 0), dumped, replace=True)
    await client.delete(name)
    return True


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


__all__ = ["LAYOUT", "migrate_layout", "new_name", "old_cluster_prefix"]
