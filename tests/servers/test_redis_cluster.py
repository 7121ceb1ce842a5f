"""Shared mode on a Redis Cluster named by one node's address, as a managed configuration endpoint is.

A 3-master cluster on loopback (`redis-server --cluster-enabled yes` x3, `redis-cli --cluster create`):
`serve` (an API replica) and two `batchyard worker`s, a batch, one worker SIGKILLed mid-batch: the batch
completes with every custom_id once and no line failed; that test runs on a Valkey cluster too
(`valkey-server` x3, `valkey-cli --cluster create`: the `server_binary` fixture). Every key carries the
deployment's hash tag (one slot: `gateway.store.redis.keys.slot_prefix`), but the queue's: one slot per
(route, team) queue and one per route's team registry, several slots in all. A single redis-server keeps the
untagged names it had, so a deployment written before the cluster support reads its batches on (nothing to
migrate).
(The store, queue and Lua parity suites run on a Redis cluster and on a valkey-server too: `any_redis` in
tests/conftest.py.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from openai import InternalServerError, OpenAI
from openai.types import Batch

from gateway.config.schema import parse_config
from gateway.domain import BatchStatus, Shard
from gateway.runtime.runtime import open_shared
from gateway.store.objects import BatchOptions, BatchRecord
from gateway.store.redis.connection import connect_redis, open_redis
from gateway.store.redis.keys import Keys
from gateway.store.redis.queue import RedisStreamQueue
from gateway.store.redis.store import RedisStore
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
        # the records under the deployment's tag; the queue's keys (what is left of them: the route's team
        # registry) each under a tag of their own
        queue = [name for name in names if name.startswith(("batchyard:{q:", "batchyard:{r:"))]
        assert queue == ["batchyard:{r:gpt-mini}:teams"], queue
        assert all(name.startswith("{batchyard}:") for name in names if name not in queue), names[:5]
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
        assert keys.ready("a}", "b") != keys.ready("a", "}b") and "%7D" in keys.teams("a}")
        # every shard is claimed and acked through those keys
        for _ in range(4):
            got = await queue.claim(routes)
            assert got is not None
            await queue.ack(got)
        assert await queue.claim(routes) is None and await queue.queued() == {}
    finally:
        await queue.aclose()
        await client.aclose()


def _master_of_the_tag(cluster: RedisClusterServers) -> RedisServer:
    """The master that holds the deployment's slot (every key: `{batchyard}:…`)."""
    with cluster.nodes[0].client() as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", "{batchyard}:x"))
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
    """A 3+3 cluster; the master holding the deployment's slot SIGKILLed mid-batch: its replica takes over
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
        master = _master_of_the_tag(cluster)  # any node, the URL's own included
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
        assert [k for k in _all_keys(cluster) if k.startswith("{batchyard}:meta:")] == ["{batchyard}:meta:probe"]
    finally:
        cluster.close()


async def test_a_database_other_than_0_is_refused_on_a_cluster(cluster: RedisClusterServers, upstream: Upstream,
                                                               tmp_path: Path) -> None:
    from gateway.errors import ConfigError

    config = parse_config(shared_config(upstream.v1_url))
    with pytest.raises(ConfigError, match="database 0 only"):
        await open_shared(config, cluster.url.rsplit("/", 1)[0] + "/2", tmp_path / "blobs")


async def test_a_single_redis_written_before_keeps_its_key_names(redis_server: RedisServer, upstream: Upstream,
                                                                 tmp_path: Path) -> None:
    redis_server.flush()
    before = RedisStore(connect_redis(redis_server.url), Keys())  # the layout the previous release wrote
    await before.batches.put(BatchRecord(
        id="batch_old", owner="alpha", endpoint="/v1/chat/completions", input_file_id="file_in",
        completion_window="24h", status=BatchStatus.VALIDATING, created_at=1, expires_at=86_401,
        options=BatchOptions()))
    await before.aclose()
    runtime = await open_shared(parse_config(shared_config(upstream.v1_url)), redis_server.url, tmp_path / "blobs")
    try:
        record = await runtime.store.batches.get("batch_old")
        assert record is not None and record.owner == "alpha"
    finally:
        await runtime.aclose()
    with redis.Redis(port=redis_server.port, decode_responses=True) as c:
        assert not [k for k in c.scan_iter() if str(k).startswith("{")]
