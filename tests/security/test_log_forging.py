"""Nobody can forge a log line (issue 45, Must 5), against a real `batchyard serve`.

Without a key, a caller reaches the log through the access line of every request: its decoded path
(`%0a` is a line break once decoded), its query and its `X-Client-Request-Id`. Each is sent here with CR,
LF and ANSI escape sequences, on each door (OpenAI's, Anthropic's, the dashboard, `/metrics`, an unknown
path), with raw bytes where a client library would refuse them; the serve log must hold each request's text
on its one access line, its control characters escaped, and no line of the caller's.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway
from tests.support.waiting import eventually

FORGED = "2026-11-28 10:00:00,000 WARNING gateway.cli.serve: FORGED"
# percent-encoded in the path (decoded by the server), raw in the query and the header
PATH_TAILS = ["%0a" + FORGED.replace(" ", "%20"), "%0d%0a" + FORGED.replace(" ", "%20"),
              "%1b[2K%1b[1A%0d" + FORGED.replace(" ", "%20"), "%e2%80%a8" + FORGED.replace(" ", "%20")]
DOORS = ["/v1/nothing", "/v1/files/file-x", "/v1/messages/batches/msgbatch_x", "/ui/x", "/metrics", "/v1/batches"]


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(upstream, teams=[{"team_id": "alpha", "api_keys": ["sk-alpha-0123456789"]}],
                            models=["gpt-mini"])
    with start_gateway(config, tmp_path_factory.mktemp("logs") / "data") as server:
        yield server


def _raw(gw: Gateway, target: bytes, headers: bytes = b"") -> bytes:
    """One HTTP/1.1 request written byte for byte (httpx would refuse or encode some of these bytes)."""
    with socket.create_connection((gw.host, gw.port), timeout=10) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_caller_text_never_writes_a_line_of_the_log(gateway: Gateway) -> None:
    marks = []
    for door in DOORS:
        for n, tail in enumerate(PATH_TAILS):
            mark = f"m{len(marks)}"
            marks.append(mark)
            reply = _raw(gateway, f"{door}/{mark}{tail}?q={n}%0a{FORGED.replace(' ', '%20')}".encode())
            assert reply.startswith(b"HTTP/1.1 "), reply[:200]
    # the client's own request id, where a client sends it: a tab and obs-text are all HTTP lets through raw
    marks.append("client")
    _raw(gateway, b"/v1/nothing/client", b"X-Client-Request-Id: a\tb " + FORGED.encode() + b"\xc2\x85x\r\n")

    def logged() -> str:
        text = gateway.log()
        return text if all(f"/{m}" in text for m in marks[:-1]) and "/v1/nothing/client" in text else ""

    log = eventually(logged, timeout=15, what="every request's access line")
    lines = log.splitlines()
    forged = [line for line in lines if "FORGED" in line]
    assert len(forged) == len(marks), forged
    for line in forged:
        # each on its request's one access line, and nowhere else
        assert "batchyard.access" in line and "request_id=req_" in line, line
        assert not line.startswith("2026-11-28 10:00:00"), line
    assert "\x1b" not in log and "\r" not in log and "\u2028" not in log and "\x85" not in log
    first = next(line for line in forged if "/m0" in line)
    assert "/m0\\n2026-11-28 10:00:00,000 WARNING" in first and "?q=0%0a2026" in first, first
    ansi = next(line for line in forged if "/m2" in line)
    assert "\\x1b[2K\\x1b[1A\\r" in ansi, ansi
    client = next(line for line in forged if "/v1/nothing/client" in line)
    assert "client_request_id=a\\tb_2026-11-28_10:00:00,000_WARNING" in client, client

