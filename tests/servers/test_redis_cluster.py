"""Shared mode on a Redis Cluster named by one node's address, as a managed configuration endpoint is.

A 3-master cluster on loopback (`redis-server --cluster-enabled yes` x3, `redis-cli --cluster create`):
`serve` (an API replica) and two `batchyard worker`s, a batch, one worker SIGKILLed mid-batch: the batch
completes with every custom_id once and no line failed; that test runs on a Valkey cluster too
(`valkey-server` x3, `valkey-cli --cluster create`: the `server_binary` fixture). A batch's keys share
its hash slot and a team's ledgers theirs, and each (route, team) queue its own,
so a deployment's keys spread over the masters
(`gateway.store.redis.keys`). A Redis of the previous layout is migrated at start: test_redis_migration.py.
(The store, queue and Lua parity suites run on a Redis cluster and on a valkey-server too: `any_redis` in
tests/conftest.py.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import InternalServerError, OpenAI
from openai.types import Batch

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus, Result, Shard
from gateway.runtime.runtime import open_shared
from gateway.store.quota import SpendTo, TeamLimits
from gateway.store.records import BatchOptions, BatchRecord, FileRecord
from gateway.store.redis.connection import open_redis
from gateway.store.redis.keys import Keys
from gateway.store.redis.queue import RedisStreamQueue
from gateway.store.redis.store import RedisStore
from gateway.store.webhook_deliveries import WebhookDelivery
from tests.fakes.upstream.server import Upstream
from tests.servers.test_faults_redis import tracebacks
from tests.support.server_helpers import chat_line, gateway_config, read_jsonl, submit
from tests.support.services import (
    HAVE_REDIS,
    NO_REDIS_REASON,
    RedisClusterServers,
    RedisServer,
    WorkerProcess,
    make_tls_files,
    shared_config,
    start_worker,
)
from tests.support.team_helpers import done, finished, start_shared, until
from tests.support.waiting import eventually

pytestmark = [pytest.mark.redis, pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)]

TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}]
LINES = 300


@pytest.fixture(scope="module")
def cluster(server_binary: str) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(3, binary=server_binary).start()
    yield servers
    servers.close()


def _all_keys(cluster: RedisClusterServers) -> list[str]:
    """Every key on every master (the test's look; the gateway never lists the keyspace)."""
    names: list[str] = []
    for node in cluster.nodes:
        with node.client() as c:
            names += [str(k) for k in c.scan_iter(count=1000)]
    return names


def test_serve_and_two_workers_on_a_cluster_with_one_worker_killed(
    cluster: RedisClusterServers, upstream: Upstream, tmp_path: Path,
) -> None:
    cluster.flush()
    config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, shard_size=25)
    gw = start_shared(config, tmp_path / "data", cluster.url, with_worker=False)
    workers: list[WorkerProcess] = []
    try:
        storage = str(tmp_path / "data" / "blobs")
        workers = [start_worker(tmp_path / "shared.config.yaml", cluster.url, storage, claim_idle=1.0)
                   for _ in range(2)]
        for worker in workers:
            worker.wait_ready(120)
        lines = [chat_line(f"c-{i}", "gpt-mini", f"#sleep:20 line {i}") for i in range(LINES)]
        alpha = gw.client("sk-alpha")
        batch_id = submit(alpha, lines).id
        until(gw, "sk-alpha", batch_id, lambda b: done(b) >= 50, timeout=90)
        workers[0].kill()  # SIGKILL: its shards are taken over once idle past --claim-idle
        batch = until(gw, "sk-alpha", batch_id, finished, timeout=180)
        logs = "\n".join([gw.log(), *(w.log() for w in workers)])
        assert batch.status == "completed", logs[-4000:]
        assert read_jsonl(alpha, batch.error_file_id) == []
        output = [r["custom_id"] for r in read_jsonl(alpha, batch.output_file_id)]
        assert sorted(output) == sorted(line["custom_id"] for line in lines)  # each once
        assert tracebacks(logs) == [], "\n".join(tracebacks(logs))
        names = _all_keys(cluster)
        assert names and all(name.startswith("batchyard:") for name in names), names[:5]
    finally:
        for worker in workers:
            worker.close()
        gw.stop()


