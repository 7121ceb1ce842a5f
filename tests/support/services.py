"""Real Redis and S3 servers for tests and benchmarks, on loopback.

- `RedisServer`: a `redis-server` (or `valkey-server`) process on a free port (`--save "" --appendonly no`
  unless asked to persist); it can be stopped and started again on the same port
  and directory (`restart`). `RedisClusterServers`: a cluster of them.
- `need_server`: skip (fail, in CI) a test whose server is not installed.
- `MotoS3`: moto's S3 server (`python -m moto.server`), a real S3 endpoint.
- `WorkerProcess` / `start_worker`: a `batchyard worker` process.
- `shared_config`: a config whose upstream models point at the loopback upstream.

Nothing is mocked: the gateway talks to these over TCP as it would in production.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import yaml

from tests.support.waiting import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
HAVE_REDIS = shutil.which("redis-server") is not None
NO_REDIS_REASON = "redis-server is not on PATH (apt-get install -y redis-server)"
# The servers the Redis suites run on: Redis, and Valkey (the fork most managed services now run; Debian
# bookworm has it in bookworm-backports, which scripts/test.sh installs it from).
SERVER_BINARIES = ("redis-server", "valkey-server")
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def need_server(binary: str) -> None:
    """Skip the calling test where `binary` is not installed (a dev machine); in CI (`CI=true`), where
    scripts/test.sh installs every server, its absence fails the test instead."""
    if shutil.which(binary) is not None:
        return
    import pytest  # here, not at the top: the benchmarks import this module too, and need no pytest

    reason = (f"{binary} is not on PATH: on Debian bookworm `apt-get install -t bookworm-backports {binary}` "
              "(scripts/test.sh does)" if binary == "valkey-server" else NO_REDIS_REASON)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _tail(path: Path, n: int = 4000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-n:]
    return ""


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 10) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


class RedisServer:
    """`args`: more of redis-server's flags (a maxmemory policy, a TLS port, an ACL user); `binary`: the server
    (`valkey-server` speaks the same flags)."""

    def __init__(self, *, appendonly: bool = False, port: int | None = None, args: Sequence[str] = (),
                 binary: str = "redis-server") -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self.args, self.binary = list(args), binary
        self.dir = Path(tempfile.mkdtemp(prefix="redis-"))
        self.log_path = self.dir / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def start(self, timeout: float = 10) -> RedisServer:
        persist = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persist,
               "--dir", str(self.dir), "--logfile", str(self.log_path), *self.args]
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.RedisError), self.client() as c:
                if c.ping():
                    return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.binary} did not start:\n{_tail(self.log_path)}")
            time.sleep(0.05)

    def flush(self) -> None:
        with self.client() as c:
            c.flushall()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: Redis' own shutdown (it flushes the append-only file); SIGKILL: a crash."""
        if self.process is not None:
            _stop(self.process, sig)

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def make_tls_files(where: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it, made with the `openssl` CLI in
    `where`: (CA, certificate, key)."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=batchyard test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "1", "-extfile", "san.ext")
    return where / "ca.crt", where / "server.crt", where / "server.key"


class RedisClusterServers:
    """A Redis Cluster of `masters` masters (and `replicas` replicas each) on loopback: `redis-server
    --cluster-enabled yes` processes joined by `redis-cli --cluster create`. `url` names one node, as a managed
    configuration endpoint would."""

    def __init__(self, masters: int = 3, replicas: int = 0, binary: str = "redis-server",
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        """`tls`: (CA, certificate, key): each node also listens with TLS (`tls_url`), its bus too, and the
        cluster tells TLS clients the TLS ports."""
        count = masters * (1 + replicas)
        # Three ports a node (its own, TLS, cluster bus), all distinct: free_port() may hand one out twice
        # (a fresh-clone run had a TLS node fail with "Address already in use").
        ports: list[int] = []
        while len(ports) < 3 * count:
            port = free_port()
            if port not in ports:
                ports.append(port)
        self.tls, self.tls_ports = tls, ports[count:2 * count]
        # A short node timeout makes a killed master's replica take over quickly (the failover tests). Without
        # replicas nothing takes over, and a node starved of CPU for 2 s on a loaded machine was marked failed:
        # the cluster refused every command meanwhile (a fresh-clone run's 503 "Redis unreachable").
        node_timeout = "2000" if replicas else "15000"
        self.nodes = [RedisServer(binary=binary, port=ports[i], args=[
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", node_timeout,
            "--cluster-port", str(ports[2 * count + i]),  # named: the default (port + 10000) may be past 65535
            *self._tls_args(self.tls_ports[i])]) for i in range(count)]
        self.replicas = replicas

    def _tls_args(self, port: int) -> list[str]:
        if self.tls is None:
            return []
        ca, cert, key = self.tls
        return ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no", "--tls-cluster", "yes"]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def tls_url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_ports[0]}/0"

    def start(self, timeout: float = 30) -> RedisClusterServers:
        for node in self.nodes:
            node.start()
        # the server's own CLI (valkey-cli for valkey-server), else whichever is installed
        own = self.nodes[0].binary.replace("-server", "-cli")
        cli = shutil.which(own) or shutil.which("redis-cli") or shutil.which("valkey-cli") or "redis-cli"
        if self.tls is None:
            tls, ports = [], [n.port for n in self.nodes]
        else:  # created over TLS, so that the nodes meet on their TLS ports
            tls, ports = ["--tls", "--cacert", str(self.tls[0])], self.tls_ports
        subprocess.run([cli, *tls, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + timeout
        while True:
            with self.nodes[0].client() as c:
                info = c.execute_command("CLUSTER", "INFO")
                text = info if isinstance(info, str) else str(info)
                if "cluster_state:ok" in text:
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up: {text}")
            time.sleep(0.1)

    def flush(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(redis.RedisError), node.client() as c:
                c.flushall()

    def close(self) -> None:
        for node in self.nodes:
            node.close()


class MotoS3:
    """moto's S3 server on a free loopback port, with one bucket."""

    def __init__(self, bucket: str = "batchyard-test") -> None:
        self.port = free_port()
        self.bucket = bucket
        fd, name = tempfile.mkstemp(prefix="moto-", suffix=".log")
        self.log_path = Path(name)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env={**os.environ, **S3_ENV},
        )
        os.close(fd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def location(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def env(self) -> dict[str, str]:
        """What a process needs to reach this S3: credentials, region, endpoint."""
        return {**S3_ENV, "BATCHYARD_S3_ENDPOINT_URL": self.url}

    def keys(self, prefix: str) -> list[str]:
        """The bucket's keys under `prefix`, sorted (one ListObjectsV2 page: a test's few objects)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        query = urllib.parse.urlencode({"list-type": "2", "prefix": prefix})
        with opener.open(f"{self.url}/{self.bucket}?{query}", timeout=10) as reply:
            listing = reply.read().decode()
        return sorted(re.findall(r"<Key>([^<]+)</Key>", listing))

    def multipart_uploads(self, prefix: str) -> list[str]:
        """The keys under `prefix` of the multipart uploads begun and neither completed nor aborted."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        query = urllib.parse.urlencode({"uploads": "", "prefix": prefix})
        with opener.open(f"{self.url}/{self.bucket}?{query}", timeout=10) as reply:
            listing = reply.read().decode()
        uploads = re.findall(r"<Upload>.*?<Key>([^<]+)</Key>", listing, re.S)
        return sorted(key for key in uploads if key.startswith(prefix))

    def start(self, timeout: float = 30) -> MotoS3:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout
        while True:
            try:
                with opener.open(urllib.request.Request(f"{self.url}/{self.bucket}", method="PUT"), timeout=2):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start:\n{_tail(self.log_path)}") from None
                time.sleep(0.1)

    def close(self) -> None:
        _stop(self.process)
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env.update(extra or {})
    return env


class WorkerProcess:
    """A running `batchyard worker`."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process, self.log_path = process, log_path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return _tail(self.log_path, 20_000)

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as a crash or a lost machine leaves it."""
        _stop(self.process, signal.SIGKILL)

    def stop(self) -> None:
        _stop(self.process, signal.SIGTERM, timeout=20)

    def close(self) -> None:
        """Stop it and remove its log."""
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def wait_ready(self, timeout: float = 60) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while "running shards for" not in self.log():
            if not self.alive() or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"worker did not start:\n{self.log()}")
            time.sleep(0.1)
        return self


def start_worker(
    config_path: Path, redis_url: str, blobs: str, *, env: dict[str, str] | None = None,
    models: str | None = None, claim_idle: float = 2.0, cpu: int | None = None,
) -> WorkerProcess:
    cmd = [sys.executable, "-m", "gateway.cli", "worker", "--config", str(config_path), "--redis-url", redis_url,
           "--blobs", blobs, "--claim-idle", str(claim_idle)]
    if models:
        cmd += ["--models", models]
    fd, name = tempfile.mkstemp(prefix="worker-", suffix=".log")
    try:
        process = subprocess.Popen(cmd, cwd=REPO_ROOT, env=process_env(env), stdin=subprocess.DEVNULL,
                                   stdout=fd, stderr=fd)
    finally:
        os.close(fd)
    return WorkerProcess(process, Path(name))


def shared_config(upstream_v1_url: str, models: tuple[str, ...] = ("gpt-mini",), **batch: Any) -> dict[str, Any]:
    model_list = [
        {"model_name": m, "litellm_params": {"model": f"openai/{m}", "api_base": upstream_v1_url, "api_key": "sk-x"}}
        for m in models
    ]
    settings = {"max_line_bytes": 1 << 20, "max_errors_listed": 100, **batch}
    return {"model_list": model_list, "router_settings": {"num_retries": 0, "timeout": 60},
            "batch_settings": settings}


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


__all__ = [
    "HAVE_REDIS", "NO_REDIS_REASON", "S3_ENV", "SERVER_BINARIES", "MotoS3", "RedisClusterServers", "RedisServer",
    "WorkerProcess", "free_port", "make_tls_files", "need_server", "process_env", "shared_config", "start_worker",
    "write_config",
]
