"""Team budgets (`max_budget` USD, LiteLLM's name), in both modes with real processes: a batch that crosses
the budget stops sending (what was in flight finishes, the unrun lines get `budget_exceeded` error lines,
the batch completes); the team's next batch is refused with 429 `budget_exceeded`; the spend is in the
store, so a restarted gateway still refuses it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.api.dashboard.pages import COOKIE
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import gateway_config, submit
from tests.support.services import HAVE_REDIS, RedisServer
from tests.support.team_helpers import MODEL, MODES, finished, lines, metric, serve, start_shared, until

PRICE = 0.001  # USD per token, in and out: the upstream's reply to a line is 3 + 4 tokens, 0.007 USD
BUDGET = 0.1  # about 14 lines
TEAMS = [{"team_id": "thrifty", "api_keys": ["sk-thrifty"], "max_budget": BUDGET},
         {"team_id": "other", "api_keys": ["sk-other"]}]


def _config(upstream: Upstream) -> dict[str, Any]:
    config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, shard_size=20, max_concurrency=4,
                            master_key="sk-admin")
    config["model_list"][0]["model_info"] = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    return config


@pytest.mark.parametrize("mode", MODES)
def test_a_budget_crossed_mid_batch_stops_it_and_survives_a_restart(
    mode: str, upstream: Upstream, tmp_path: Path
) -> None:
    redis = RedisServer().start() if mode == "shared" and HAVE_REDIS else None
    redis_url = redis.url if redis is not None else None
    try:
        with serve(mode, _config(upstream), tmp_path / "data", redis_url=redis_url) as gw:
            client = gw.client("sk-thrifty")
            batch = submit(client, lines(60, "spend", sleep_ms=300))
            done = until(gw, "sk-thrifty", batch.id, finished)
            assert done.status == "completed" and done.request_counts is not None
            ran, stopped = done.request_counts.completed, done.request_counts.failed
            # It ran until the spend reached the budget (plus what was in flight and unrecorded), not further.
            assert BUDGET / (7 * PRICE) <= ran < 40 and ran + stopped == 60, done.request_counts
            errors = [json.loads(x) for x in client.files.content(done.error_file_id or "").text.splitlines()]
            assert len(errors) == stopped and {e["error"]["code"] for e in errors} == {"budget_exceeded"}
            with pytest.raises(openai.RateLimitError) as refused:
                submit(client, lines(1, "more"))
            assert refused.value.response.json()["error"]["code"] == "budget_exceeded"
            spend = metric(gw, "batchyard_team_spend_usd", team="thrifty")
            assert spend is not None and BUDGET <= spend <= ran * 7 * PRICE + 1e-9  # what ran, counted once
            assert metric(gw, "batchyard_team_max_budget_usd", team="thrifty") == BUDGET
            assert (metric(gw, "batchyard_team_quota_headroom", team="thrifty", quota="max_budget") or 0) <= 0
            with httpx.Client(base_url=gw.url, headers={"Origin": gw.url}, timeout=10) as browser:
                assert browser.post("/ui/login", data={"api_key": "sk-thrifty"}).status_code == 303
                assert COOKIE in browser.cookies
                page = browser.get("/ui").text
            assert 'data-team="thrifty"' in page and f"/ ${BUDGET:g}" in page  # the dashboard: spend / budget
            assert 'data-team="other"' not in page  # a team sees its own standing only
            other = submit(gw.client("sk-other"), lines(2, "other", sleep_ms=0))  # other teams are not held
            assert until(gw, "sk-other", other.id, finished).status == "completed"
        # The spend was kept. Only the API answers a create: the shared restart starts no worker (seconds less).
        again_up = (start_shared(_config(upstream), tmp_path / "data", redis_url, with_worker=False)
                    if mode == "shared" and redis_url is not None else
                    serve(mode, _config(upstream), tmp_path / "data", redis_url=redis_url))
        with again_up as gw:
            with pytest.raises(openai.RateLimitError) as again:
                submit(gw.client("sk-thrifty"), lines(1, "after-restart"))
            assert again.value.response.json()["error"]["code"] == "budget_exceeded"
    finally:
        if redis is not None:
            redis.close()


@pytest.mark.parametrize("mode", MODES)
def test_two_batches_at_once_overshoot_by_at_most_the_requests_in_flight(
    mode: str, upstream: Upstream, tmp_path: Path
) -> None:
    """Each real-time request is granted against the budget in the store as it starts (not a reading every
    half second): two batches of one team, eight requests at once, spend past `max_budget` by at most what
    was in flight when it was reached (eight lines' cost), and every unrun line says `budget_exceeded`."""
    budget, in_flight = 0.05, 8
    config = gateway_config(upstream, models=(MODEL,), teams=[{"team_id": "thrifty", "api_keys": ["sk-thrifty"],
                                                                "max_budget": budget}],
                            shard_size=25, max_concurrency=in_flight, master_key="sk-admin")
    config["model_list"][0]["model_info"] = {"input_cost_per_token": PRICE, "output_cost_per_token": PRICE}
    with serve(mode, config, tmp_path / "data") as gw:
        client = gw.client("sk-thrifty")
        first, second = (submit(client, lines(100, tag, sleep_ms=50)) for tag in ("one", "two"))
        ends = [until(gw, "sk-thrifty", b.id, finished, timeout=90) for b in (first, second)]
        ran = sum(e.request_counts.completed for e in ends if e.request_counts is not None)
        spend = metric(gw, "batchyard_team_spend_usd", team="thrifty")
        assert spend is not None and spend == pytest.approx(ran * 7 * PRICE), (spend, ran)
        # A result counts before its slot is given on, however late the shard's loop journals it: the line that
        # reached the budget, and at most the others then in flight (15 lines here; 8 reach it).
        reached = math.ceil(budget / (7 * PRICE))
        assert reached <= ran <= reached + in_flight - 1, (spend, ran)
        assert budget <= spend <= budget + in_flight * 7 * PRICE + 1e-9, (spend, ran)
        for end in ends:
            errors = [json.loads(x) for x in client.files.content(end.error_file_id or "").text.splitlines()]
            assert {e["error"]["code"] for e in errors} <= {"budget_exceeded"}


def _estimate_lines(tag: str, n: int = 6) -> list[dict[str, Any]]:
    """`n` lines each bounded to 1000 output tokens: at $0.0001 an output token (input free), $0.10 each."""
    return [{"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "max_tokens": 1000,
                      "messages": [{"role": "user", "content": f"#sleep:3000 {tag} {i}"}]}} for i in range(n)]


