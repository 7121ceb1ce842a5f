"""Nothing a receiver sends can hurt the sender.

Webhook receivers are not trusted (a team runs them, or points `webhook_url` anywhere). A reply is read
up to a small cap, each attempt has one total deadline, and redirects are never followed: a receiver
that streams an endless body, trickles a byte at a time or redirects elsewhere costs the sender one
failed attempt of bounded time, recorded and retried like any other, and the redirect's target gets
nothing. Another team's deliveries go on meanwhile. A webhook secret is never shown or logged.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gateway.webhooks.sender import MAX_REPLY_BYTES
from tests.fakes.upstream.server import Upstream
from tests.fakes.webhook_receiver import Receiver
from tests.support.server_helpers import Gateway, chat_line, gateway_config, start_gateway, submit, wait_batch
from tests.support.waiting import eventually, free_port

DEADLINE = 2.0  # batch_settings.webhooks.timeout_seconds below: one attempt's total deadline
TEAMS = ("endless", "trickle", "redirect", "good")


def _key(team: str) -> str:
    return f"sk-{team}-0123456789"


def _secret(team: str) -> str:
    return "whsec_" + base64.b64encode(f"{team}-receivers-secret-32-bytes!!!".encode()[:32]).decode()


class HostileReceiver:
    """A loopback HTTP server that answers every POST in one hostile way:

    - `endless`: 200, then body bytes for ever (until the sender hangs up);
    - `trickle`: 200 with a 1 MB Content-Length, then one byte every 0.1 s;
    - `redirect`: 307 to `location` (another listener, which must get nothing).
    """

    def __init__(self, mode: str, location: str = "") -> None:
        self.mode, self.location, self.port = mode, location, free_port()
        self.posts = 0
        self.sent: list[int] = []  # body bytes written per request, once the sender hung up
        self.hung_up_after: list[float] = []  # seconds from the request to the sender hanging up
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> HostileReceiver:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                owner.posts += 1
                started, sent = time.monotonic(), 0
                try:
                    if owner.mode == "redirect":
                        self.send_response(307)
                        self.send_header("Location", owner.location)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(200)
                    self.send_header("Content-Length", str(10**6 if owner.mode == "trickle" else 10**12))
                    self.end_headers()
                    block = b"x" * (16384 if owner.mode == "endless" else 1)
                    while time.monotonic() - started < 60:
                        self.wfile.write(block)
                        self.wfile.flush()
                        sent += len(block)
                        if owner.mode == "trickle":
                            time.sleep(0.1)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                owner.sent.append(sent)
                owner.hung_up_after.append(time.monotonic() - started)
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture(scope="module")
def target() -> Iterator[Receiver]:
    """Where the redirect points: a real receiver that would verify and keep anything it got."""
    receiver = Receiver(_secret("redirect")).start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def receivers(target: Receiver) -> Iterator[dict[str, Any]]:
    found: dict[str, Any] = {"endless": HostileReceiver("endless").start(),
                             "trickle": HostileReceiver("trickle").start(),
                             "redirect": HostileReceiver("redirect", location=target.url).start(),
                             "good": Receiver(_secret("good")).start()}
    yield found
    for receiver in found.values():
        receiver.stop()


@pytest.fixture(scope="module")
def gw(upstream: Upstream, receivers: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = {f"HOSTILE_SECRET_{t.upper()}": _secret(t) for t in TEAMS}
    teams = [{"team_id": t, "api_keys": [_key(t)], "webhook_url": receivers[t].url,
              "webhook_secret": f"os.environ/HOSTILE_SECRET_{t.upper()}"} for t in TEAMS]
    config = gateway_config(upstream, models=["gpt-mini"], teams=teams,
                            webhooks={"retry_delays_seconds": [30], "give_up_after_seconds": 600,
                                      "timeout_seconds": DEADLINE})
    os.environ.update(env)
    try:
        with start_gateway(config, tmp_path_factory.mktemp("hostile") / "data") as gateway:
            yield gateway
            log = gateway.log()
    finally:
        for name in env:
            os.environ.pop(name, None)
    assert not any(_secret(t) in log for t in TEAMS), "a webhook secret was logged"


@pytest.fixture(scope="module")
def deliveries(gw: Gateway) -> dict[str, dict[str, Any]]:
    """One completed batch per team; each team's first delivery attempt, as its dashboard shows it."""
    batches = {t: submit(gw.client(_key(t)), [chat_line(f"{t}-1", "gpt-mini", t)]).id for t in TEAMS}
    for team, batch_id in batches.items():
        assert wait_batch(gw.client(_key(team)), batch_id, timeout=60).status == "completed"
    finished_at = time.monotonic()
    found: dict[str, dict[str, Any]] = {}
    while len(found) < len(TEAMS):
        for team in set(TEAMS) - set(found):
            [d] = gw.http("GET", "/ui/api/webhooks", headers={"Cookie": _login(gw, _key(team))}).json()["data"]
            if d["attempts"] >= 1:
                found[team] = d | {"recorded_within": time.monotonic() - finished_at, "batch": batches[team]}
        # every attempt is over in its deadline (plus the sender's pass interval and slack for a busy machine)
        assert time.monotonic() - finished_at < DEADLINE + 15, f"attempts still running: {set(TEAMS) - set(found)}"
        time.sleep(0.1)
    return found


