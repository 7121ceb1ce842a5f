"""Names never collide: a team's id is only ever its own name.

Team ids match one pattern, checked when the config loads. Every Redis key built from a team id lives
in a family no fixed key shares, so teams named after the fixed keys (`active`, `all`, `due`, and the
new fixed keys' own names) see only their own batches, files and webhook deliveries; every list
re-checks the owner of what it returns. An older deployment's fixed keys are moved at start.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus
from gateway.runtime.runtime import open_shared
from gateway.store.records import BatchRecord
from gateway.store.redis.keys import Keys
from gateway.store.webhook_deliveries import PENDING, WebhookDelivery
from tests.fakes.upstream.server import Upstream
from tests.fakes.webhook_receiver import Receiver
from tests.servers.test_redis_migration import previous_layout
from tests.support.server_helpers import REPO_ROOT, Gateway, chat_line, gateway_config, submit, wait_batch
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer
from tests.support.team_helpers import start_shared

MASTER = "sk-master-names-0123456789"
# Named after the fixed keys, old (`batches:active`, `webhooks:all`, `webhooks:due`) and new
# (`active-batches`, `webhooks-due`, `webhooks-all`, `batch-seq`, ...), and one plain team.
TEAMS = ["active", "all", "due", "active-batches", "webhooks-due", "batch-seq", "alpha"]


def _key(team: str) -> str:
    return f"sk-{team}-0123456789"


def _secret(team: str) -> str:
    return "whsec_" + base64.b64encode(f"{team}-webhook-secret-32-bytes-long!!".encode()[:32]).decode()


def _env(team: str) -> str:
    return "NAMES_WEBHOOK_SECRET_" + team.upper().replace("-", "_")


# -- team ids: one pattern, checked at load ------------------------------------------------------------

@pytest.mark.parametrize("team_id", ["a:b", "batches:x", "-dash-first", "with space", "x" * 65, "é", "a/b"])
def test_a_team_id_outside_the_pattern_is_refused_at_load_naming_the_team(team_id: str, tmp_path: Path) -> None:
    """`batchyard serve` refuses the config before it starts, with the key and the team named."""
    config = {"model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "sk-x"}}],
              "batch_settings": {"teams": [{"team_id": "fine", "api_keys": ["sk-fine-0123"]},
                                           {"team_id": team_id, "api_keys": ["sk-bad-0123"]}]}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", "9"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode != 0
    assert "batch_settings.teams[1].team_id" in done.stderr, done.stderr
    assert repr(team_id) in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("team_id", ["active", "all", "due", "a", "A.b_c-9", "x" * 64])
def test_a_team_id_in_the_pattern_loads(team_id: str) -> None:
    config = parse_config({"model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m"}}],
                           "batch_settings": {"teams": [{"team_id": team_id}]}})
    assert [t.team_id for t in config.batch.teams] == [team_id]


# -- teams named after the fixed keys, in Redis mode ---------------------------------------------------

@pytest.fixture(scope="module")
def receivers() -> Iterator[dict[str, Receiver]]:
    found = {team: Receiver(_secret(team)).start() for team in TEAMS}
    yield found
    for receiver in found.values():
        receiver.stop()


@pytest.fixture(scope="module")
def gw(
    upstream: Upstream, receivers: dict[str, Receiver], redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    teams = [{"team_id": t, "api_keys": [_key(t)], "webhook_url": receivers[t].url,
              "webhook_secret": f"os.environ/{_env(t)}"} for t in TEAMS]
    config = gateway_config(upstream, models=["gpt-mini"], master_key=MASTER, teams=teams,
                            webhooks={"retry_delays_seconds": [0.3], "give_up_after_seconds": 600,
                                      "timeout_seconds": 5})
    env = {_env(t): _secret(t) for t in TEAMS}
    os.environ.update(env)  # the config reads them; the server process inherits them
    try:
        with start_shared(config, tmp_path_factory.mktemp("names") / "data", redis_server.url, env=env) as server:
            yield server
    finally:
        for name in env:
            os.environ.pop(name, None)


@pytest.fixture(scope="module")
def batches(gw: Gateway) -> dict[str, str]:
    """One batch per team, still running (each line waits 10 s upstream) when the lists below are read: seven
    uploads and creates take a few seconds on a loaded machine, and a 3-s line had ended before the last."""
    return {t: submit(gw.client(_key(t)), [chat_line(f"{t}-1", "gpt-mini", f"#sleep:10000 {t}")]).id for t in TEAMS}


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
def test_each_team_lists_only_its_own_batches_and_files_while_they_run(gw: Gateway, batches: dict[str, str]) -> None:
    """A team named `active` is not shown every team's unfinished batches (the old `batches:active`)."""
    for team in TEAMS:
        client = gw.client(_key(team))
        listed = [b.id for b in client.batches.list()]
        assert listed == [batches[team]], (team, listed)
        assert all(b.status != "completed" for b in client.batches.list())  # read while running
        files = client.files.list()
        assert len(files.data) == 1 and files.data[0].filename == "input.jsonl", (team, files)
        for other in TEAMS:
            if other != team:
                assert client.batches.retrieve(batches[team]).id == batches[team]
                assert gw.http("GET", f"/v1/batches/{batches[other]}", key=_key(team)).status_code == 404
    admin = gw.client(MASTER)
    assert [b.id for b in admin.batches.list()] == []  # the admin key owns none of them


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
def test_each_team_sees_only_its_own_webhook_deliveries(
    gw: Gateway, batches: dict[str, str], receivers: dict[str, Receiver]
) -> None:
    """A team named `all` or `due` is not shown every team's deliveries (the old `webhooks:all`,
    `webhooks:due`); the admin's view still has every team's."""
    for team, batch_id in batches.items():
        assert wait_batch(gw.client(_key(team)), batch_id, timeout=60).status == "completed"
    for team, receiver in receivers.items():
        wanted = batches[team]
        receiver.wait_for(lambda events, wanted=wanted: any(e.data.id == wanted for e in events))  # type: ignore[misc]
    for team in TEAMS:
        deadline = time.monotonic() + 20
        while True:
            seen = gw.http("GET", "/ui/api/webhooks", headers={"Cookie": _login(gw, _key(team))}).json()["data"]
            if (seen and seen[0]["state"] == "delivered") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [(d["team"], d["batch_id"], d["state"]) for d in seen] == [(team, batches[team], "delivered")], team
        assert not any(_secret(t) in str(seen) for t in TEAMS)
        assert [e.data.id for e in receivers[team].events] == [batches[team]]  # its own events only
    everything = gw.http("GET", "/ui/api/webhooks", headers={"Cookie": _login(gw, MASTER)}).json()["data"]
    assert {(d["team"], d["batch_id"]) for d in everything} == set(batches.items())
    log = gw.log()
    assert not any(_secret(t) in log for t in TEAMS), "a webhook secret was logged"


