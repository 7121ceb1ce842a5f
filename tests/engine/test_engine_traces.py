"""The in-process vLLM engine joins the batch's trace: each request's INTERNAL span hands its `traceparent` to
vLLM (`trace_headers`), and an engine started with `otlp_traces_endpoint` exports its own `llm_request` span
below ours, to a real OTLP/HTTP receiver on loopback. A real engine on CPU with the tiny model."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway import tracing
from gateway.domain import BatchRequest, Endpoint
from gateway.tracing import genai
from local_engine import LocalEngineBackend, TinyModels
from tests.fakes.otlp_receiver import OTLPReceiver
from tests.support.engine_helpers import built_tiny_models
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.engine,
    # its own loop: the session loop can be gone when this file follows another on the same xdist worker (a
    # CLI test's asyncio.run() leaves no current loop, and pytest-asyncio's session runner then fails)
    pytest.mark.asyncio(loop_scope="function"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (the engine extra) is not installed"),
]

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ENGINE_ARGS = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return built_tiny_models(tmp_path_factory)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rec:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # vLLM's default is grpc
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        # vLLM writes its endpoint into this process's environment (for its children) and leaves it there: set
        # here, it is taken back at the test's end, or a later test's processes would send to a closed port
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{rec.url}/v1/traces")
        yield rec


async def test_vllms_request_span_is_a_child_of_ours(tiny_models: TinyModels, receiver: OTLPReceiver) -> None:
    ours = InMemorySpanExporter()
    tracing.configure("worker", exporter=ours)
    backend = LocalEngineBackend({**ENGINE_ARGS, "model": tiny_models.llama, "served_model_name": ["tiny-llama"],
                                  "otlp_traces_endpoint": f"{receiver.url}/v1/traces"})
    try:
        await backend.start()
        request = BatchRequest(1, "c1", Endpoint.CHAT, {"model": "tiny-llama", "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "Hello world!"}]})
        [result] = [r async for r in backend.execute([request])]
    finally:
        await backend.aclose()
        tracing.shutdown()
    assert result.ok, result.body
    [span] = ours.get_finished_spans()
    assert span.kind is SpanKind.INTERNAL and span.name == "chat tiny-llama"
    assert (span.attributes or {})[genai.PROVIDER_NAME] == "vllm"
    assert (span.attributes or {})[genai.OUTPUT_TOKENS] == 4
    [engine] = eventually(lambda: receiver.named("llm_request") or None, 30, "vLLM's llm_request span")
    assert engine.trace_id == format(span.context.trace_id, "032x")
    assert engine.parent_span_id == format(span.context.span_id, "016x")