async def test_the_queues_keys_are_in_one_slot_per_route_and_team(cluster: RedisClusterServers) -> None:
    """Shards of 2 batches of 2 teams on 2 routes: each (route, team) queue's keys share one slot, and the
    queues span several; a route or team named with `{`, `}` and `:` gives well-formed, distinct keys."""
    cluster.flush()
    routes, teams = ["gpu", "we{ird}:1:x"], ["alpha", "b}e{ta:2"]
    client, keys = await open_redis(cluster.url)
    queue = RedisStreamQueue(client, routes, keys=keys, consumer="me")
    try:
        for route in routes:
            for n, team in enumerate(teams):
                await queue.put(Shard(f"batch_{n}", 0, route, 1, team=team, deadline=100))
        slots = {}
        with cluster.nodes[0].client() as c:
            def slot(key: str) -> int:
                return int(c.execute_command("CLUSTER", "KEYSLOT", key))

            for route in routes:
                for n, team in enumerate(teams):
                    names = [keys.stream(route, team, f"batch_{n}"), keys.ready(route, team),
                             keys.streams(route, team), keys.queued(route, team)]
                    tag = names[0][names[0].index("{") + 1:names[0].index("}")]
                    assert all(name.startswith(f"batchyard:{{{tag}}}:") for name in names), names
                    assert {slot(name) for name in names} == {slot(tag)}  # the tag is the whole tag
                    slots[route, team] = tag
            assert len(set(slots.values())) == 4 and len({slot(tag) for tag in slots.values()}) > 1
        assert sorted(n for n in _all_keys(cluster) if "}:stream:" in n) == sorted(
            keys.stream(r, t, f"batch_{n}") for r in routes for n, t in enumerate(teams))
        # names that would meet without lengths or escapes stay apart
        assert keys.ready("a:1:b", "c") != keys.ready("a", "1:b:c")
        assert keys.ready("a}", "b") != keys.ready("a", "}b") and "}" not in keys.teams("a}")[:-len("}:teams")]
        # every shard is claimed and acked through those keys
        for _ in range(4):
            got = await queue.claim(routes)
            assert got is not None
            await queue.ack(got)
        assert await queue.claim(routes) is None and await queue.queued() == {}
    finally:
        await queue.aclose()
        await client.aclose()


def _master_of(cluster: RedisClusterServers, key: str) -> RedisServer:
    """The master that holds `key`'s slot."""
    with cluster.nodes[0].client() as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                port = int(master[1])
                return next(n for n in cluster.nodes if n.port == port)
    raise AssertionError(f"no master holds slot {slot}")


def _finished_or_none(client: OpenAI, batch_id: str) -> Batch | None:
    """The batch once finished; None meanwhile, and while the API answers 503 (Redis failing over: the API
    tries once and says so, in OpenAI's error shape)."""
    try:
        batch = client.batches.retrieve(batch_id)
    except InternalServerError as exc:
        assert exc.status_code == 503, exc
        return None
    return batch if finished(batch) else None


def test_a_master_killed_mid_batch_and_its_replica_promoted_loses_nothing(
    upstream: Upstream, tmp_path: Path,
) -> None:
    """A 3+3 cluster; the master holding the batch's slot SIGKILLed mid-batch: its replica takes over
    (cluster-node-timeout 2 s) and the batch completes, every custom_id once, no line failed."""
    cluster = RedisClusterServers(3, replicas=1).start()
    config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, shard_size=25)
    gw = start_shared(config, tmp_path / "data", cluster.url, with_worker=False)
    workers: list[WorkerProcess] = []
    try:
        storage = str(tmp_path / "data" / "blobs")
        workers = [start_worker(tmp_path / "shared.config.yaml", cluster.url, storage, claim_idle=2.0)
                   for _ in range(2)]
        for worker in workers:
            worker.wait_ready(120)
        lines = [chat_line(f"f-{i}", "gpt-mini", f"#sleep:20 line {i}") for i in range(LINES)]
        alpha = gw.client("sk-alpha")
        batch_id = submit(alpha, lines).id
        until(gw, "sk-alpha", batch_id, lambda b: done(b) >= 50, timeout=90)
        master = _master_of(cluster, Keys().batch(batch_id))  # any node, the URL's own included
        master.stop(signal.SIGKILL)
        batch = eventually(lambda: _finished_or_none(alpha, batch_id), 240, "the batch to finish", interval=0.5)
        logs = "\n".join([gw.log(), *(w.log() for w in workers)])
        assert batch.status == "completed", logs[-4000:]
        assert read_jsonl(alpha, batch.error_file_id) == []
        output = [r["custom_id"] for r in read_jsonl(alpha, batch.output_file_id)]
        assert sorted(output) == sorted(line["custom_id"] for line in lines)  # each once: none lost, none twice
        assert all(w.alive() for w in workers), logs[-4000:]
        assert tracebacks(logs) == [], "\n".join(tracebacks(logs))
    finally:
        for worker in workers:
            worker.close()
        gw.stop()
        cluster.close()


