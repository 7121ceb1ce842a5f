"""Trace headers from callers (issue 45, Must 9), against a real `batchyard serve` exporting to a real OTLP
receiver, with the recording loopback upstream.

A caller is another team's program. Its `traceparent` (here unsampled, `-00`) once picked the batch's trace
id and sampled flag, and its `tracestate` went on to every upstream. Now the batch's trace is the gateway's
own, sampled by the gateway, the caller's span a link on its root; no `tracestate`, `baggage` or other
propagator's header of the caller's reaches an upstream; and a `traceparent` past W3C's 55 characters (or
not of its form) is ignored whole, never read or linked.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.fakes.otlp_receiver import OTLPReceiver, receiving
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import Gateway, chat_line, gateway_config, start_gateway, submit, wait_batch
from tests.support.waiting import eventually

MODEL = "gpt-mini"


@pytest.fixture(scope="module")
def traced(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, OTLPReceiver]]:
    with pytest.MonkeyPatch.context() as monkeypatch, receiving(monkeypatch) as receiver, \
            start_gateway(gateway_config(upstream, models=(MODEL,)), tmp_path_factory.mktemp("trace") / "data",
                          workers=1) as gw:
        yield gw, receiver


def test_a_callers_trace_headers_pick_nothing_and_go_nowhere(traced: tuple[Gateway, OTLPReceiver],
                                                             upstream: Upstream) -> None:
    gw, receiver = traced
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"traceparent": f"00-{caller_trace}-{caller_span}-00",  # unsampled: the caller asks for no trace
               "tracestate": "vendor=caller-secret", "baggage": "user=alice,secret=1", "b3": "1-2-1",
               "uber-trace-id": "1:2:0:1", "uberctx-user": "alice"}
    sent_before = len(upstream.stats()["traceparents"])
    client = gw.client(None, default_headers=headers)
    batch = submit(client, [chat_line(f"c{i}", MODEL, "hi") for i in range(3)])
    assert wait_batch(client, batch.id).status == "completed"

    [create] = eventually(lambda: [s for s in receiver.named("batch.create")
                                   if s.attributes.get("batchyard.batch.id") == batch.id] or None, 30,
                          "the batch's create span, exported though the caller's flag said unsampled")
    assert create.trace_id != caller_trace and create.links == [caller_span]
    root = next(s for s in receiver.spans if s.span_id == create.parent_span_id)
    assert root.kind == "SERVER" and root.parent_span_id == "" and root.links == [caller_span]
    assert not [s for s in receiver.spans if s.trace_id == caller_trace]
    stats = upstream.stats()
    sent = stats["traceparents"][sent_before:]
    assert len(sent) == 3 and all(p.split("-")[1] == create.trace_id for p in sent), sent
    assert stats["trace_headers"] == [], stats["trace_headers"]


@pytest.mark.parametrize("traceparent", [
    "00-" + "a" * 32 + "-" + "b" * 16 + "-01" + "-" + "x" * 4000,  # past 55 characters
    "00-" + "A" * 32 + "-" + "b" * 16 + "-01",  # upper case: not W3C's form
    "ff-" + "a" * 32 + "-" + "b" * 16 + "-01",  # the version W3C forbids
    "00-" + "0" * 32 + "-" + "b" * 16 + "-01",  # an all-zero trace id
], ids=["too long", "upper case", "version ff", "zero trace id"])
def test_a_traceparent_out_of_form_is_ignored(traced: tuple[Gateway, OTLPReceiver], traceparent: str) -> None:
    gw, receiver = traced
    reply = gw.http("GET", "/v1/models", headers={"traceparent": traceparent})
    assert reply.status_code in (200, 401), reply.text
    client = gw.client(None, default_headers={"traceparent": traceparent})
    batch = submit(client, [chat_line("c0", MODEL, "hi")])
    [create] = eventually(lambda: [s for s in receiver.named("batch.create")
                                   if s.attributes.get("batchyard.batch.id") == batch.id] or None, 30,
                          "the batch's create span")
    assert create.links == [] and create.trace_id != "a" * 32
    assert wait_batch(client, batch.id).status == "completed"

