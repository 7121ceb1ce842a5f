"""Message Batches over time, with the `anthropic` SDK: expiry after the batch's window (24 hours; a test
config shortens it), both runtime modes (embedded, and shared over Redis), and a crash: the API process
(with its worker) SIGKILLed mid-batch loses only what was in flight; a new server finishes the batch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from anthropic import Anthropic

from tests.fakes.upstream.server import Upstream
from tests.servers.test_anthropic_batches import ended, request, results
from tests.support.server_helpers import gateway_config, start_gateway
from tests.support.team_helpers import MODES, serve
from tests.support.waiting import eventually

MODEL = "gpt-mini"
KEY = "sk-alpha-0123456789"
TEAMS = [{"team_id": "alpha", "api_keys": [KEY]}]
# The expiry test's window: long enough for a fresh server's first replies (the worker loads LiteLLM first).
WINDOW = 15


def test_expiry_keeps_finished_results(upstream: Upstream, tmp_path: Path) -> None:
    """A batch still running at `expires_at` ends: what was answered keeps its result, the rest `expired`."""
    config = gateway_config(upstream, teams=TEAMS, models=[MODEL], completion_windows={"24h": WINDOW})
    with start_gateway(config, tmp_path / "data") as gw:
        client = Anthropic(base_url=gw.url, api_key=KEY, max_retries=0)
        reqs = [request("early0", "in time"), request("early1", "in time too")]
        reqs += [request(f"late{i}", f"#sleep:20000 late {i}") for i in range(3)]
        created = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
        assert (created.expires_at - created.created_at).total_seconds() == WINDOW
        batch = ended(client, created.id, timeout=40)
        counts = batch.request_counts
        assert (counts.succeeded, counts.expired, counts.errored, counts.canceled) == (2, 3, 0, 0)
        got = results(client, batch.id)
        assert [r.type for r in got.values()] == ["succeeded"] * 2 + ["expired"] * 3


@pytest.mark.parametrize("mode", MODES)
def test_create_and_results_in_both_modes(mode: str, upstream: Upstream, tmp_path: Path) -> None:
    """The same batch, the same results, whichever store holds it (SQLite, or Redis shared by replicas);
    the counts of an ended batch are kept in the store (no GET reads the results)."""
    config = gateway_config(upstream, master_key="sk-admin", teams=TEAMS, models=[MODEL], shard_size=4)
    with serve(mode, config, tmp_path / "data") as gw:
        client = Anthropic(base_url=gw.url, api_key=KEY, max_retries=0)
        reqs = [request(f"r{i}", f"mode {mode} {i}") for i in range(10)] + [request("bad", "x", model="nope")]
        created = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
        batch = ended(client, created.id)
        assert (batch.request_counts.succeeded, batch.request_counts.errored) == (10, 1)
        got = results(client, batch.id)
        assert list(got) == [r["custom_id"] for r in reqs]
        assert [got[f"r{i}"].type for i in range(10)] == ["succeeded"] * 10 and got["bad"].type == "errored"
        assert [b.id for b in client.messages.batches.list()] == [batch.id]
        assert client.messages.batches.retrieve(batch.id).request_counts == batch.request_counts
        client.messages.batches.delete(batch.id)
        assert list(client.messages.batches.list()) == []


def _counted(upstream: Upstream, tag: str) -> Counter[str]:
    return Counter({k: v for k, v in upstream.stats()["by_custom"].items() if f" {tag} " in k})


def test_api_and_worker_killed_mid_batch_lose_only_what_was_in_flight(upstream: Upstream, tmp_path: Path) -> None:
    """SIGKILL the API process mid-batch (its worker stops with it); a new server on the same data finishes
    the batch: every request has exactly one result, and only requests in flight (or not yet journalled)
    at the kill were sent again."""
    n, tag = 120, "akill"
    config = gateway_config(upstream, teams=TEAMS, models=[MODEL], shard_size=20, max_concurrency=8)
    reqs: list[dict[str, Any]] = [request(f"{tag}-{i}", f"#count #sleep:40 {tag} {i}") for i in range(n)]
    data_dir = tmp_path / "data"
    gw = start_gateway(config, data_dir, workers=1)
    try:
        client = Anthropic(base_url=gw.url, api_key=KEY, max_retries=0)
        created = client.messages.batches.create(requests=reqs)  # type: ignore[arg-type]
        eventually(lambda: client.messages.batches.retrieve(created.id).request_counts.succeeded >= 30, 60,
                   "30 results before the kill", interval=0.05)
    finally:
        gw.kill()
    with start_gateway(config, data_dir, workers=1, port=gw.port) as again:
        client = Anthropic(base_url=again.url, api_key=KEY, max_retries=0)
        batch = ended(client, created.id, timeout=120)
        assert batch.request_counts.succeeded == n and batch.request_counts.errored == 0
        got = results(client, batch.id)
        assert list(got) == [r["custom_id"] for r in reqs]  # once each, in input order
    counts = _counted(upstream, tag)
    assert len(counts) == n
    assert sum(counts.values()) - n <= 2 * 8 + 20  # the in-flight slots and an unjournalled tail, no more
