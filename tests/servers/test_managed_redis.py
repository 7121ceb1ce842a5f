"""Shared mode on the Redis an operator gets from a platform: a cache's eviction policy, TLS, an ACL user.

Real servers on loopback, started here: each test runs on `redis-server`, then on `valkey-server` (the
`server_binary` fixture: skipped where Valkey is not installed, a failure in CI):
- `maxmemory 64mb`, `maxmemory-policy allkeys-lru` (a cache's usual setting): `serve` and `worker` refuse it
  at start in one line that says why and what to set (exit 2, no traceback); `--allow-evicting-redis` runs
  anyway, with a warning. Persistence off (the tests' `--save "" --appendonly no`) is a warning at start and
  on `/health` (the admin's details), never an error; the URL comes from `BATCHYARD_REDIS_URL` there.
- TLS (`--tls-port`, a CA and a server certificate made here with the `openssl` CLI) with an ACL user that,
  as on managed services, may not run CONFIG: `rediss://user:password@…` with `--redis-ca-file` or the URL's
  `ssl_ca_certs=`; without the CA the certificate is refused; a wrong password is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.config.schema import Config, parse_config
from gateway.errors import ConfigError
from gateway.runtime.runtime import Runtime, open_shared
from gateway.store.redis.preflight import EvictingRedis
from tests.fakes.upstream.server import Upstream
from tests.support.services import (
    HAVE_REDIS,
    NO_REDIS_REASON,
    REPO_ROOT,
    RedisServer,
    free_port,
    make_tls_files,
    process_env,
    shared_config,
    write_config,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON),
              pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI makes the test CA")]

MODEL = "gpt-mini"
MASTER = "sk-master"
USER, PASSWORD = "batchyard", "s3cret-pw"


@pytest.fixture(scope="module")
def config_path(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = shared_config(upstream.v1_url, (MODEL,))
    raw["general_settings"] = {"master_key": MASTER}
    return write_config(tmp_path_factory.mktemp("managed") / "config.yaml", raw)


@pytest.fixture(scope="module")
def config(config_path: Path) -> Config:
    import yaml

    return parse_config(yaml.safe_load(config_path.read_text()))


@pytest.fixture(scope="module")
def evicting(server_binary: str) -> Iterator[RedisServer]:
    server = RedisServer(args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"],
                         binary=server_binary).start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def plain(server_binary: str) -> Iterator[RedisServer]:
    """As the tests' servers run: no AOF, no RDB `save` rule (persistence off), no eviction."""
    server = RedisServer(binary=server_binary).start()
    yield server
    server.close()


def _batchyard(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=REPO_ROOT, env=process_env(env),
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_an_evicting_redis_is_refused_in_one_line(command: str, evicting: RedisServer, config_path: Path,
                                                   tmp_path: Path) -> None:
    extra = ["--port", str(free_port())] if command == "serve" else []
    done = _batchyard(command, "--config", str(config_path), "--redis-url", evicting.url,
                      "--blobs", str(tmp_path / "blobs"), *extra)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(said) == 1, said
    assert "maxmemory-policy allkeys-lru" in said[0]
    assert "noeviction" in said[0] and "--allow-evicting-redis" in said[0]


async def test_allow_evicting_redis_runs_with_a_warning(evicting: RedisServer, config: Config, tmp_path: Path) -> None:
    with pytest.raises(EvictingRedis):
        await open_shared(config, evicting.url, tmp_path / "blobs")
    runtime = await open_shared(config, evicting.url, tmp_path / "blobs", allow_evicting_redis=True)
    try:
        health = await runtime.health()
        assert any("allkeys-lru" in w for w in health["warnings"])
        assert any("persistence is off" in w for w in health["warnings"])  # --save "" --appendonly no
    finally:
        await runtime.aclose()


def test_persistence_off_is_a_warning_on_health_and_the_url_may_come_from_the_environment(
    plain: RedisServer, config_path: Path, tmp_path: Path,
) -> None:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="serve-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path), "--port", str(port),
             "--blobs", str(tmp_path / "blobs")],  # no --redis-url: BATCHYARD_REDIS_URL names it
            cwd=REPO_ROOT, env=process_env({"BATCHYARD_REDIS_URL": plain.url}), stdin=subprocess.DEVNULL,
            stdout=out, stderr=out)
    try:
        url = f"http://127.0.0.1:{port}/health"

        def up() -> httpx.Response | None:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(url, headers={"Authorization": f"Bearer {MASTER}"}, timeout=5)
            except httpx.TransportError:
                return None

        reply = eventually(up, 120, "serve to answer /health", interval=0.2)
        assert reply.status_code == 200  # a warning, not an error
        body = reply.json()
        assert body["status"] == "healthy" and body["mode"] == "shared"
        assert any("persistence is off" in w for w in body["warnings"])
        assert "persistence is off" in log.read_text()  # said at start too
        assert "warnings" not in httpx.get(url, timeout=5).json()  # details for the admin only
    finally:
        process.terminate()
        process.wait(30)
        log.unlink(missing_ok=True)


