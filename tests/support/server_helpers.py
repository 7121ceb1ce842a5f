"""Running a real batchyard server process for tests, and talking to it.

`start_gateway(config, data_dir)` writes the config, starts
`python -m gateway.cli serve` on a free loopback port and waits for
`/health`. Clients are the real `openai` SDK (and LiteLLM in the tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx
import yaml
from openai import OpenAI
from openai.types import Batch

from tests.fakes.upstream.server import Upstream
from tests.support.waiting import free_port

if TYPE_CHECKING:
    from gateway.runtime.runtime import Runtime
    from gateway.store.records import BatchRecord

REPO_ROOT = Path(__file__).resolve().parents[2]
API_VERSION = "2024-10-21"
FINISHED = ("completed", "failed", "expired", "cancelled")


class Gateway:
    """A running `python -m gateway.cli serve` process."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, data_dir: Path, log_path: Path):
        self.process, self.host, self.port, self.data_dir, self.log_path = process, host, port, data_dir, log_path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self, key: str | None, prefix: str = "/v1", **kwargs: Any) -> OpenAI:
        return OpenAI(base_url=self.url + prefix, api_key=key or "none", max_retries=0, timeout=30, **kwargs)

    def http(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", None) or {})
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return httpx.request(method, self.url + path, headers=headers, timeout=30, **kwargs)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown at all, as a crash would leave it."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def __enter__(self) -> Gateway:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_gateway(
    config: dict[str, Any], data_dir: Path, *, host: str = "127.0.0.1", timeout: float = 90,
    workers: int | None = 1, port: int | None = None, cwd: Path | None = None,
) -> Gateway:
    """Write `config` beside `data_dir`, start the server on a free port, wait until `/health` answers.

    `workers`: the embedded worker processes (the product's default is one per free core; one keeps the
    suite light, and the runtime tests ask for more; None: the product's default). `cwd`: run it from there, as
    the installed `batchyard` command runs (the current directory is not on its import path)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    config_path = data_dir.parent / f"{data_dir.name}.config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    port = port or free_port(host)
    log_fd, log_name = tempfile.mkstemp(prefix="gateway-", suffix=".log")
    cmd = [
        sys.executable,
        *(["-P"] if cwd is not None else []),
        "-m",
        "gateway.cli",
        "serve",
        "--config",
        str(config_path),
        "--host",
        host,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *(["--workers", str(workers)] if workers is not None else []),
    ]
    try:
        process = subprocess.Popen(cmd, cwd=cwd or REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log_fd,
                                   stderr=log_fd)
    finally:
        os.close(log_fd)
    gateway = Gateway(process, host, port, data_dir, Path(log_name))
    _wait_healthy(gateway, timeout)
    return gateway


def _wait_healthy(gateway: Gateway, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not gateway.alive():
            raise RuntimeError(f"gateway exited with {gateway.process.returncode}:\n{gateway.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(gateway.url + "/health", timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            gateway.kill()
            raise RuntimeError(f"gateway did not answer within {timeout}s:\n{gateway.log()}")
        time.sleep(0.1)


def gateway_config(
    upstream: Upstream,
    *,
    master_key: str | None = None,
    teams: list[dict[str, Any]] | None = None,
    models: Iterable[str] = ("gpt-mini", "gpt-azure", "embed-small", "secret-model"),
    **batch_settings: Any,
) -> dict[str, Any]:
    """A config whose `openai/…` and `azure/…` deployments point at the loopback upstream."""
    model_list = []
    for name in models:
        if name == "gpt-azure":
            params = {
                "model": "azure/my-gpt4o",
                "api_base": upstream.url,
                "api_key": upstream.api_key,
                "api_version": API_VERSION,
            }
        else:
            params = {"model": f"openai/{name}", "api_base": upstream.v1_url, "api_key": upstream.api_key}
        model_list.append({"model_name": name, "litellm_params": params})
    config: dict[str, Any] = {"model_list": model_list, "router_settings": {"num_retries": 0, "timeout": 30}}
    if master_key:
        config["general_settings"] = {"master_key": master_key}
    settings = dict(batch_settings)
    if teams:
        settings["teams"] = teams
    if settings:
        config["batch_settings"] = settings
    return config


def chat_line(custom_id: str, model: str | None, text: str, url: str = "/v1/chat/completions", **body: Any) -> dict:
    payload: dict[str, Any] = {"messages": [{"role": "user", "content": text}], **body}
    if model is not None:
        payload["model"] = model
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": payload}


def jsonl(lines: Iterable[dict[str, Any] | str]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def read_jsonl(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


def wait_batch(client: OpenAI, batch_id: str, statuses: Iterable[str] = FINISHED, timeout: float = 60) -> Batch:
    wanted = set(statuses)
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in wanted:
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout}s: {batch}")
        time.sleep(0.1)


def submit(
    client: OpenAI,
    lines: Iterable[dict[str, Any] | str],
    *,
    endpoint: str = "/v1/chat/completions",
    completion_window: str = "24h",
    filename: str = "input.jsonl",
    **kwargs: Any,
) -> Batch:
    """Upload a batch file and create a batch from it."""
    file = client.files.create(file=(filename, jsonl(lines)), purpose="batch")
    params: dict[str, Any] = {"endpoint": endpoint, "completion_window": completion_window, **kwargs}
    return client.batches.create(input_file_id=file.id, **params)


@contextlib.asynccontextmanager
async def embedded_runtime(config: Any, data_dir: Path) -> AsyncIterator[Runtime]:
    """The embedded runtime, shards run in this process (opened and closed on the test's own loop)."""
    from gateway.runtime.runtime import open_embedded

    runtime = await open_embedded(config, data_dir)
    try:
        await runtime.start()
        yield runtime
    finally:
        await runtime.aclose()


async def run_embedded_batch(runtime: Runtime, owner: str, lines: list[dict[str, Any]]) -> BatchRecord:
    """`lines` uploaded and run as `owner`'s chat batch, which must complete."""
    from gateway.domain import BatchStatus

    async def chunks() -> AsyncIterator[bytes]:
        yield jsonl(lines)

    source = await runtime.service.upload_file(owner, "in.jsonl", "batch", chunks())
    batch = await runtime.service.create_batch(owner, input_file_id=source.id, endpoint="/v1/chat/completions",
                                               completion_window="24h")
    done = await runtime.service.wait(batch.id)
    assert done.status is BatchStatus.COMPLETED
    return done
