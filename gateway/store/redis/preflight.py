"""At start: is this Redis one that keeps what batchyard writes?

- A `maxmemory-policy` other than `noeviction` (a cache's usual `allkeys-lru`) lets Redis drop any key under
  memory pressure: a batch record, a shard's journal, a team's spend. Such a Redis is refused, in one line
  that says what to set, unless the operator insists (`--allow-evicting-redis`; then a warning). The policy
  is read from `INFO memory`, since managed services disable `CONFIG GET`.
- Persistence off (no AOF and no RDB snapshot rules) means a Redis restart loses every batch: a warning at
  start and on `/health` (the admin's details), not an error (a replicated managed Redis may not need it).
  `INFO persistence` tells whether AOF is on; the RDB rules only `CONFIG GET save` tells, where allowed.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ResponseError

from gateway.errors import ConfigError
from gateway.store.redis.keys import Keys

log = logging.getLogger("batchyard.redis")


class EvictingRedis(ConfigError):
    """A Redis that may evict our keys: refused at start (exit 2, one line)."""

    def __init__(self, policy: str) -> None:
        super().__init__("command line", "--redis-url", (
            f"this Redis has maxmemory-policy {policy}: under memory pressure it drops any key (a batch, a "
            "shard's journal, a team's spend); set maxmemory-policy noeviction (on a managed service: its "
            "parameter group or configuration), or pass --allow-evicting-redis to run anyway"))


async def check_server(client: Any, keys: Keys, *, allow_evicting: bool = False) -> list[str]:
    """Raise `EvictingRedis` for a Redis that may evict (unless `allow_evicting`); the warnings to show.

    In a cluster, every master is asked (the keys spread over every slot: `gateway.store.redis.keys`)."""
    nodes: list[dict[str, Any]] = [{}]
    if hasattr(client, "get_primaries"):  # redis-py's cluster client
        nodes = [{"target_nodes": node} for node in client.get_primaries()]
    warnings: list[str] = []
    policies = [str((await client.info("memory", **where)).get("maxmemory_policy", "noeviction")) for where in nodes]
    policy = next((p for p in policies if p != "noeviction"), "noeviction")
    if policy != "noeviction":
        if not allow_evicting:
            raise EvictingRedis(policy)
        warnings.append(f"Redis maxmemory-policy is {policy} (--allow-evicting-redis): under memory pressure "
                        "it may drop batches, journals and spend; set noeviction")
    if any([await persistence_off(client, where) for where in nodes]):
        warnings.append("Redis persistence is off (no AOF, no RDB snapshots): a Redis restart loses every "
                        "batch; set appendonly yes (or save rules), or rely on a replicated managed Redis")
    for warning in warnings:
        log.warning("%s", warning)
    return warnings


async def persistence_off(client: Any, where: dict[str, Any]) -> bool:
    """True only where Redis says so: AOF off and no `save` rule (False where `CONFIG GET` is disabled)."""
    if int((await client.info("persistence", **where)).get("aof_enabled", 1)):
        return False
    try:
        rules = await client.config_get("save", **where)
    except ResponseError:  # managed services rename or disable CONFIG: unknown, so no warning
        return False
    return not str(rules.get("save", "x")).strip()


__all__ = ["EvictingRedis", "check_server", "persistence_off"]
