"""Batch webhooks end to end: a real server process, real receivers on loopback that verify every
delivery with the `openai` SDK's `webhooks.unwrap`, and the loopback upstream behind the gateway.

Each team's events go to its own URL only, signed with its own secret (read from the environment);
a receiver that fails is retried, and a delivery still pending when the server stops is sent by the
next server on the same data directory."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus
from gateway.runtime.runtime import open_embedded
from gateway.store.records import BatchRecord
from tests.fakes.upstream.server import Upstream
from tests.fakes.webhook_receiver import Receiver
from tests.support.server_helpers import Gateway, chat_line, gateway_config, start_gateway, submit, wait_batch
from tests.support.waiting import eventually

KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-0123456789", "gamma": "sk-gamma-0123456789",
        "delta": "sk-delta-0123456789"}
SECRETS = {team: "whsec_" + base64.b64encode(f"{team}-secret-of-32-bytes-long!!".encode()[:32]).decode()
           for team in ("alpha", "beta", "delta", "solo")}
RETRY = {"retry_delays_seconds": [0.3], "give_up_after_seconds": 600, "timeout_seconds": 5}


def _team(team: str, receiver: Receiver | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"team_id": team, "api_keys": [KEYS.get(team, f"sk-{team}-0123456789")]}
    if receiver is not None:
        entry |= {"webhook_url": receiver.url, "webhook_secret": f"os.environ/WEBHOOK_SECRET_{team.upper()}"}
    return entry


@pytest.fixture(scope="module", autouse=True)
def secrets_in_env() -> Iterator[None]:
    names = {f"WEBHOOK_SECRET_{team.upper()}": secret for team, secret in SECRETS.items()}
    os.environ.update(names)
    yield
    for name in names:
        os.environ.pop(name, None)


@pytest.fixture(scope="module")
def receivers() -> Iterator[dict[str, Receiver]]:
    found = {"alpha": Receiver(SECRETS["alpha"]).start(), "beta": Receiver(SECRETS["beta"]).start(),
             "delta": Receiver(SECRETS["delta"], fail_first=2).start()}
    yield found
    for receiver in found.values():
        receiver.stop()


@pytest.fixture(scope="module")
def gw(
    upstream: Upstream, receivers: dict[str, Receiver], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    teams = [_team("alpha", receivers["alpha"]), _team("beta", receivers["beta"]), _team("gamma", None),
             _team("delta", receivers["delta"])]
    config = gateway_config(upstream, models=["gpt-mini"], teams=teams, completion_windows={"3s": 3}, webhooks=RETRY)
    with start_gateway(config, tmp_path_factory.mktemp("hooks") / "data") as gateway:
        yield gateway
        log = gateway.log()
    assert not any(secret in log for secret in SECRETS.values()), "a webhook secret was logged"


def _client(gw: Gateway, team: str) -> OpenAI:
    return gw.client(KEYS[team])


def _good(n: int) -> dict[str, Any]:
    return chat_line(f"ok{n}", "gpt-mini", f"fine {n}")


def test_each_event_kind_reaches_the_teams_endpoint(gw: Gateway, receivers: dict[str, Receiver]) -> None:
    alpha = _client(gw, "alpha")
    slow = [chat_line(f"s{i}", "gpt-mini", f"#sleep:4000 slow {i}") for i in range(2)]
    completed = submit(alpha, [_good(1), _good(2)])
    failed = submit(alpha, ['{"custom_id": '])
    cancelled = submit(alpha, slow)
    expired = submit(alpha, slow, completion_window="3s")
    wait_batch(alpha, cancelled.id, statuses={"in_progress"})
    alpha.batches.cancel(cancelled.id)
    want = {completed.id: "completed", failed.id: "failed", cancelled.id: "cancelled", expired.id: "expired"}
    for batch_id, status in want.items():
        assert wait_batch(alpha, batch_id, timeout=60).status == status

    receiver = receivers["alpha"]
    receiver.wait_for(lambda events: {e.data.id for e in events} >= set(want))
    time.sleep(1.5)  # a duplicate would come within a retry delay or two
    for batch_id, status in want.items():
        assert receiver.batch_events(batch_id) == [f"batch.{status}"], (batch_id, receiver.events)
    assert receiver.refused == []
    for event, headers in zip(receiver.events, receiver.headers, strict=True):
        assert event.object == "event" and event.id.startswith("evt_") and event.created_at > 0
        assert headers["webhook-id"].startswith("wh_") and headers["content-type"] == "application/json"
    log = gw.log()
    for batch_id in want:
        assert any(batch_id in line and "delivered" in line for line in log.splitlines()), batch_id


def test_a_failing_receiver_is_retried_until_it_answers(gw: Gateway, receivers: dict[str, Receiver]) -> None:
    delta = _client(gw, "delta")
    batch = submit(delta, [_good(1)])
    assert wait_batch(delta, batch.id).status == "completed"
    receiver = receivers["delta"]
    receiver.wait_for(lambda events: bool(events))
    assert receiver.statuses == [500, 500, 200]  # at least once: the same event, retried with backoff
    assert receiver.batch_events(batch.id) == ["batch.completed"]
    cookie = {"Cookie": _login(gw, KEYS["delta"])}
    page = gw.http("GET", "/ui", headers=cookie).text
    assert "Webhook deliveries" in page and batch.id in page and "HTTP 200" in page
    deliveries = gw.http("GET", "/ui/api/webhooks", headers=cookie).json()["data"]
    assert [(d["batch_id"], d["type"], d["state"], d["attempts"], d["last_status"]) for d in deliveries] == [
        (batch.id, "batch.completed", "delivered", 3, 200)]
    assert not any(SECRETS["delta"] in str(d) for d in deliveries)


def test_another_teams_events_never_reach_this_url(gw: Gateway, receivers: dict[str, Receiver]) -> None:
    beta_batch = submit(_client(gw, "beta"), [_good(1)])
    gamma_batch = submit(_client(gw, "gamma"), [_good(1)])  # gamma has no webhook
    for team, batch in (("beta", beta_batch), ("gamma", gamma_batch)):
        assert wait_batch(_client(gw, team), batch.id).status == "completed"
    receivers["beta"].wait_for(lambda events: any(e.data.id == beta_batch.id for e in events))
    time.sleep(1.5)
    assert receivers["beta"].batch_events(beta_batch.id) == ["batch.completed"]
    for name, receiver in receivers.items():
        assert receiver.batch_events(gamma_batch.id) == [], name
        if name != "beta":
            assert receiver.batch_events(beta_batch.id) == [], name
    assert all(e.data.id != beta_batch.id for e in receivers["alpha"].events)


def test_a_pending_delivery_survives_a_restart(upstream: Upstream, tmp_path: Path) -> None:
    receiver = Receiver(SECRETS["solo"])  # down: its port is reserved, nothing listens yet
    config = gateway_config(upstream, models=["gpt-mini"], teams=[_team("solo", receiver)], webhooks=RETRY)
    data_dir = tmp_path / "data"
    with start_gateway(config, data_dir) as first:
        client = first.client("sk-solo-0123456789")
        batch = submit(client, [_good(1)])
        assert wait_batch(client, batch.id).status == "completed"
        # an attempt was made and failed: the delivery is pending
        eventually(lambda: "ConnectError" in first.log(), 20, "a failed attempt", interval=0.1, detail=first.log)
        pending = first.http("GET", "/ui/api/webhooks", headers={"Cookie": _login(first, "sk-solo-0123456789")})
        assert [(d["state"], d["last_status"]) for d in pending.json()["data"]] == [("pending", None)]
        assert first.stop() in (0, -15)
    receiver.start()
    try:
        with start_gateway(config, data_dir) as again:
            events = receiver.wait_for(lambda events: bool(events))
            assert [(e.type, e.data.id) for e in events] == [("batch.completed", batch.id)]
            # the sender logs the delivery once the receiver has answered: a moment after it got the event
            eventually(lambda: "delivered" in again.log(), 10, "the delivery logged", detail=again.log)
    finally:
        receiver.stop()


async def test_a_batch_that_expires_while_validating_is_announced_expired(upstream: Upstream, tmp_path: Path) -> None:
    # Left `validating` past its expiry (its validation died): the sweep hands it to the intake, which ends it
    # `expired` and records the team's event first, as the finalizer does for a batch that ran.
    receiver = Receiver(SECRETS["solo"])  # never started: the event is only recorded here
    config = parse_config(gateway_config(upstream, models=["gpt-mini"], teams=[_team("solo", receiver)],
                                         webhooks=RETRY))
    runtime = await open_embedded(config, tmp_path / "data")
    try:
        now = int(time.time())
        await runtime.store.batches.put(BatchRecord(
            id="batch_left_validating", owner="solo", endpoint="/v1/chat/completions", input_file_id="file-gone",
            completion_window="24h", status=BatchStatus.VALIDATING, created_at=now - 60, expires_at=now - 1))
        await runtime.sweeper.sweep()
        batch = await runtime.store.batches.get("batch_left_validating")
        assert batch is not None and (batch.status, batch.expired_at is not None) == (BatchStatus.EXPIRED, True)
        [event] = await runtime.store.webhooks.recent("solo", 10)
        assert (event.batch_id, event.type, event.state) == ("batch_left_validating", "batch.expired", "pending")
    finally:
        await runtime.aclose()


def _login(gw: Gateway, key: str) -> str:
    reply = gw.http("POST", "/ui/login", data={"api_key": key}, headers={"Origin": gw.url},
                    follow_redirects=False)
    assert reply.status_code in (302, 303), reply.text
    cookie = reply.headers["set-cookie"].split(";", 1)[0]
    return cookie
