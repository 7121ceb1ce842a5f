"""Traces switched on (or not) the way OpenTelemetry users switch them on: the standard `OTEL_*` variables.

- On when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set, unless
  `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. Off otherwise: no provider, no exporter, no thread;
  every helper of this package returns at its first line (the no-op path costs a flag test).
- `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: `http/protobuf` (ours, and the default); `grpc` needs
  `opentelemetry-exporter-otlp-proto-grpc`, which batchyard does not depend on: refused with a clear message
  when it is not installed. The exporter reads its own variables (endpoint, headers, timeout, compression).
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the SDK's resource detection; our default service name is
  `batchyard`, and every process adds `service.instance.id` and `batchyard.role` (api, worker, validation,
  run, submit). `OTEL_TRACES_SAMPLER[_ARG]`: the SDK's sampler (parent-based always-on by default);
  `OTEL_BSP_*`: the batch span processor's.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.resources import Resource

from gateway.config.sections import TracingSettings
from gateway.tracing.otlp import HashedResource, otlp_exporter, protocol

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Tracer

    from gateway.tracing.offload import OffloadedSpans

log = logging.getLogger("batchyard.tracing")

ROLES = ("api", "worker", "validation", "run", "submit")


@dataclass(slots=True)
class _State:
    tracer: Tracer | None = None  # None: tracing is off
    provider: TracerProvider | None = None
    processor: SpanProcessor | None = None  # the provider's one span processor (request spans are handed to it)
    resource: Resource | None = None  # the provider's, and the tracer's scope: what a request span carries
    scope: InstrumentationScope | None = None
    offload: OffloadedSpans | None = None  # with OTLP: where request spans go (`gateway.tracing.offload`)
    settings: TracingSettings = field(default_factory=TracingSettings)
    capture_teams: frozenset[str] = frozenset()


STATE = _State()


def wanted(env: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """Whether the variables ask for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(role: str, settings: TracingSettings | None = None, *, exporter: SpanExporter | None = None) -> bool:
    """Set this process's tracing up from the variables (and the config's `batch_settings.tracing`); True when
    on. Once per process; again replaces the provider (tests). `exporter`: instead of OTLP, whatever the
    variables say (the tests' in-memory exporter): tracing is then on without them."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    shutdown()
    STATE.settings = settings or TracingSettings()
    STATE.capture_teams = frozenset(STATE.settings.capture_content_teams)
    if exporter is None and not wanted():
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from gateway.tracing.sampling import SpanIds

    resource = Resource.create({"service.instance.id": f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                                "batchyard.role": role})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "batchyard"}))
    resource = HashedResource(resource.attributes, resource.schema_url)
    provider = TracerProvider(resource=resource, id_generator=SpanIds())
    scope = InstrumentationScope("batchyard")  # the tracer's own
    processor: SpanProcessor
    if exporter is not None:  # the tests' exporter: every span at its end, in order, in this process
        processor, STATE.offload = SimpleSpanProcessor(exporter), None
    else:
        from gateway.tracing.offload import OffloadedSpans

        processor = BatchSpanProcessor(otlp_exporter())
        STATE.offload = OffloadedSpans(resource, scope, processor)  # the request spans' way out
        provider.add_span_processor(STATE.offload)  # first: flushed and shut down before its fallback
    provider.add_span_processor(processor)
    STATE.provider, STATE.processor = provider, processor
    STATE.tracer = provider.get_tracer("batchyard")
    STATE.resource, STATE.scope = provider.resource, scope
    return True


def shutdown() -> None:
    """Send what is buffered and switch tracing off (a process's end; tests between cases)."""
    provider, STATE.provider, STATE.tracer, STATE.processor = STATE.provider, None, None, None
    STATE.offload = None
    if provider is not None:
        provider.shutdown()


def flush(timeout_millis: int = 5_000) -> None:
    if STATE.provider is not None:
        STATE.provider.force_flush(timeout_millis)


def enabled() -> bool:
    return STATE.tracer is not None


def tracer() -> Any:
    return STATE.tracer


__all__ = ["ROLES", "STATE", "configure", "enabled", "flush", "protocol", "shutdown", "tracer", "wanted"]