def test_an_endless_reply_is_cut_at_the_cap_and_the_attempt_fails(
    deliveries: dict[str, dict[str, Any]], receivers: dict[str, Any]
) -> None:
    d = deliveries["endless"]
    assert (d["state"], d["attempts"], d["last_status"]) == ("pending", 1, 200)  # failed: retried later
    assert f"over {MAX_REPLY_BYTES} bytes" in d["last_error"]
    receiver: HostileReceiver = receivers["endless"]
    eventually(lambda: receiver.sent, 10, "the sender to hang up on the endless body")  # the receiver's writes failed
    assert receiver.hung_up_after[0] < DEADLINE + 1


def test_a_trickling_reply_ends_at_the_attempts_deadline(
    deliveries: dict[str, dict[str, Any]], receivers: dict[str, Any]
) -> None:
    """One byte every 0.1 s never trips a per-read timeout; the attempt's deadline ends it."""
    d = deliveries["trickle"]
    assert (d["state"], d["attempts"], d["last_status"]) == ("pending", 1, None)
    assert d["last_error"] == f"no reply within {DEADLINE:g}s"
    receiver: HostileReceiver = receivers["trickle"]
    eventually(lambda: receiver.sent, 10, "the sender to hang up on the trickle")
    assert DEADLINE - 0.5 < receiver.hung_up_after[0] < DEADLINE + 1.5
    assert receiver.sent[0] < 100  # a couple dozen bytes, not the megabyte it announced


def test_a_redirect_is_not_followed_and_its_target_gets_nothing(
    deliveries: dict[str, dict[str, Any]], receivers: dict[str, Any], target: Receiver
) -> None:
    d = deliveries["redirect"]
    assert (d["state"], d["attempts"], d["last_status"], d["last_error"]) == ("pending", 1, 307, "HTTP 307")
    assert receivers["redirect"].posts == 1
    time.sleep(0.5)
    assert target.events == [] and target.statuses == []  # not one request reached the redirect's target


def test_other_teams_deliveries_go_on_and_no_secret_is_shown(
    gw: Gateway, deliveries: dict[str, dict[str, Any]], receivers: dict[str, Any]
) -> None:
    good = deliveries["good"]
    assert (good["state"], good["attempts"], good["last_status"]) == ("delivered", 1, 200)
    assert [e.data.id for e in receivers["good"].events] == [good["batch"]]
    for team in TEAMS:
        page = gw.http("GET", "/ui", headers={"Cookie": _login(gw, _key(team))}).text
        shown = str(deliveries[team]) + page
        assert not any(_secret(t) in shown for t in TEAMS)
    assert gw.alive()


def _login(gw: Gateway, key: str) -> str:
    reply = gw.http("POST", "/ui/login", data={"api_key": key}, headers={"Origin": gw.url},
                    follow_redirects=False)
    assert reply.status_code in (302, 303), reply.text
    return str(reply.headers["set-cookie"].split(";", 1)[0])