async def test_a_tls_cluster_with_a_ca_file(upstream: Upstream, tmp_path: Path) -> None:
    """`rediss://` to one node of a cluster whose nodes (and bus) speak TLS, the CA from --redis-ca-file."""
    ca, cert, key = make_tls_files(tmp_path)
    cluster = RedisClusterServers(3, tls=(ca, cert, key)).start()
    try:
        config = parse_config(shared_config(upstream.v1_url))
        runtime = await open_shared(config, cluster.tls_url, tmp_path / "blobs", redis_ca_file=str(ca))
        try:
            await runtime.store.backend_state.put("probe", {"ok": 1})
            assert await runtime.store.backend_state.get("probe") == {"ok": 1}
            assert (await runtime.health())["mode"] == "shared"
        finally:
            await runtime.aclose()
        assert [k for k in _all_keys(cluster) if k.startswith("batchyard:meta:")] == ["batchyard:meta:probe"]
    finally:
        cluster.close()


async def test_a_database_other_than_0_is_refused_on_a_cluster(cluster: RedisClusterServers, upstream: Upstream,
                                                               tmp_path: Path) -> None:
    from gateway.errors import ConfigError

    config = parse_config(shared_config(upstream.v1_url))
    with pytest.raises(ConfigError, match="database 0 only"):
        await open_shared(config, cluster.url.rsplit("/", 1)[0] + "/2", tmp_path / "blobs")


async def test_each_batch_and_each_team_keeps_its_keys_in_one_slot(cluster: RedisClusterServers) -> None:
    """After a batch for team alpha and one for team beta (records, shards, journal, spend, quota, storage, rate
    window, idempotency key, files, a webhook delivery): every batch's keys hash to one slot, every team's
    ledgers to one, and the deployment's keys are in several slots, on more than one master."""
    cluster.flush()
    client, keys = await open_redis(cluster.url)
    store = RedisStore(client, keys)
    try:
        for team, batch_id in (("alpha", "batch_a1"), ("beta", "batch_b1")):
            await store.files.put(FileRecord(f"file-{team}", team, 10, 1, "in.jsonl", "batch", 10_000))
            await store.batches.put(BatchRecord(
                id=batch_id, owner=team, endpoint="/v1/chat/completions", input_file_id=f"file-{team}",
                completion_window="24h", status=BatchStatus.IN_PROGRESS, created_at=1, expires_at=86_401,
                options=BatchOptions()))
            assert await store.quota.admit(team, batch_id, 2, TeamLimits(max_enqueued_requests=10)) is None
            shard = Shard(batch_id, 0, "gpt-mini", 2)
            await store.ledger.put_shards(batch_id, [shard])
            await store.ledger.begin_attempt(shard)
            result = Result(line=1, custom_id="c-1", status_code=200, body={"usage": {}}, cost_usd=0.5)
            await store.ledger.record_results(shard, [result], SpendTo(team, 0))
            await store.ledger.drop_journal(Shard(batch_id, 1, "gpt-mini", 1))
            assert await store.storage.reserve(team, f"file-{team}", 10, 1000)
            await store.rates.take(team, "gpt-mini", 1, 10, None)
            await store.idempotency.reserve(team, "k-1", "tok", "fp", 60)
            await store.webhooks.add(WebhookDelivery(f"wh_{team}", "evt", team, batch_id, "batch.completed", 1))
            assert await store.quota.spend(team, 0) == 0.5
            await store.batches.update(batch_id, {"status": BatchStatus.COMPLETED})
            await store.ledger.finish_shard(shard)
    finally:
        await store.aclose()
    with cluster.nodes[0].client() as c:
        def slots(names: list[str]) -> set[int]:
            return {int(c.execute_command("CLUSTER", "KEYSLOT", n)) for n in names}

        names = _all_keys(cluster)
        for batch_id in ("batch_a1", "batch_b1"):
            mine = [n for n in names if n.startswith(keys.batch_tag(batch_id))]
            assert {n.rsplit(":", 1)[-1] if "journal" not in n else "journal" for n in mine} >= {
                "batch", "shards", "shards-done", "attempts", "journal", "route-stats", "sealed", "results",
                "spend-owed"}, mine
            assert len(slots(mine)) == 1, mine
        for team in ("alpha", "beta"):
            mine = [n for n in names if n.startswith(keys.team_tag(team))]
            families = {n[len(keys.team_tag(team)) + 1:].split(":")[0] for n in mine}
            assert families >= {"files", "batches", "quota", "spend", "spend-moved", "storage", "storage-pending",
                                "rate", "idempotency", "webhooks"}, mine
            assert len(slots(mine)) == 1, mine
        assert len(slots(names)) > 4
    masters = set()
    for node in cluster.nodes:
        with node.client() as nc:
            if nc.dbsize():
                masters.add(node.port)
    assert len(masters) > 1
