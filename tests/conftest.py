"""Fixtures several test files share: each starts a real server, once per test module that asks for it."""

from __future__ import annotations

import signal
import warnings
from collections.abc import Iterator

import pytest

from gateway.runtime.pool import declare_native_providers
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.services import SERVER_BINARIES, MotoS3, RedisClusterServers, RedisServer, need_server

declare_native_providers()  # the tests read configs as the command line does: with the native providers declared


def _ctrl_c_lost() -> str | None:
    """How this process has lost Ctrl-C, if it has: ignored or blocked SIGINT is inherited across fork and exec."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return "ignored"
    return "blocked" if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set()) else None


def _give_back_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture(autouse=True)
def default_ctrl_c(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts with Ctrl-C as a user's shell gives it. A test that leaves SIGINT ignored or blocked in
    the pytest worker makes every command a later test starts there ignore Ctrl-C (the Ctrl-C tests of `run`
    and `submit` then see their command run to its end): it is put back, and the test is named in a warning."""
    if _ctrl_c_lost() is not None:
        _give_back_ctrl_c()
    yield
    lost = _ctrl_c_lost()
    if lost is not None:
        warnings.warn(f"{request.node.nodeid} left SIGINT {lost} in the test process; put back", stacklevel=1)
        _give_back_ctrl_c()


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
