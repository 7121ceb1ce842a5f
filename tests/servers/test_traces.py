"""Traces, span by span: one batch through the embedded runtime, in this process, against the loopback upstream,
its spans caught by the SDK's `InMemorySpanExporter` (the exporter is the only part not on the wire here; the
OTLP path is `test_traces_otlp`).

What a span may hold is checked on every span: never a line's text, a key or a header value, unless content
capture names the team.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway import tracing
from gateway.config.schema import parse_config
from gateway.config.sections import TracingSettings
from gateway.errors import ConfigError
from gateway.store.sqlite.store import SQLiteStore
from gateway.tracing import genai
from gateway.tracing.logs import TraceIds
from gateway.tracing.switch import configure, protocol, wanted
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import chat_line, embedded_runtime, gateway_config, run_embedded_batch
from tests.support.waiting import eventually_async

MODEL = "gpt-mini"
SECRET = "the-secret-prompt-words"  # in every line's text: no span may show it unless content capture is on


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(api_key="sk-traces") as up:
        yield up


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    tracing.shutdown()


def _config(upstream: Upstream, **tracing_settings: Any) -> Any:
    teams = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
    return parse_config(gateway_config(upstream, models=(MODEL,), teams=teams, shard_size=3,
                                       tracing=tracing_settings))


def _lines(n: int, failing: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    return [chat_line(f"c{i}", MODEL, f"{SECRET} {i}" + (" #fail:400" if i in failing else "")) for i in range(n)]


async def _ended(spans: InMemorySpanExporter, name: str, count: int) -> bool:
    return len(_by_name(spans.get_finished_spans(), name)) >= count


def _by_name(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def _no_content(finished: tuple[ReadableSpan, ...]) -> None:
    for span in finished:
        for key, value in (span.attributes or {}).items():
            assert SECRET not in str(value) and "sk-" not in str(value), (span.name, key)
        for event in span.events:
            assert SECRET not in str(dict(event.attributes or {}))


async def test_one_batch_is_one_trace_down_to_each_request(upstream: Upstream, spans: InMemorySpanExporter,
                                                           tmp_path: Path) -> None:
    configure("api", TracingSettings(), exporter=spans)
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        before = len(upstream.stats()["traceparents"])
        batch = await run_embedded_batch(runtime, "alpha", _lines(7, failing=(4,)))
        # the batch completes from inside its last shard's span (the finalize runs as that shard finishes)
        await eventually_async(lambda: _ended(spans, "batch.shard", 3), 10, "the three shard spans")
        tracing.flush()
        finished = spans.get_finished_spans()

        [create] = _by_name(finished, "batch.create")
        trace_id = create.context.trace_id
        assert tracing.trace_id(batch.trace_context) == format(trace_id, "032x")
        assert {s.context.trace_id for s in finished} == {trace_id}  # one trace: every stage, shard and request
        assert create.attributes is not None and create.attributes[genai.BATCH_ID] == batch.id
        assert create.attributes[genai.TEAM] == "alpha"

        [validate] = _by_name(finished, "batch.validate")
        [finalize] = _by_name(finished, "batch.finalize")
        for stage in (validate, finalize):
            assert stage.parent is not None and stage.parent.span_id == create.context.span_id
        assert [dict(e.attributes or {})[genai.STATUS] for e in validate.events] == ["in_progress"]
        [final] = [dict(e.attributes or {}) for e in finalize.events]
        assert final[genai.STATUS] == "completed" and final[genai.COMPLETED] == 6 and final[genai.FAILED] == 1

        shards = _by_name(finished, "batch.shard")
        assert sorted((s.attributes or {})[genai.SHARD_LINES] for s in shards) == [1, 3, 3]  # shard_size 3
        for shard in shards:
            assert shard.parent is not None and shard.parent.span_id == create.context.span_id
            assert (shard.attributes or {})[genai.ROUTE] == MODEL and (shard.attributes or {})[genai.ATTEMPT] == 1

        requests = _by_name(finished, f"chat {MODEL}")
        assert len(requests) == 7
        shard_ids = {s.context.span_id for s in shards}
        for span in requests:
            attrs = span.attributes or {}
            assert span.kind is SpanKind.CLIENT and span.parent is not None and span.parent.span_id in shard_ids
            assert attrs[genai.OPERATION_NAME] == "chat" and attrs[genai.PROVIDER_NAME] == "openai"
            assert attrs[genai.REQUEST_MODEL] == MODEL
            if attrs[genai.CUSTOM_ID] == "c4":
                assert span.status.status_code is StatusCode.ERROR
                assert attrs[genai.ERROR_TYPE] == "invalid_request_error"
                continue
            assert span.status.status_code is not StatusCode.ERROR
            assert attrs[genai.RESPONSE_MODEL] == MODEL and attrs[genai.FINISH_REASONS] == ("stop",)
            assert attrs[genai.INPUT_TOKENS] == attrs[genai.PROMPT_TOKENS] > 0
            assert attrs[genai.OUTPUT_TOKENS] == attrs[genai.COMPLETION_TOKENS] > 0
        # the upstream got each request span's own traceparent: its spans would join this trace
        sent = upstream.stats()["traceparents"][before:]
        assert sorted(sent) == sorted(f"00-{trace_id:032x}-{s.context.span_id:016x}-{s.context.trace_flags:02x}"
                                      for s in requests)
        _no_content(finished)


async def test_request_spans_are_sampled_and_failures_always_kept(upstream: Upstream, spans: InMemorySpanExporter,
                                                                  tmp_path: Path) -> None:
    configure("worker", TracingSettings(request_sample_ratio=0.0), exporter=spans)
    async with embedded_runtime(_config(upstream, request_sample_ratio=0.0), tmp_path) as runtime:
        before = len(upstream.stats()["traceparents"])
        await run_embedded_batch(runtime, "beta", _lines(6, failing=(2, 5)))
        finished = spans.get_finished_spans()
        requests = _by_name(finished, f"chat {MODEL}")
        assert sorted((s.attributes or {})[genai.CUSTOM_ID] for s in requests) == ["c2", "c5"]  # only the failures
        assert all((s.attributes or {})[genai.SAMPLED] is False for s in requests)
        assert len(_by_name(finished, "batch.shard")) == 2  # the batch's own spans are not request spans
        sent = upstream.stats()["traceparents"][before:]
        assert len(sent) == 6  # every request still carried a traceparent of its own
        # a kept failure's span is the one its traceparent named (made at its end, from its start)
        assert {format(s.context.span_id, "016x") for s in requests} <= {p.split("-")[2] for p in sent}
        assert all(s.start_time is not None and s.end_time is not None and s.start_time < s.end_time
                   for s in requests)


def test_the_sampling_rule_bounds_a_large_batchs_spans() -> None:
    from gateway.tracing.sampling import request_ratio

    assert request_ratio(TracingSettings(), 9_999) == 1.0
    assert request_ratio(TracingSettings(), 40_000) == 0.25  # 10,000 spans' worth
    assert request_ratio(TracingSettings(max_request_spans_per_batch=100), 1_000) == 0.1
    assert request_ratio(TracingSettings(request_sample_ratio=0.5), 10) == 0.5


async def test_content_is_captured_only_for_the_teams_named(upstream: Upstream, spans: InMemorySpanExporter,
                                                            tmp_path: Path) -> None:
    configure("api", TracingSettings(capture_content_teams=["alpha"]), exporter=spans)
    async with embedded_runtime(_config(upstream, capture_content_teams=["alpha"]), tmp_path) as runtime:
        alpha = await run_embedded_batch(runtime, "alpha", _lines(2))
        beta = await run_embedded_batch(runtime, "beta", _lines(2))
        finished = spans.get_finished_spans()
        by_trace = {tracing.trace_id(b.trace_context): b.owner for b in (alpha, beta)}
        for span in _by_name(finished, f"chat {MODEL}"):
            attrs = span.attributes or {}
            if by_trace[format(span.context.trace_id, "032x")] == "alpha":
                assert SECRET in str(attrs[genai.INPUT_MESSAGES]) and genai.OUTPUT_MESSAGES in attrs
            else:
                assert genai.INPUT_MESSAGES not in attrs and genai.OUTPUT_MESSAGES not in attrs
        _no_content(tuple(s for s in finished if by_trace.get(format(s.context.trace_id, "032x")) == "beta"))


async def test_with_tracing_off_nothing_is_stored_or_sent(upstream: Upstream, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert configure("api", TracingSettings()) is False and not tracing.enabled()
    async with embedded_runtime(_config(upstream), tmp_path) as runtime:
        before = len(upstream.stats()["traceparents"])
        batch = await run_embedded_batch(runtime, "alpha", _lines(3))
        assert batch.trace_context is None and tracing.trace_id(batch.trace_context) is None
        assert upstream.stats()["traceparents"][before:] == []


def test_the_variables_switch_traces_on_as_opentelemetry_documents() -> None:
    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert protocol({}) == "http/protobuf"
    assert protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}) \
        == "http/protobuf"


def test_a_protocol_we_cannot_send_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL.*http/protobuf"):
        configure("run")
    assert not tracing.enabled()


def test_a_content_team_must_be_a_team(upstream: Upstream) -> None:
    with pytest.raises(ConfigError, match="capture_content_teams.*'gamma' is not a team_id"):
        _config(upstream, capture_content_teams=["gamma"])


def test_log_lines_in_a_span_carry_its_ids(spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    configure("worker", exporter=spans)
    caplog.handler.addFilter(TraceIds())
    log = logging.getLogger("batchyard.test")
    with caplog.at_level(logging.INFO, "batchyard.test"):
        log.info("outside")
        with tracing.client_span("work"):
            log.info("inside")
    outside, inside = caplog.records
    [span] = spans.get_finished_spans()
    assert outside.trace_id == "" and outside.span_id == ""
    assert inside.trace_id == format(span.context.trace_id, "032x")
    assert inside.span_id == format(span.context.span_id, "016x")


async def test_a_native_job_has_spans_for_its_create_each_poll_and_the_download(
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    from providers.native.runner import NativeBatchBackend
    from tests.servers.test_native import chat, native_route, new_shard, run_shard

    configure("worker", exporter=spans)
    store = SQLiteStore(tmp_path / "store.sqlite3")
    try:
        with start_upstream(batch_delay=0.6) as native_upstream:
            backend = NativeBatchBackend(native_route(native_upstream), {}, store)
            shard = await new_shard(store, 3)
            with tracing.client_span("batch.shard"):  # as the runner's shard span would be
                results = await run_shard(backend, shard, [chat(1), chat(2), chat(3, f"{SECRET}")])
            await backend.aclose()
    finally:
        await store.aclose()
    assert all(r.ok for r in results)
    finished = spans.get_finished_spans()
    [parent] = _by_name(finished, "batch.shard")
    [create], polls, [download] = (_by_name(finished, f"batch_job.{n}") for n in ("create", "poll", "download"))
    assert len(polls) >= 1
    for span in (create, *polls, download):
        assert span.kind is SpanKind.CLIENT and span.parent is not None
        assert span.parent.span_id == parent.context.span_id
        assert (span.attributes or {})[genai.PROVIDER_NAME] == "openai"
    upstream_id = (download.attributes or {})[genai.UPSTREAM_BATCH_ID]
    assert upstream_id and all((p.attributes or {})[genai.UPSTREAM_BATCH_ID] == upstream_id for p in polls)
    assert (create.attributes or {})[genai.SHARD_LINES] == 3
    _no_content(finished)


async def test_litellms_own_path_sends_the_request_spans_traceparent(upstream: Upstream,
                                                                     spans: InMemorySpanExporter) -> None:
    from gateway.domain import BatchRequest, Endpoint
    from providers.litellm_backend import LiteLLMBackend

    configure("worker", exporter=spans)
    entry = {"model_name": "mistral", "litellm_params": {"model": "mistral/mistral-small", "api_key": "sk-traces",
                                                         "api_base": upstream.v1_url}}
    backend = LiteLLMBackend(list(parse_config({"model_list": [entry]}).routes.values()), {"num_retries": 0}, 4)
    before = len(upstream.stats()["traceparents"])
    request = BatchRequest(line=1, custom_id="m1", url=Endpoint.CHAT,
                           body={"model": "mistral", "messages": [{"role": "user", "content": SECRET}]})
    try:
        [result] = [r async for r in backend.execute([request])]
    finally:
        await backend.aclose()
    assert result.ok
    [span] = spans.get_finished_spans()  # LiteLLM translated the line for Mistral: its completion path
    assert span.name == "chat mistral" and (span.attributes or {})[genai.PROVIDER_NAME] == "mistral_ai"
    [sent] = upstream.stats()["traceparents"][before:]
    assert sent.split("-")[1:3] == [format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")]
    _no_content(spans.get_finished_spans())


@pytest.mark.parametrize("with_baggage", [False, True])
async def test_a_requests_headers_are_what_the_propagators_write(spans: InMemorySpanExporter,
                                                                  with_baggage: bool) -> None:
    """A request span's `traceparent` (and the parent's `tracestate`) is made from its ids, not by the
    propagators: the same headers they write. A context with baggage goes through them (and sends it)."""
    from opentelemetry import baggage, propagate
    from opentelemetry import context as otel_context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, set_span_in_context

    from gateway.domain import BatchRequest, Endpoint, Result
    from gateway.tracing.request_spans import capture, traced

    configure("worker", TracingSettings(), exporter=spans)
    parent = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=TraceState([("vendor", "v1")]))
    context = set_span_in_context(NonRecordingSpan(parent))
    if with_baggage:
        context = baggage.set_baggage("team", "alpha", context)
    seen: list[tuple[dict[str, str], dict[str, str]]] = []

    async def call(req: BatchRequest) -> Result:
        written: dict[str, str] = {}
        propagate.inject(written)  # what the propagators write for the span running now
        seen.append((tracing.outgoing({}), written))
        return Result(line=req.line, custom_id=req.custom_id, status_code=200, body={}, model=req.model)

    token = otel_context.attach(context)
    try:
        trace = capture(lambda _model: "openai")
        assert trace is not None and trace.w3c is not with_baggage
        for line in (1, 2):
            req = BatchRequest(line=line, custom_id=f"c{line}", url=Endpoint.CHAT, body={"model": MODEL})
            await traced(trace, req, call)
    finally:
        otel_context.detach(token)
    (first, first_written), (second, second_written) = seen
    assert first == first_written and second == second_written
    assert first["traceparent"] != second["traceparent"]  # each request its own span id
    assert first["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert first["traceparent"].endswith("-01") and first["tracestate"] == "vendor=v1"
    assert ("baggage" in first) is with_baggage
    assert tracing.outgoing({}) == {}  # after the requests: no span, no made headers left behind
