"""What the team-sharing tests share: the gateway in either mode, batch lines with a `#sleep`, waiting on a batch.

`serve(mode, config, data_dir)`: `batchyard serve` embedded (one worker process) or `batchyard serve
--redis-url … --with-worker` over a real redis-server of its own, as a context manager.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from openai.types import Batch

from tests.support.server_helpers import REPO_ROOT, Gateway, _wait_healthy, start_gateway
from tests.support.services import HAVE_REDIS, RedisServer, process_env
from tests.support.waiting import eventually, free_port

MODEL = "gpt-mini"
MODES = ["embedded", pytest.param("shared", marks=[pytest.mark.redis, pytest.mark.skipif(
    not HAVE_REDIS, reason="redis-server is not on PATH")])]


def start_shared(config: dict[str, Any], data_dir: Path, redis_url: str, *, with_worker: bool = True,
                 blobs: str | None = None, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> Gateway:
    """`batchyard serve` over `redis_url`; `with_worker=False`: an API replica only (workers run apart);
    `args`: more flags of `serve`.

    `blobs`: where the blobs go (default: `data_dir/blobs`; e.g. an `s3://` URL, with `env` naming its endpoint).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    config_path = data_dir.parent / "shared.config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    fd, log = tempfile.mkstemp(prefix="serve-", suffix=".log")
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path), "--port", str(port),
           "--redis-url", redis_url, "--blobs", blobs or str(data_dir / "blobs"),
           *(["--with-worker"] if with_worker else []), *args]
    process = subprocess.Popen(cmd, cwd=REPO_ROOT, env=process_env(env or {}), stdin=subprocess.DEVNULL, stdout=fd,
                               stderr=fd)
    gateway = Gateway(process, "127.0.0.1", port, data_dir, Path(log))
    _wait_healthy(gateway, 120)
    return gateway


@contextlib.contextmanager
def serve(mode: str, config: dict[str, Any], data_dir: Path, redis_url: str | None = None) -> Iterator[Gateway]:
    """The gateway in `mode`; shared mode uses `redis_url`, or a redis-server of its own when None."""
    if mode == "embedded":
        with start_gateway(config, data_dir, workers=1) as server:
            yield server
        return
    redis = RedisServer().start() if redis_url is None else None
    try:
        with start_shared(config, data_dir, redis.url if redis is not None else str(redis_url)) as server:
            yield server
    finally:
        if redis is not None:
            redis.close()


def lines(n: int, tag: str, sleep_ms: int = 200) -> list[dict[str, Any]]:
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "messages": [{"role": "user", "content": f"#sleep:{sleep_ms} {tag} {i}"}]}}
            for i in range(n)]


def until(gw: Gateway, key: str, batch_id: str, reached: Callable[[Batch], bool], timeout: float = 60) -> Batch:
    client = gw.client(key)
    seen: list[Batch] = []

    def check() -> Batch | None:
        seen[:] = [client.batches.retrieve(batch_id)]
        return seen[0] if reached(seen[0]) else None

    return eventually(check, timeout, f"batch {batch_id}", detail=lambda: str(seen[-1] if seen else None))


def done(b: Batch) -> int:
    assert b.request_counts is not None
    return b.request_counts.completed + b.request_counts.failed


def metric(gw: Gateway, name: str, **labels: str) -> float | None:
    """The sample of `name` with exactly these labels on the gateway's /metrics (the master key's), or None."""
    text = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer sk-admin"}, timeout=10).text
    for match in re.finditer(rf"^{name}{{(.*)}} ([-0-9.e+]+)$", text, re.M):
        if dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) == labels:
            return float(match.group(2))
    return None


def finished(b: Batch) -> bool:
    return b.status in ("completed", "failed", "expired", "cancelled")
