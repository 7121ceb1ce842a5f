"""A fault-injecting TCP proxy on loopback, put in front of a real server (moto's S3) to play its outages.

Modes, switched at any time with `proxy.mode = …`:
- `"pass"`: bytes go both ways, untouched;
- `"slowdown"`: every HTTP request is answered `503 SlowDown` in S3's XML error shape, as S3 throttles;
- `"refuse"`: nothing listens on the port (connection refused), as an endpoint that is down.

A switch closes every connection open at the time, so a client's pooled keep-alive connections meet the
new mode on their next request instead of passing through the old one. The port stays the same across
modes (`refuse` closes the listening socket; the next mode binds it again). Plain sockets and threads, so
it runs beside any event loop. `proxy.url` is its base URL; `proxy.answered_503` counts the 503s sent.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Literal

from tests.support.waiting import free_port

Mode = Literal["pass", "slowdown", "refuse"]

SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>fault-proxy</RequestId><HostId>fault-proxy</HostId></Error>"
)


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, *, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.port = port or free_port()
        self.answered_503 = 0
        self._mode: Mode = "pass"
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mode(self) -> Mode:
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        with self._lock:
            self._mode = mode
            self._drop_connections()
            if mode == "refuse":
                self._stop_listening()
            elif self._listener is None:
                self._listen()

    def start(self) -> FaultProxy:
        with self._lock:
            self._listen()
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_connections()
            self._stop_listening()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- listening -------------------------------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="fault-proxy-accept").start()

    def _stop_listening(self) -> None:
        if self._listener is not None:
            # shutdown wakes the thread blocked in accept(); close alone may not on Linux
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None

    def _drop_connections(self) -> None:
        for conn in list(self._open):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._open.clear()

    def _track(self, conn: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                conn.close()
                return False
            self._open.add(conn)
            return True

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: refuse mode or close()
            if not self._track(client):
                return
            mode = self._mode
            handler = self._slowdown if mode == "slowdown" else self._pass
            threading.Thread(target=handler, args=(client,), daemon=True, name="fault-proxy-conn").start()

    # -- modes -----------------------------------------------------------------------------------------

    def _pass(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        if not self._track(upstream):
            client.close()
            return
        threading.Thread(target=_pump, args=(upstream, client), daemon=True, name="fault-proxy-pump").start()
        _pump(client, upstream)

    def _slowdown(self, client: socket.socket) -> None:
        """Read one request (headers, then the body unless the client waits for `100 Continue`) and answer
        503 SlowDown, closing the connection, as S3 does under throttling."""
        try:
            buffer = b""
            while b"\r\n\r\n" not in buffer:
                chunk = client.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, _, body = buffer.partition(b"\r\n\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.decode("latin-1").partition(":") for line in head.split(b"\r\n")[1:])}
            if headers.get("expect", "").lower() != "100-continue":
                if "content-length" in headers:
                    length = int(headers["content-length"])
                    while len(body) < length:
                        chunk = client.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                elif "chunked" in headers.get("transfer-encoding", "").lower():
                    while not body.endswith(b"0\r\n\r\n"):
                        chunk = client.recv(65536)
                        if not chunk:
                            break
                        body += chunk
            reply = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                     b"Content-Length: " + str(len(SLOWDOWN_BODY)).encode() + b"\r\nConnection: close\r\n\r\n"
                     + SLOWDOWN_BODY)
            client.sendall(reply)
            self.answered_503 += 1
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


__all__ = ["SLOWDOWN_BODY", "FaultProxy", "Mode"]
