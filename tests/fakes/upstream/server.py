"""The test suite's stand-in for OpenAI and Azure OpenAI: a real HTTP server on loopback.

Tests and benchmarks never mock HTTP. They start this server as a subprocess
(`start_upstream()`, or `python -m tests.fakes.upstream.server --port P`) and point LiteLLM,
the `openai` SDK or the gateway at it, exactly as they would at api.openai.com
or an Azure resource. It answers deterministically and cheaply (plain Starlette,
no pydantic), so thousands of requests a second fit on two cores.

Real-time endpoints, each under `/v1/…` (OpenAI, Bearer auth), `/openai/v1/…`
(Azure v1), `/openai/deployments/{deployment}/…?api-version=…` (Azure, header
`api-key`; the reply's model is the deployment) and the bare root (`/…`, for a
hosted vLLM whose api_base lacks `/v1`):

- `chat/completions`  "echo: <last user message>" (also `stream: true`, as SSE)
- `completions`       "echo: <prompt>", one choice per prompt
- `embeddings`        an 8-dim unit vector per input from a hash of its text
                      (`dimensions` honoured; `encoding_format: base64` too)
- `responses`         a minimal Responses API object (also `/openai/responses`)
- `rerank`, `score`   vLLM/Cohere shapes; relevance is word-set overlap
                      (rerank also at `/v2/rerank`)
- `moderations`       one result per input; flagged (category "violence") when
                      the text contains the word "attack"
- `images/generations` `n` images as `b64_json` (or `url`) from a hash of the prompt;
                      `usage` counts the prompt's words as input tokens

Token counts are whitespace word counts. `--api-key K` makes every request
without that key (Bearer or `api-key`) a 401; by default any key passes.

Directives in the request text (last user message, prompt, input, query):

- `#fail:CODE` answer CODE always (OpenAI error shape; 429 and 5xx carry
  `retry-after: 0` and `retry-after-ms: 10` so clients retry at once)
- `#fail:CODExN` answer CODE to the first N calls with this exact text, then succeed
- `#sleep:MS`  wait MS milliseconds before answering (real-time only)
- `#hang`      accept the request and never answer it (an hour; real-time only): a hung upstream
- `#hangxN`    hang for the first N calls with this exact text, then answer (a retry succeeds)
- `#count`     count calls per exact text in `stats()["by_custom"]`
- `#extra`     add fields OpenAI's types don't know to a success reply (`x_provider`, `prompt_logprobs`)
- `#tier:NAME` a success reply reports `"service_tier": NAME` (the tier it says it ran at)
- `#usage:NAME` a success reply's `usage` is a bad one (`tests.fakes.upstream.app.BAD_USAGE`: negative, huge,
  float, string, bool, nested, list)
- `#schema:KIND` a request that names a schema (chat `response_format` json_schema/json_object, strict `tools`,
  responses `text.format`) is answered with JSON made from it (`tests.fakes.upstream.structured`), wrong as KIND
  says: `badjson`, `wrongtype`, `missing`, `extra`, `length` (cut off), `badtool`; `#schema:KINDxN` only on the
  first N calls with this exact text

Files and Batches API under `/v1`, `/openai` (`?api-version=`) and `/openai/v1`.
A batch goes validating → in_progress → finalizing → completed within
`--batch-delay` seconds; its lines are answered by the same handler as the
real-time endpoints (directives apply per line, sleeps excepted; non-2xx lines
go to the error file). Input lines containing `#batch:fail` make the batch
`failed`, `#batch:expire` make it `expired`; `#batch:hangxN`: its first N retrieves (`GET …/batches/{id}`)
are never answered (a hung upstream while the job is polled). Cancel: cancelling → cancelled.

The parts: this module (the process and the handle tests hold), `tests.fakes.upstream.app`
(the ASGI app: real-time and control endpoints), `tests.fakes.upstream.batches` (Files and
Batches API), `tests.fakes.upstream.state` (state and shared helpers), `tests.fakes.upstream.replies`
(the replies themselves).

Control endpoints (no auth): `GET /_health`, `GET /_stats`, `POST /_reset`.
Stats shape: {"requests", "by_path", "by_model", "by_status", "by_custom",
"batch_lines", "files_created", "batches_created"}.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.fakes.stub_process import LoopbackProcess
from tests.fakes.upstream.app import Options, build_app
from tests.fakes.upstream.replies import EMBEDDING_DIM, ApiError, embedding_vector, error_body, relevance, request_text

__all__ = ["EMBEDDING_DIM", "ApiError", "Upstream", "embedding_vector", "error_body", "relevance", "request_text",
           "start_upstream"]



REPO_ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------- the process and its handle


class Upstream(LoopbackProcess):
    """A running upstream server process, as tests and benchmarks hold it. `stats()` gives {"requests",
    "by_path", "by_model", "by_status", "by_custom", "batch_lines", "files_created", "batches_created"};
    `reset()` clears counters, directive attempts, files and batches."""

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, api_key: str, log_path: str) -> None:
        self.process = process
        self.host = host
        self.port = port
        self.api_key = api_key  # a key clients can send (the required one when started with api_key)
        self.log_path = log_path

    @property
    def url(self) -> str:
        """Root URL: the Azure `azure_endpoint`, and `api_base` for a hosted vLLM."""
        return f"http://{self.host}:{self.port}"

    @property
    def v1_url(self) -> str:
        """OpenAI `base_url` / LiteLLM `api_base` for openai/… deployments."""
        return f"{self.url}/v1"

    def alive(self) -> bool:
        return self.process.poll() is None

    def __repr__(self) -> str:
        return f"Upstream({self.url}, pid={self.process.pid})"


def start_upstream(
    latency_ms: float = 0,
    batch_delay: float = 0.5,
    extra_args: Sequence[str] = (),
    *,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
) -> Upstream:
    """Start the server as a subprocess on a free loopback port and wait until it answers.

    The listening socket is bound here and handed to the child, so the port is
    never raced. `api_key` makes the server require that key.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(2048)
    port = sock.getsockname()[1]
    args = ["--fd", str(sock.fileno()), "--latency-ms", str(latency_ms), "--batch-delay", str(batch_delay)]
    if api_key is not None:
        args += ["--api-key", api_key]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    log_fd, log_path = tempfile.mkstemp(prefix="upstream-", suffix=".log")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.upstream.server", *args, *extra_args],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(sock.fileno(),),
        )
    finally:
        sock.close()
        os.close(log_fd)
    upstream = Upstream(process, host, port, api_key or "sk-upstream-test", log_path)
    _wait_healthy(upstream, timeout)
    return upstream


def _wait_healthy(upstream: Upstream, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if not upstream.alive():
            log = upstream.log()
            upstream.stop()
            raise RuntimeError(f"upstream server exited with {upstream.process.returncode}:\n{log}")
        try:
            if upstream._call("GET", "/_health").get("status") == "ok":
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            log = upstream.log()
            upstream.stop()
            raise RuntimeError(f"upstream server did not answer within {timeout}s:\n{log}")
        time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.upstream.server",
                                     description="OpenAI/Azure stand-in for tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every real-time request")
    parser.add_argument("--batch-delay", type=float, default=0.5, help="seconds from batch creation to completion")
    parser.add_argument("--api-key", default=None, help="require this key (Bearer or api-key header)")
    args = parser.parse_args(argv)

    import uvicorn

    app = build_app(Options(latency_ms=args.latency_ms, batch_delay=args.batch_delay, api_key=args.api_key))
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    uvicorn.Server(config).run(sockets=sockets)


if __name__ == "__main__":
    main()
