"""Running a provider stand-in (tests/stubs_*.py) as a real loopback server in its own process.

`start_stub("tests.fakes.stubs_anthropic", ...)` binds a free loopback port here, hands the listening socket to
`python -m <module> --fd N ...` and waits for `GET /_health`; `serve(app, argv)` is the child's side.
Every stub answers `GET /_health`, `GET /_stats` and `POST /_reset` (no auth). Also shared: the little
each stub needs to answer like a model (the last user text, whitespace token counts, batch-job timing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from starlette.applications import Starlette

REPO_ROOT = Path(__file__).resolve().parents[2]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy


class LoopbackProcess:
    """A test server running in its own process (a provider stand-in, or the loopback upstream in
    tests/fakes/upstream/server.py): its counters, its log, and stop(). Subclasses give `url`, `process`, `log_path`."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: str

    def _call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None)
        with _OPENER.open(request, timeout=10) as reply:
            return json.loads(reply.read())

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/_stats"))

    def reset(self) -> None:
        self._call("POST", "/_reset")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return Path(self.log_path).read_text(errors="replace")
        return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class Stub(LoopbackProcess):
    """A running stand-in: its base URL, its counters, and stop()."""

    def __init__(self, process: subprocess.Popen[bytes], url: str, log_path: str) -> None:
        self.process = process
        self.url = url
        self.log_path = log_path


def start_stub(module: str, args: Sequence[str] = (), timeout: float = 30.0) -> Stub:
    """Start `python -m module --fd N *args` on a free loopback port; return once it answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    port = sock.getsockname()[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    log_fd, log_path = tempfile.mkstemp(prefix="stub-", suffix=".log")
    try:
        process = subprocess.Popen([sys.executable, "-m", module, "--fd", str(sock.fileno()), *args], cwd=REPO_ROOT,
                                   env=env, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
                                   pass_fds=(sock.fileno(),))
    finally:
        sock.close()
        os.close(log_fd)
    stub = Stub(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            log = stub.log()
            stub.stop()
            raise RuntimeError(f"{module} exited with {process.returncode}:\n{log}")
        with contextlib.suppress(OSError):
            if stub._call("GET", "/_health").get("status") == "ok":
                return stub
        if time.monotonic() > deadline:
            log = stub.log()
            stub.stop()
            raise RuntimeError(f"{module} did not answer within {timeout}s:\n{log}")
        time.sleep(0.02)


class Controlled(Protocol):
    """A stand-in the tests read and clear between cases."""

    def stats(self) -> dict[str, Any]: ...

    def reset(self) -> None: ...


def control_routes(stub: Controlled) -> list[Any]:
    """`/_health`, `/_stats` and `/_reset`: the routes every stand-in serves beside its provider's API."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def stats(request: Request) -> Response:
        return JSONResponse(stub.stats())

    async def reset(request: Request) -> Response:
        stub.reset()
        return JSONResponse({"ok": True})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return [Route("/_health", health), Route("/_stats", stats), Route("/_reset", reset, methods=["POST"])]


def stub_arguments(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every stub takes; a stub adds its own."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    parser.add_argument("--batch-delay", type=float, default=0.5, help="seconds from job creation to its end")
    parser.add_argument("--api-key", default=None, help="require this key; by default any key passes")
    return parser


def serve(app: Starlette, args: argparse.Namespace) -> None:
    import uvicorn

    config = uvicorn.Config(app, host=args.host, port=args.port, lifespan="off", log_level="warning",
                            access_log=False, timeout_graceful_shutdown=1)
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    uvicorn.Server(config).run(sockets=sockets)


# -- answering like a model -----------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list (OpenAI's or Anthropic's)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def last_user_text(messages: Any) -> str:
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of(message.get("content"))
    return ""


def words(text: str) -> int:
    """Token counts in the stand-ins: whitespace words."""
    return len(text.split())


def directive(text: str, name: str) -> str | None:
    """The argument of `#name:ARG` in a request's text, if it is there."""
    marker = f"#{name}:"
    if marker not in text:
        return None
    return text.split(marker, 1)[1].split()[0] if text.split(marker, 1)[1].split() else ""


_BILLED = (("billed_input_tokens", ("input_tokens", "prompt_tokens", "promptTokenCount", "inputTokens")),
           ("billed_output_tokens", ("output_tokens", "completion_tokens", "candidatesTokenCount", "outputTokens")))


def bill(counters: Any, usage: Any) -> None:
    """Count what a batch job's answered line is billed (its usage, in any provider's words) in the stub's
    `billed_input_tokens` / `billed_output_tokens`: the provider's bill a test compares with our ledger."""
    if not isinstance(usage, dict):
        return
    for counter, names in _BILLED:
        counters[counter] += next((int(usage[n]) for n in names if isinstance(usage.get(n), int)), 0)
