"""A presigned-URL bucket on loopback, for `batchyard run -i URL -o URL`: GET serves a stored object and PUT
stores one, by path, the query (the signature) ignored; the first `fail_puts` PUTs answer 503, and every PUT's
Content-Length is kept (S3 needs one: no chunked uploads). `str(bucket)` is its base URL."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Bucket:
    def __init__(self) -> None:
        self.store: dict[str, bytes] = {}
        self.fail_puts = 0
        self.lengths: list[str | None] = []
        bucket = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = bucket.store.get(self.path.split("?")[0])
                self.send_response(200 if data is not None else 404)
                self.send_header("Content-Length", str(len(data or b"")))
                self.end_headers()
                self.wfile.write(data or b"")

            def do_PUT(self) -> None:
                length = self.headers.get("Content-Length")
                bucket.lengths.append(length)
                body = self.rfile.read(int(length or 0))
                if bucket.fail_puts > 0:
                    bucket.fail_puts -= 1
                    self.send_response(503)
                else:
                    bucket.store[self.path.split("?")[0]] = body
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __str__(self) -> str:
        return self.url

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
