"""A team reads its spend (`GET /v1/spend`, `batchyard spend`) from a real `batchyard serve`: per day and route,
the cost and tokens the ledger counted; JSON and CSV; its own key reads its own, the master key any team's, and
another team's is not found. A team's webhook hears `team.budget_threshold` once per fraction of its budget
(`budget_alerts`) and period, embedded and shared (one redis-server, a 3-master cluster). The report on Redis
is read by each key in tests/servers/test_worker_killed_holding.py."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fakes.upstream.server import Upstream
from tests.fakes.webhook_receiver import Receiver
from tests.support.server_helpers import REPO_ROOT, gateway_config, submit
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisClusterServers, process_env
from tests.support.team_helpers import MODEL, MODES, finished, lines, serve, until

PRICE = 0.001  # USD per token in and out: a line is 3 + 4 tokens, 0.007 USD
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"], "max_budget": 10.0},
         {"team_id": "beta", "api_keys": ["sk-beta"]},
         {"team_id": "gamma", "api_keys": ["sk-gamma"], "max_budget": 100.0, "budget_reservation": "estimate"}]


def _config(upstream: Upstream) -> dict[str, Any]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, shard_size=10, master_key="sk-admin")
    config["model_list"][0]["model_info"] = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    return config


def _spend(url: str, key: str, **params: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/spend", params=params, headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_each_key_reads_the_spend_it_may(upstream: Upstream, tmp_path: Path) -> None:
    with serve("embedded", _config(upstream), tmp_path / "data") as gw:
        for key, n in (("sk-alpha", 5), ("sk-beta", 2)):
            batch = submit(gw.client(key), lines(n, key, sleep_ms=0))
            assert until(gw, key, batch.id, finished).status == "completed"
        today = time.strftime("%Y-%m-%d", time.gmtime())

        own = _spend(gw.url, "sk-alpha")
        assert own.status_code == 200, own.text
        body = own.json()
        assert body["object"] == "list" and body["has_more"] is False
        assert [(r["team"], r["day"], r["route"], r["requests"], r["input_tokens"], r["output_tokens"])
                for r in body["data"]] == [("alpha", today, MODEL, 5, 15, 20)]
        assert body["data"][0]["cost_usd"] == pytest.approx(5 * 7 * PRICE)
        assert body["data"][0]["reserved_usd"] == 0.0

        by_route = _spend(gw.url, "sk-alpha", group_by="route", start=today).json()["data"]
        assert [(r["day"], r["route"], r["requests"]) for r in by_route] == [(None, MODEL, 5)]
        past = _spend(gw.url, "sk-alpha", start="2020-01-01", end="2020-01-02").json()
        assert past["data"] == [] and past["total_cost_usd"] == 0

        # a team's key reads no other team's; the master key reads one team's, or every team's
        other = _spend(gw.url, "sk-alpha", team="beta")
        assert other.status_code == 404 and other.json()["error"]["param"] == "team"
        assert _spend(gw.url, "sk-admin", team="nobody").status_code == 404
        beta = _spend(gw.url, "sk-admin", team="beta").json()["data"]
        assert [(r["team"], r["requests"]) for r in beta] == [("beta", 2)]
        every = _spend(gw.url, "sk-admin", group_by="day").json()["data"]
        assert sorted((r["team"], r["requests"]) for r in every) == [("alpha", 5), ("beta", 2)]  # gamma: none yet

        bad = _spend(gw.url, "sk-alpha", group_by="week")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"
        assert _spend(gw.url, "sk-alpha", start="yesterday").json()["error"]["param"] == "start"

        as_csv = httpx.get(f"{gw.url}/v1/spend", headers={"authorization": "Bearer sk-alpha", "accept": "text/csv"})
        assert as_csv.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(as_csv.text)))
        assert [(r["team"], r["route"], r["requests"], r["input_tokens"]) for r in rows] == [
            ("alpha", MODEL, "5", "15")]
        assert float(rows[0]["cost_usd"]) == pytest.approx(5 * 7 * PRICE)

        # a running batch's hold is in the report while it runs, and gone once it ends
        slow = [{**line, "body": {**line["body"], "max_tokens": 10}} for line in lines(2, "slow", sleep_ms=4000)]
        held = submit(gw.client("sk-gamma"), slow)
        running = _spend(gw.url, "sk-gamma").json()
        assert running["total_reserved_usd"] > 0 and sum(r["reserved_usd"] for r in running["data"]) == pytest.approx(
            running["total_reserved_usd"])
        assert until(gw, "sk-gamma", held.id, finished).status == "completed"
        assert _spend(gw.url, "sk-gamma").json()["total_reserved_usd"] == 0

        # the CLI prints the same table, and the same CSV
        env = process_env({"OPENAI_API_KEY": "sk-alpha"})
        cmd = [sys.executable, "-m", "gateway.cli", "spend", "--base-url", f"{gw.url}/v1"]
        shown = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        header, row, total = shown.stdout.splitlines()
        assert header.split() == ["team", "day", "route", "requests", "input_tokens", "output_tokens", "cost_usd",
                                  "reserved_usd"]
        assert row.split() == ["alpha", today, MODEL, "5", "15", "20", f"{5 * 7 * PRICE:.6f}", "0.000000"]
        assert total.startswith(f"total cost {5 * 7 * PRICE:.6f} USD")
        printed = subprocess.run([*cmd, "--csv"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert printed.returncode == 0 and printed.stdout == as_csv.text
        refused = subprocess.run([*cmd, "--team", "beta"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 1 and "404" in refused.stderr
        assert os.environ.get("OPENAI_API_KEY") != "sk-alpha"  # the key went to the child only


SECRET = "whsec_" + "c3BlbmQtYWxlcnRzLXNlY3JldC1vZi0zMi1ieXRlcyE="


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    if not HAVE_REDIS:
        pytest.skip(NO_REDIS_REASON)
    servers = RedisClusterServers(3).start()
    yield servers
    servers.close()


@pytest.mark.parametrize("mode", [*MODES, pytest.param("cluster", marks=pytest.mark.redis)])
def test_the_budget_alerts_reach_the_webhook_once_each(
    mode: str, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Embedded (SQLite), shared over one redis-server, and shared over a 3-master cluster."""
    redis_url = None
    if mode == "cluster":
        servers: RedisClusterServers = request.getfixturevalue("cluster")
        servers.flush()
        mode, redis_url = "shared", servers.url
    monkeypatch.setenv("SPEND_ALERT_SECRET", SECRET)
    receiver = Receiver(SECRET).start()
    try:
        config = _config(upstream)
        config["batch_settings"]["teams"] = [
            {"team_id": "alpha", "api_keys": ["sk-alpha"], "max_budget": 0.05, "webhook_url": receiver.url,
             "webhook_secret": "os.environ/SPEND_ALERT_SECRET"},
            {"team_id": "beta", "api_keys": ["sk-beta"], "max_budget": 0.05, "budget_alerts": [0.5],
             "webhook_url": receiver.url, "webhook_secret": "os.environ/SPEND_ALERT_SECRET",
             "webhook_events": ["batch.completed"]}]  # beta wants no budget alerts
        with serve(mode, config, tmp_path / "data", redis_url=redis_url) as gw:
            alpha = gw.client("sk-alpha")
            first = submit(alpha, lines(6, "most", sleep_ms=0))  # 0.042 USD: past 80%, short of 100%
            assert until(gw, "sk-alpha", first.id, finished).status == "completed"
            got = receiver.wait_for(lambda es: any(e.type == "team.budget_threshold" for e in es))
            assert [e.data.threshold for e in got if e.type == "team.budget_threshold"] == [0.8]
            second = submit(alpha, lines(4, "rest", sleep_ms=0))  # crosses the budget: it stops there
            assert until(gw, "sk-alpha", second.id, finished).status == "completed"
            with pytest.raises(openai.RateLimitError):
                submit(alpha, lines(1, "over"))
            beta = submit(gw.client("sk-beta"), lines(6, "beta", sleep_ms=0))  # past its 50%: not wanted
            assert until(gw, "sk-beta", beta.id, finished).status == "completed"
            receiver.wait_for(lambda es: sum(e.type == "team.budget_threshold" for e in es) >= 2)
            receiver.wait_for(lambda es: len(es) > 10, timeout=4)  # more passes of the sender: nothing more
            alerts = [e for e in receiver.events if e.type == "team.budget_threshold"]
            assert [(e.data.team, e.data.threshold) for e in alerts] == [("alpha", 0.8), ("alpha", 1.0)]
            assert alerts[1].data.max_budget == 0.05 and alerts[1].data.spend_usd >= 0.05
            assert alerts[0].data.period_start == alerts[1].data.period_start
            assert len({h["webhook-id"] for h in receiver.headers}) == len(receiver.headers)  # none twice
            assert not receiver.refused
    finally:
        receiver.stop()