def test_the_info_fields_batchyard_reads_are_there(plain: RedisServer, server_binary: str) -> None:
    """What the start checks and the connection read from `INFO`, on both servers; and which server answered
    (Valkey names itself and still reports a `redis_version`, 7.2.4 for Valkey 8, for clients that read it)."""
    with plain.client() as c:
        server = c.info("server")
        assert c.info("memory")["maxmemory_policy"] == "noeviction"
        assert c.info("persistence")["aof_enabled"] == 0
        assert c.info("cluster")["cluster_enabled"] == 0
        assert c.config_get("save") == {"save": ""}
    assert int(str(server["redis_version"]).split(".")[0]) >= 7
    if server_binary == "valkey-server":
        assert server["server_name"] == "valkey" and "valkey_version" in server
    else:
        assert "valkey_version" not in server


# -- TLS and an ACL user ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(server_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, int, Path]]:
    """A server with a TLS port (a CA made here) and an ACL user that may not run CONFIG, like a managed
    service's; the plain port stays for the harness's own readiness check."""
    ca, cert, key = make_tls_files(tmp_path_factory.mktemp("tls"))
    tls_port = free_port()
    server = RedisServer(args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no",
        "--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all", "-config",
    ], binary=server_binary).start()
    yield server, tls_port, ca
    server.close()


def _rediss(port: int, query: str = "", user: str = USER, password: str = PASSWORD) -> str:
    return f"rediss://{user}:{password}@127.0.0.1:{port}/0{query}"


async def _round_trip(runtime: Runtime) -> None:
    await runtime.store.backend_state.put("probe", {"ok": 1})
    assert await runtime.store.backend_state.get("probe") == {"ok": 1}


async def test_tls_with_a_ca_file_and_an_acl_user(tls: tuple[RedisServer, int, Path], config: Config,
                                                  tmp_path: Path) -> None:
    _, port, ca = tls
    runtime = await open_shared(config, _rediss(port), tmp_path / "blobs", redis_ca_file=str(ca))
    try:
        await _round_trip(runtime)
        # the user may not run CONFIG (as on managed services): persistence unknown, so no warning either way
        assert "warnings" not in await runtime.health()
    finally:
        await runtime.aclose()


async def test_tls_with_the_urls_own_ca(tls: tuple[RedisServer, int, Path], config: Config, tmp_path: Path) -> None:
    _, port, ca = tls
    runtime = await open_shared(config, _rediss(port, f"?ssl_ca_certs={ca}"), tmp_path / "blobs")
    try:
        await _round_trip(runtime)
    finally:
        await runtime.aclose()


async def test_tls_refuses_a_certificate_no_trusted_ca_signed(tls: tuple[RedisServer, int, Path], config: Config,
                                                              tmp_path: Path) -> None:
    _, port, _ = tls  # the system's CAs did not sign the test CA
    with pytest.raises(RedisConnectionError, match="certificate verify failed"):
        await open_shared(config, _rediss(port), tmp_path / "blobs")


async def test_a_wrong_password_is_refused(tls: tuple[RedisServer, int, Path], config: Config, tmp_path: Path) -> None:
    _, port, ca = tls
    with pytest.raises(AuthenticationError):
        await open_shared(config, _rediss(port, password="wrong"), tmp_path / "blobs", redis_ca_file=str(ca))


async def test_a_ca_file_needs_a_tls_url(plain: RedisServer, config: Config, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rediss://"):
        await open_shared(config, plain.url, tmp_path / "blobs", redis_ca_file="/etc/ssl/certs/ca.pem")
