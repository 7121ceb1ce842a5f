"""A webhook receiver on loopback, as a team would run one: a real HTTP server that verifies each
delivery with the `openai` SDK's `webhooks.unwrap` and keeps what it got. It can fail its first N
deliveries (HTTP 500) and can be started late, on a port reserved in advance (a receiver that is down)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
from openai import OpenAI

from tests.support.waiting import free_port


class Receiver:
    def __init__(self, secret: str, *, fail_first: int = 0, port: int | None = None) -> None:
        self.port = port or free_port()
        self.events: list[Any] = []  # the SDK's typed events, verified
        self.headers: list[dict[str, str]] = []
        self.statuses: list[int] = []  # what we answered, every attempt
        self.refused: list[str] = []  # deliveries whose signature did not verify
        self._fail_left = fail_first
        self._hooks = OpenAI(api_key="unused", webhook_secret=secret).webhooks
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(receiver._take(body, dict(self.headers.items())))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def _take(self, body: bytes, headers: dict[str, str]) -> int:
        with self._lock:
            if self._fail_left > 0:
                self._fail_left -= 1
                self.statuses.append(500)
                return 500
            try:
                event = self._hooks.unwrap(body, headers)
            except openai.InvalidWebhookSignatureError as exc:
                self.refused.append(str(exc))
                self.statuses.append(400)
                return 400
            self.events.append(event)
            self.headers.append({k.lower(): v for k, v in headers.items()})
            self.statuses.append(200)
            return 200

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, found: Callable[[list[Any]], bool], timeout: float = 30) -> list[Any]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                events = list(self.events)
            if found(events) or time.monotonic() > deadline:
                return events
            time.sleep(0.05)

    def batch_events(self, batch_id: str) -> list[str]:
        with self._lock:
            return [e.type for e in self.events if e.data.id == batch_id]