def _login(gw: Gateway, key: str) -> str:
    reply = gw.http("POST", "/ui/login", data={"api_key": key}, headers={"Origin": gw.url},
                    follow_redirects=False)
    assert reply.status_code in (302, 303), reply.text
    return str(reply.headers["set-cookie"].split(";", 1)[0])


# -- an older deployment's keys ------------------------------------------------------------------------

def _batch(batch_id: str, owner: str, status: BatchStatus) -> BatchRecord:
    now = int(time.time())
    return BatchRecord(id=batch_id, owner=owner, endpoint="/v1/chat/completions", input_file_id="file-in",
                       completion_window="24h", status=status, created_at=now, expires_at=now + 3600)


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
async def test_an_older_deployments_fixed_keys_are_moved_at_start(redis_server: RedisServer, tmp_path: Path) -> None:
    """Where the old `batches:active` and `webhooks:due` (also team `active`'s and team `due`'s lists) held
    every team's: after a start, the new fixed sets have them, and the old keys keep only their team's own."""
    config = parse_config({"model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m"}}],
                           "batch_settings": {"teams": [{"team_id": "active"}, {"team_id": "alpha"}]}})
    prefix = "upgrade-test:"
    keys, raw = Keys(prefix), redis_server.client()
    first = await open_shared(config, redis_server.url, tmp_path / "blobs", prefix=prefix)
    try:
        await first.store.batches.put(_batch("batch_alpha_running", "alpha", BatchStatus.IN_PROGRESS))
        await first.store.batches.put(_batch("batch_active_done", "active", BatchStatus.COMPLETED))
        await first.store.batches.put(_batch("batch_active_running", "active", BatchStatus.IN_PROGRESS))
        delivery = WebhookDelivery("wh_alpha", "evt_alpha", "alpha", "batch_alpha_running", "batch.completed",
                                   int(time.time()), next_at=time.time() - 1)
        await first.store.webhooks.add(delivery)
    finally:
        await first.aclose()
    # What an older version left: its keys untagged (the previous layout), and its fixed sets at the
    # team-shaped names, mixed with team `active`'s list.
    previous_layout(raw, prefix)
    for new, old in (("active-batches", "batches:active"), ("webhooks-due", "webhooks:due"),
                     ("webhooks-all", "webhooks:all")):
        held: list[tuple[str, float]] = raw.zrange(prefix + new, 0, -1, withscores=True)  # type: ignore[assignment]
        raw.zadd(prefix + old, dict(held))
        raw.delete(prefix + new)

    again = await open_shared(config, redis_server.url, tmp_path / "blobs", prefix=prefix)
    try:
        assert {b.id for b in await again.store.batches.active()} == {"batch_alpha_running", "batch_active_running"}
        assert [b.id for b in (await again.store.batches.page("active", limit=10, after=None)).data] == [
            "batch_active_running", "batch_active_done"]
        assert [d.id for d in await again.store.webhooks.due(time.time(), 10)] == ["wh_alpha"]
        assert [d.id for d in await again.store.webhooks.recent(None, 10)] == ["wh_alpha"]
        assert await again.store.webhooks.recent("due", 10) == []
        assert [(d.id, d.state) for d in await again.store.webhooks.recent("alpha", 10)] == [("wh_alpha", PENDING)]
    finally:
        await again.aclose()
    assert set(raw.zrange(keys.batches("active"), 0, -1)) == {
        "batch_active_running", "batch_active_done"}  # team `active`'s own list, as it always was
    assert not raw.exists(keys.webhooks("due")) and not raw.exists(keys.webhooks("all"))
