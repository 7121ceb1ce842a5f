"""Fixtures several test files share: each starts a real server, once per test module that asks for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.services import MotoS3, RedisClusterServers, RedisServer


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


@pytest.fixture(scope="module", params=["redis-server", "cluster"])
def any_redis(request: pytest.FixtureRequest) -> Iterator[RedisServer | RedisClusterServers]:
    """One redis-server, then a 3-master Redis Cluster (`url` names one node, as a managed endpoint does):
    a test that takes it runs on both."""
    server = RedisServer() if request.param == "redis-server" else RedisClusterServers(3)
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """moto's S3 server on a free loopback port."""
    server = MotoS3().start()
    yield server
    server.close()
