"""What bench/faults.py's parts share: a gateway deployed in either mode, a prober, batches in and out.

`deploy(mode, …)`: `batchyard serve` embedded (one worker process), or shared: a redis-server with
`appendonly yes`, an API replica (`serve --redis-url`, no routes) and one `batchyard worker` apart, so that
the API and the worker are separate processes in both modes. `Prober`: another team's `GET /v1/batches`,
timed in a thread. `submit` / `outcome`: a batch in, and what came out of it (custom_ids, error codes).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, jsonl, start_gateway
from tests.support.services import RedisServer, WorkerProcess, start_worker
from tests.support.team_helpers import start_shared

MODEL = "gpt-mini"
MASTER = "sk-bench-master"
# alpha runs the batches; beta is the other team whose GET /v1/batches is timed
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
FINISHED = ("completed", "failed", "expired", "cancelled")


def bench_config(upstream: Upstream, *, timeout: float = 30, extra_models: list[dict[str, Any]] | None = None,
                 **batch: Any) -> dict[str, Any]:
    """The loopback upstream's `gpt-mini` route for teams alpha and beta; `timeout`: the route's timeout."""
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, master_key=MASTER, **batch)
    config["router_settings"] = {"num_retries": 0, "timeout": timeout}
    config["model_list"] += extra_models or []
    return config


@dataclass
class Deployment:
    mode: str
    gateway: Gateway
    redis: RedisServer | None = None
    worker: WorkerProcess | None = None
    config_path: Path | None = None
    blobs: str = ""
    claim_idle: float = 2.0
    redis_proxy: Any = None  # a FaultProxy between every process and Redis, when asked for

    @property
    def url(self) -> str:
        return self.gateway.url

    def processes(self) -> dict[str, int]:
        """Role -> pid: the API process and each worker process (not the validation processes)."""
        roles = {"api": self.gateway.process.pid}
        if self.worker is not None and self.worker.alive():
            roles["worker-0"] = self.worker.process.pid
            return roles
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.gateway.process.pid).children():
                cmd = child.cmdline()
                if "worker" in cmd:
                    index = cmd.index("--index") + 1 if "--index" in cmd else None
                    roles[f"worker-{cmd[index] if index else len(roles) - 1}"] = child.pid
        return roles

    def logs(self) -> str:
        """Every log of the deployment: the API's, and each worker's."""
        parts = [self.gateway.log()]
        if self.worker is not None:
            parts.append(self.worker.log())
        for path in sorted((self.gateway.data_dir / "logs").glob("*.log")):
            with contextlib.suppress(OSError):
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def restart_worker(self) -> None:
        """Shared mode: a new `batchyard worker` after the old one exited."""
        assert self.redis is not None and self.config_path is not None
        if self.worker is not None:
            self.worker.close()
        url = self.redis.url if self.redis_proxy is None else f"redis://127.0.0.1:{self.redis_proxy.port}/0"
        self.worker = start_worker(self.config_path, url, self.blobs, claim_idle=self.claim_idle)
        self.worker.wait_ready(120)


@contextlib.contextmanager
def deploy(mode: str, config: dict[str, Any], data_dir: Path, *, claim_idle: float = 2.0,
           blobs: str | None = None, env: dict[str, str] | None = None,
           redis_proxy: Any = None, workers: int | None = 1) -> Iterator[Deployment]:
    """The gateway in `mode` ("embedded" or "shared"), ready: its worker has started. `redis_proxy`: the
    FaultProxy class, to put one between every process and Redis (shared mode). `workers`: embedded `serve
    --workers` (None: the product's default)."""
    if mode == "embedded":
        with start_gateway(config, data_dir, workers=workers) as gw:
            deployment = Deployment(mode, gw)
            _wait_workers(deployment)
            yield deployment
        return
    redis = RedisServer(appendonly=True).start()
    proxy = redis_proxy("127.0.0.1", redis.port).start() if redis_proxy is not None else None
    url = redis.url if proxy is None else f"redis://127.0.0.1:{proxy.port}/0"
    worker: WorkerProcess | None = None
    try:
        store = blobs or str(data_dir / "blobs")
        with start_shared(config, data_dir, url, with_worker=False, blobs=store, env=env) as gw:
            config_path = data_dir.parent / "shared.config.yaml"
            worker = start_worker(config_path, url, store, env=env, claim_idle=claim_idle).wait_ready(120)
            deployment = Deployment(mode, gw, redis, worker, config_path, store, claim_idle, proxy)
            yield deployment
            worker = deployment.worker
    finally:
        if worker is not None:
            worker.close()
        if proxy is not None:
            proxy.close()
        redis.close()


def _wait_workers(d: Deployment) -> None:
    deadline = time.monotonic() + 120
    admin = {"Authorization": f"Bearer {MASTER}"}  # /health lists workers to the master key only
    while not httpx.get(d.url + "/health", headers=admin, timeout=10).json().get("workers"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start:\n{d.logs()[-4000:]}")
        time.sleep(0.2)


@dataclass
class Prober:
    """Team beta's `GET /v1/batches`, timed in a thread every `every` seconds: each answer's latency (`take()`)
    and status (`statuses`); `errors`: requests with no answer at all."""

    url: str
    every: float = 0.05
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": "Bearer sk-beta"}) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = http.get("/v1/batches", params={"limit": 5}).status_code
                except httpx.HTTPError:
                    self.errors += 1  # no answer at all
                else:
                    self.latencies.append(time.perf_counter() - started)  # an answer, 200 or not
                    self.statuses[status] += 1
                self._stop.wait(self.every)

    def take(self) -> list[float]:
        """The latencies of the answers since the last take (the statuses count on)."""
        taken, self.latencies = self.latencies, []
        return sorted(taken)

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds of sorted latencies (nan when there are none)."""
    if not latencies:
        return float("nan"), float("nan")
    return 1000 * statistics.median(latencies), 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]


def chat_lines(tag: str, n: int, text: str = "hello", directives: dict[int, str] | None = None) -> list[dict]:
    """`n` chat lines `tag-0` … on the upstream route; `directives`: line index -> text prefix (e.g. `#hang`)."""
    marks = directives or {}
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL,
                      "messages": [{"role": "user", "content": f"{marks.get(i, '')} {text} {tag} {i}".strip()}]}}
            for i in range(n)]


def submit(url: str, lines: list[dict], key: str = "sk-alpha") -> str:
    """Upload `lines` and create a batch of them; its id."""
    with httpx.Client(base_url=url + "/v1", timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        reply = http.post("/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", jsonl(lines))})
        reply.raise_for_status()
        reply = http.post("/batches", json={"input_file_id": reply.json()["id"], "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h"})
        reply.raise_for_status()
        return str(reply.json()["id"])


def batch(url: str, batch_id: str, key: str = "sk-alpha") -> dict[str, Any]:
    reply = httpx.get(f"{url}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    reply.raise_for_status()
    return dict(reply.json())


@dataclass
class Outcome:
    status: str
    ids: Counter[str]  # custom_id -> how many times it is in the output and error files together
    codes: Counter[str]  # error code -> lines (the error file's and the output's non-2xx)

    def lost(self, sent: list[dict]) -> int:
        return sum(1 for line in sent if self.ids[line["custom_id"]] == 0)

    def repeated(self) -> int:
        return sum(n - 1 for n in self.ids.values() if n > 1)


def outcome(url: str, batch_id: str, key: str = "sk-alpha") -> Outcome:
    """A finished batch's files read back: which custom_ids came out, how often, and the error codes."""
    b = batch(url, batch_id, key)
    ids: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    for file_id in (b.get("output_file_id"), b.get("error_file_id")):
        if not file_id:
            continue
        reply = httpx.get(f"{url}/v1/files/{file_id}/content", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        for raw in reply.text.splitlines():
            row = json.loads(raw)
            ids[row["custom_id"]] += 1
            response = row.get("response") or {}
            if row.get("error") or response.get("status_code", 200) >= 400:
                error = row.get("error") or (response.get("body") or {}).get("error") or {}
                codes[str(error.get("code"))] += 1
    return Outcome(str(b["status"]), ids, codes)


def wait_finished(url: str, batch_id: str, timeout: float, key: str = "sk-alpha") -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (b := batch(url, batch_id, key))["status"] not in FINISHED:
        if time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch_id} still {b['status']} after {timeout:.0f} s: {b['request_counts']}")
        time.sleep(0.2)
    return b


def git_commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    return "unknown"
