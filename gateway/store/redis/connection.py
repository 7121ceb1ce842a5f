"""Connecting to the shared Redis: plain or TLS, with an ACL user, riding out a restart or a managed failover.

The URL is redis-py's: `redis://[user:password@]host:port/0`, or `rediss://…` for TLS with the system's
CAs, or a CA file given as the URL's `ssl_ca_certs=/path` query or `--redis-ca-file`. Where a flag would
show a password to `ps`, `BATCHYARD_REDIS_URL` holds the URL instead (`gateway.cli.main`). Database 0 only
in a cluster (`gateway.store.redis.preflight` says why at start).

A failover (a managed primary replaced, a Redis restarted) looks to a client like refused or reset
connections, then a replica that answers READONLY or a server still LOADING, for up to ~30 s: each is
retried on a new connection with backoff, so a command in flight waits instead of failing.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import BusyLoadingError, NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.errors import ConfigError
from gateway.store.redis.keys import DEFAULT_PREFIX, Keys

# How a command is tried again on a lost connection. A worker: 30 times with backoff (0.05 s, doubling, at
# most 1 s: ~25 s in all, plus each try's connect timeout), riding out a Redis restart; beyond that the shard
# runner's fault pause takes over (gateway.store.faults), which also covers a managed failover of ~30 s. 30 as
# before this stop: with 40, the unreachable-past-claim-idle case of tests/servers/test_faults_redis.py once
# sealed a shard short of a result. An API replica: once, at once, so a stale connection is replaced while a
# Redis that is gone answers 503 in milliseconds instead of holding every request; the SDKs retry a 503
# themselves, and the openai SDK's POSTs carry an Idempotency-Key, which create honours.
WORKER_RETRIES = 30
API_RETRIES = 1
# The errors of a failover: the old primary gone (connection, timeout), its replica not promoted yet
# (READONLY), and, in a cluster, a node still LOADING its data. Each drops the connection and tries a new
# one. One server still LOADING (restarted from its AOF) is left to the runner's fault pause
# (gateway.store.faults): retried in place here, a shard was sealed short of a result about once
# in six runs (tests/servers/test_faults_redis.py), while the cluster's failover test needs the retry.
FAILOVER_ERRORS: list[type[Exception]] = [RedisConnectionError, RedisTimeoutError, ReadOnlyError]
CLUSTER_FAILOVER_ERRORS: list[type[Exception]] = [*FAILOVER_ERRORS, BusyLoadingError]
CONNECT_TIMEOUT = 5.0  # seconds to open a connection: an address that black-holes during a failover is retried
COMMAND_TIMEOUT = 10.0


class _Script(AsyncScript):
    """redis-py's script, loaded again when Redis forgot it more than once in one call.

    redis-py loads a script again on NOSCRIPT and calls it once more; a Redis that restarts (its script
    cache is empty) around that second call answered NOSCRIPT again, and the caller met the error."""

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        for _ in range(3):
            with contextlib.suppress(NoScriptError):
                return await super().__call__(keys, args, client)
        return await super().__call__(keys, args, client)


class _Redis(aioredis.Redis):
    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]  # the async one
        return _Script(self, script)


def _without_keys(callback: Callable[..., Any]) -> Callable[..., Any]:
    def parse(response: Any, **options: Any) -> Any:
        options.pop("keys", None)
        return callback(response, **options)

    return parse


_LOST = re.compile(r"closed=True|'NoneType' object has no attribute '(write|writelines|read|drain)")


class _RedisCluster(RedisCluster):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # redis-py 8.1's transaction pipeline hands each reply's parser the command's `keys` too, which most
        # parsers (HGETALL's, SMEMBERS', ...) do not take; the dict is the nodes' too: changed in place
        for name, callback in list(self.response_callbacks.items()):
            self.response_callbacks[name] = _without_keys(callback)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (RuntimeError, AttributeError) as exc:
            # A node killed mid-command: redis-py 8.1's cluster client, refreshing its view of the nodes,
            # closes the connections of the dead one while commands still use them, and those commands end
            # with asyncio's "unable to perform operation on <TCPTransport closed=True>" or "'NoneType' object
            # has no attribute 'writelines'" (the writer gone). Either is a lost connection (a fault of the
            # machine: the runner pauses and hands its shard back), not a bug of the work.
            if not _LOST.search(str(exc)):
                raise
            raise RedisConnectionError(f"connection to a cluster node lost: {exc}") from exc

    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]  # the async one
        return _Script(self, script)  # type: ignore[arg-type]  # AsyncScript calls evalsha: the cluster has it


async def get_many(client: Any, names: Sequence[str]) -> list[Any]:
    """GET of each name, in one round trip per node: the names are in many slots (MGET takes one slot's)."""
    if not names:
        return []
    async with client.pipeline(transaction=False) as p:
        for name in names:
            p.get(name)
        return list(await p.execute())


def as_text(value: Any) -> str:
    """A reply value as text: clients made without `decode_responses` answer bytes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def retry_policy(retries: int) -> Retry:
    """`retries`: how patient (1: once, at once)."""
    return Retry(ExponentialBackoff(cap=1.0, base=0.05) if retries > 1 else NoBackoff(), retries=retries)


def tls_options(url: str, ca_file: str | None) -> dict[str, Any]:
    """The client's TLS keywords for `--redis-ca-file` (the URL's own `ssl_ca_certs=` needs none)."""
    if ca_file is None:
        return {}
    if not url.startswith("rediss://"):
        raise ConfigError("command line", "--redis-ca-file", "needs a rediss:// URL (TLS); this one is not")
    return {"ssl_ca_certs": ca_file}


def _options(url: str, retries: int, ca_file: str | None, *, cluster: bool = False) -> dict[str, Any]:
    errors = CLUSTER_FAILOVER_ERRORS if cluster else FAILOVER_ERRORS
    return {"decode_responses": True, "retry": retry_policy(retries), "retry_on_error": list(errors),
            "socket_timeout": COMMAND_TIMEOUT, "socket_connect_timeout": CONNECT_TIMEOUT,
            **tls_options(url, ca_file)}


def connect_redis(url: str, retries: int = WORKER_RETRIES, *, ca_file: str | None = None) -> aioredis.Redis:
    """A client of one Redis server that rides out a restart or a failover (see the module's docstring)."""
    return _Redis.from_url(url, health_check_interval=15, **_options(url, retries, ca_file))


async def open_redis(url: str, retries: int = WORKER_RETRIES, *, ca_file: str | None = None,
                     prefix: str | None = None) -> tuple[aioredis.Redis, Keys]:
    """A client of the Redis at `url`, one server or a cluster (`INFO cluster`'s `cluster_enabled`), and the
    key names it uses: the same on both (`gateway.store.redis.keys`: hash tags per batch, per team and per
    queue keep every script and transaction in one slot). The cluster client answers the commands the store,
    queue and coordination send as the plain one does (it routes each by its key)."""
    plain = connect_redis(url, retries, ca_file=ca_file)
    db = int(plain.connection_pool.connection_kwargs.get("db") or 0)
    try:
        info = await plain.info("cluster")
    except ResponseError as exc:  # the connection's SELECT of a database other than 0, on a cluster node
        await plain.aclose()
        if "cluster mode" not in str(exc):
            raise
        raise ConfigError("command line", "--redis-url", f"a Redis Cluster has database 0 only, not {db}") from None
    except BaseException:
        await plain.aclose()
        raise
    if int(info.get("cluster_enabled", 0)) != 1:
        return plain, Keys(prefix or DEFAULT_PREFIX)
    await plain.aclose()
    cluster = _RedisCluster.from_url(url, **_options(url, retries, ca_file, cluster=True))
    await cluster.initialize()
    return cast(aioredis.Redis, cluster), Keys(prefix or DEFAULT_PREFIX)


__all__ = ["API_RETRIES", "FAILOVER_ERRORS", "WORKER_RETRIES", "as_text", "connect_redis", "get_many", "open_redis",
           "retry_policy", "tls_options"]
