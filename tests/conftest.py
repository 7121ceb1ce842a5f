"""Fixtures several test files share: each starts a real server, once per test module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.runtime.pool import declare_native_providers
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.services import SERVER_BINARIES, MotoS3, RedisClusterServers, RedisServer, need_server

declare_native_providers()  # the tests read configs as the command line does: with the native providers declared


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    """The loopback OpenAI/Azure stand-in, any key accepted (a module that needs another one defines its own)."""
    with start_upstream() as server:
        yield server


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the module's own on a free loopback port (the files that use it skip without one)."""
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture(scope="module", params=SERVER_BINARIES)
def server_binary(request: pytest.FixtureRequest) -> str:
    """`redis-server`, then `valkey-server`: a test whose servers are started with it runs on both (the
    Valkey run skips where it is not installed, and fails in CI: `need_server`)."""
    need_server(request.param)
    return str(request.param)


@pytest.fixture(scope="module", params=["redis-server", "cluster", "valkey-server"])
def any_redis(request: pytest.FixtureRequest) -> Iterator[RedisServer | RedisClusterServers]:
    """One redis-server, a 3-master Redis Cluster (`url` names one node, as a managed endpoint does), then
    one valkey-server: a test that takes it runs on each. (A Valkey cluster: tests/servers/test_redis_cluster.py.)"""
    if request.param == "cluster":
        server: RedisServer | RedisClusterServers = RedisClusterServers(3)
    else:
        need_server(request.param)
        server = RedisServer(binary=request.param)
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """moto's S3 server on a free loopback port."""
    server = MotoS3().start()
    yield server
    server.close()
