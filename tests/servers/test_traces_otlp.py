"""Traces on the wire: a batch through `batchyard serve` (embedded, with a worker process; and shared, over
Redis with a `batchyard worker`), its spans exported over OTLP/HTTP to a real receiver on loopback
(`tests.fakes.otlp_receiver`, decoding the protobuf with opentelemetry-proto), switched on only by the standard
variables. The trace is whole across the processes: the API's SERVER span (the root of the batch's own
trace, the caller's `traceparent` a link on it; its parent only with `batch_settings.trust_caller_trace`), the
batch's create, validation (in a validation process), shards and finalize spans, the request spans with the
GenAI attributes (in the worker), and the loopback upstream got each request's `traceparent` and never the
caller's `tracestate` or `baggage`.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.fakes.otlp_receiver import OTLPReceiver, Span, receiving
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import REPO_ROOT, chat_line, gateway_config, start_gateway, submit, wait_batch
from tests.support.services import HAVE_REDIS, NO_REDIS_REASON, RedisServer, process_env, start_worker, write_config
from tests.support.waiting import eventually, free_port

MODEL = "gpt-mini"
SECRET = "words-no-span-may-hold"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream() as up:
        yield up


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OTLPReceiver]:
    with receiving(monkeypatch) as rec:
        yield rec


def _lines(n: int) -> list[dict[str, Any]]:
    return [chat_line(f"c{i}", MODEL, f"{SECRET} {i}" + (" #fail:500" if i == 3 else "")) for i in range(n)]


def _caller_context() -> tuple[str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, f"00-{trace_id}-{span_id}-01"


CALLER_HEADERS = {"tracestate": "caller=secret-state", "baggage": "team=alpha,secret=value"}


def _caller_headers(traceparent: str) -> dict[str, str]:
    return {"traceparent": traceparent, **CALLER_HEADERS}


def _batch_trace(receiver: OTLPReceiver, traceparent: str) -> str:
    """The trace id of the batch created under the caller's `traceparent`: a trace of the gateway's own, whose
    root (the create call's SERVER span) links the caller's span."""
    caller_trace, caller_span = traceparent.split("-")[1:3]

    def linked() -> str | None:
        roots = [s for s in receiver.spans if s.kind == "SERVER" and caller_span in s.links]
        return roots[0].trace_id if roots else None

    trace_id = eventually(linked, 60, "the create call's span, linking the caller's")
    assert trace_id != caller_trace
    [root] = [s for s in receiver.spans if s.trace_id == trace_id and s.kind == "SERVER"]
    assert root.parent_span_id == ""  # the caller's span is a link, never the parent
    assert not [s for s in receiver.spans if s.trace_id == caller_trace]  # no span joined the caller's trace
    return trace_id


def _check_trace(receiver: OTLPReceiver, upstream: Upstream, trace_id: str, batch_id: str, n: int,
                 sent_before: int) -> None:
    def whole() -> list[Span] | None:
        spans = [s for s in receiver.spans if s.trace_id == trace_id]
        finalized = any(s.name == "batch.finalize" for s in spans)
        requests = [s for s in spans if s.name == f"chat {MODEL}"]
        return spans if finalized and len(requests) == n else None

    spans = eventually(whole, 60, "the batch's whole trace at the receiver")
    by_id = {s.span_id: s for s in spans}
    servers = [s for s in spans if s.kind == "SERVER"]
    assert servers and all(s.resource["batchyard.role"] == "api" for s in servers)
    [create] = [s for s in spans if s.name == "batch.create"]
    assert by_id[create.parent_span_id].kind == "SERVER"  # the POST /v1/batches call's span
    assert create.attributes["batchyard.batch.id"] == batch_id
    [plan] = [s for s in spans if s.name == "batch.plan"]
    assert plan.resource["batchyard.role"] == "validation"
    assert by_id[plan.parent_span_id].name == "batch.validate"
    shards = [s for s in spans if s.name == "batch.shard"]
    assert shards and all(s.parent_span_id == create.span_id and s.resource["batchyard.role"] == "worker"
                          for s in shards)
    requests = [s for s in spans if s.name == f"chat {MODEL}"]
    for span in requests:
        assert span.kind == "CLIENT" and by_id[span.parent_span_id].name == "batch.shard"
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.provider.name"] == "openai"
        assert span.attributes["gen_ai.request.model"] == MODEL
        if span.attributes["batchyard.request.custom_id"] == "c3":
            assert span.status == 2 and span.attributes["error.type"] == "server_error"
        else:
            assert span.attributes["gen_ai.response.model"] == MODEL
            assert span.attributes["gen_ai.usage.input_tokens"] > 0
            assert span.attributes["gen_ai.usage.output_tokens"] > 0
            assert span.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    [finalize] = [s for s in spans if s.name == "batch.finalize"]
    assert ("batch.status", {"batchyard.batch.status": "completed", "batchyard.batch.completed": n - 1,
                             "batchyard.batch.failed": 1}) in finalize.events
    assert {s.resource["service.name"] for s in spans} == {"batchyard"}
    assert len({s.resource["service.instance.id"] for s in spans}) >= 3  # api, validation, worker
    sent = upstream.stats()["traceparents"][sent_before:]
    assert sorted(p.split("-")[2] for p in sent if p.split("-")[1] == trace_id) == sorted(s.span_id for s in requests)
    assert upstream.stats()["trace_headers"] == []  # the caller's tracestate and baggage never went on
    for span in receiver.spans:  # no line's text, key or header value in any span of any trace
        assert SECRET not in repr(span.attributes) + repr(span.events), span.name
        assert "authorization" not in repr(span.attributes).lower()
    assert not [s for s in receiver.spans if "/health" in s.name or "/metrics" in s.name]


@pytest.mark.parametrize("trust", [False, True], ids=["a caller's traceparent is a link", "trusted, continued"])
def test_a_batch_through_serve_is_one_trace_at_the_collector(upstream: Upstream, receiver: OTLPReceiver,
                                                             tmp_path: Path, trust: bool) -> None:
    caller_trace, traceparent = _caller_context()
    sent_before = len(upstream.stats()["traceparents"])
    config = gateway_config(upstream, models=(MODEL,), shard_size=3, **({"trust_caller_trace": True} if trust else {}))
    with start_gateway(config, tmp_path / "data", workers=1) as gw:
        client = gw.client(None, default_headers=_caller_headers(traceparent))
        batch = submit(client, _lines(7))
        assert wait_batch(client, batch.id).status == "completed"
        trace_id = caller_trace if trust else _batch_trace(receiver, traceparent)
        [create] = eventually(lambda: [c for c in receiver.named("batch.create") if c.trace_id == trace_id] or None,
                              30, "the batch's create span")
        assert create.links == ([] if trust else [traceparent.split("-")[2]])
        assert gw.http("GET", "/health").status_code == 200
        card = gw.http("GET", "/ui/api/batches").json()["cards"][batch.id]  # the dashboard's card: its trace id
        assert f"trace <code>{trace_id}</code>" in card
        _check_trace(receiver, upstream, trace_id, batch.id, 7, sent_before)


@pytest.mark.redis
@pytest.mark.skipif(not HAVE_REDIS, reason=NO_REDIS_REASON)
def test_shared_mode_joins_the_same_trace(upstream: Upstream, receiver: OTLPReceiver, tmp_path: Path) -> None:
    traceparent = _caller_context()[1]
    sent_before = len(upstream.stats()["traceparents"])
    redis = RedisServer().start()
    config = write_config(tmp_path / "shared.yaml", gateway_config(upstream, models=(MODEL,), shard_size=3))
    storage = str(tmp_path / "blobs")
    worker = start_worker(config, redis.url, storage, env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    port = free_port()
    fd, log = tempfile.mkstemp(prefix="serve-", suffix=".log")
    api = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port",
                            str(port), "--redis-url", redis.url, "--blobs", storage], cwd=REPO_ROOT,
                           env=process_env(), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
    os.close(fd)
    try:
        url = f"http://127.0.0.1:{port}"
        eventually(lambda: _healthy(url), 90, f"serve --redis-url to answer ({Path(log).read_text()[-2000:]})")
        worker.wait_ready()
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30,
                        default_headers=_caller_headers(traceparent))
        batch = submit(client, _lines(5))
        assert wait_batch(client, batch.id).status == "completed"
        _check_trace(receiver, upstream, _batch_trace(receiver, traceparent), batch.id, 5, sent_before)
    finally:
        api.terminate()
        api.wait(20)
        worker.close()
        redis.close()
        Path(log).unlink(missing_ok=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_nothing_is_exported_with_the_variables_unset(upstream: Upstream, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    with OTLPReceiver() as listening:  # a collector at the default port would be told nothing either
        sent_before = len(upstream.stats()["traceparents"])
        with start_gateway(gateway_config(upstream, models=(MODEL,)), tmp_path / "data", workers=1) as gw:
            client = gw.client(None, default_headers={"traceparent": _caller_context()[1]})
            batch = submit(client, _lines(3))
            assert wait_batch(client, batch.id).status == "completed"
            assert "trace" not in (client.batches.retrieve(batch.id).model_extra or {})
            assert "trace-id" not in gw.http("GET", "/ui/api/batches").json()["cards"][batch.id]
        assert listening.requests == 0
        assert upstream.stats()["traceparents"][sent_before:] == []


def test_batchyard_submit_starts_the_trace(upstream: Upstream, receiver: OTLPReceiver, tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in _lines(2)))
    with start_gateway(gateway_config(upstream, models=(MODEL,)), tmp_path / "data", workers=1) as gw:
        env = {**process_env(), "OPENAI_API_KEY": "none"}
        done = subprocess.run([sys.executable, "-m", "gateway.cli", "submit", "-i", str(src), "-o", str(out),
                               "--base-url", gw.url + "/v1", "--poll", "0.2"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        [submit_span] = eventually(lambda: receiver.named("batchyard.submit") or None, 30, "submit's span")
        assert submit_span.kind == "CLIENT" and submit_span.resource["batchyard.role"] == "submit"
        [create] = eventually(lambda: [s for s in receiver.named("batch.create")
                                       if submit_span.span_id in s.links] or None, 30, "the batch, linked")
        by_id = {s.span_id: s for s in receiver.spans}
        assert by_id[create.parent_span_id].kind == "SERVER"
        # submit's span is a link on the batch's own root span (the server cannot tell its own client)
        assert by_id[create.parent_span_id].parent_span_id == ""
        assert submit_span.span_id in by_id[create.parent_span_id].links and submit_span.span_id in create.links