@pytest.mark.parametrize("mode", MODES)
def test_a_create_reserves_its_estimate_and_one_that_does_not_fit_gets_insufficient_quota(
    mode: str, upstream: Upstream, tmp_path: Path
) -> None:
    """`budget_reservation: estimate`: a create estimated at $0.60 holds it of a $1.00 budget; a second one of
    $0.60 while the first runs is refused with 429 in OpenAI's `insufficient_quota` shape, with the numbers.
    Once the first has ended its hold is released (its few cents of results are spent), and the second fits.
    (Two creates at the same instant: tests/servers/test_reservations.py.)"""
    teams = [{"team_id": "careful", "api_keys": ["sk-careful"], "max_budget": 1.0, "budget_reservation": "estimate"}]
    config = gateway_config(upstream, models=(MODEL,), teams=teams, max_concurrency=1, master_key="sk-admin")
    config["model_list"][0]["model_info"] = {"input_cost_per_token": 0.0, "output_cost_per_token": 1e-4}
    with serve(mode, config, tmp_path / "data") as gw:
        client = gw.client("sk-careful").with_options(timeout=120)  # the first estimate starts the processes
        files = [client.files.create(file=(f"{tag}.jsonl", "".join(json.dumps(x) + "\n" for x in _estimate_lines(tag))
                                           .encode()), purpose="batch") for tag in ("a", "b")]

        def create(file_id: str) -> Any:
            return client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                         completion_window="24h")

        first = create(files[0].id)
        with pytest.raises(openai.RateLimitError) as refused:
            create(files[1].id)
        error = refused.value.response.json()["error"]
        assert (error["type"], error["code"]) == ("insufficient_quota", "insufficient_quota"), error
        assert "0.600000 USD" in error["message"] and "max_budget 1.0 USD" in error["message"], error
        assert "held by running batches 0.600000 USD" in error["message"], error
        end = until(gw, "sk-careful", first.id, finished, timeout=90)
        assert end.status == "completed" and end.request_counts is not None and end.request_counts.completed == 6
        again = create(files[1].id)  # the first batch's hold is gone; its spend is cents
        assert until(gw, "sk-careful", again.id, finished, timeout=90).status == "completed"
