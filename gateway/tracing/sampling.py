"""Which request spans are sent: a share of a batch's requests, and every failed one.

A request's span must exist while the request runs (its `traceparent` goes to the upstream), but whether it
is kept can only be known at its end (a failure is always kept). So every request of a sampled batch gets a
recording span marked with `batchyard.request.sampled`, and `RequestSampling` (the processor in front of the
exporter's) drops, at the span's end, one outside the sample that did not fail. Batch, stage and shard spans
carry no mark: the SDK's own sampler (`OTEL_TRACES_SAMPLER`) decides those.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from gateway.config.sections import TracingSettings
from gateway.tracing.genai import SAMPLED


def request_ratio(settings: TracingSettings, lines: int) -> float:
    """The share of a batch's requests that get a span: the config's ratio, or all of a batch under
    `max_request_spans_per_batch` lines and that many spans' worth of a larger one."""
    if settings.request_sample_ratio is not None:
        return settings.request_sample_ratio
    bound = settings.max_request_spans_per_batch
    return 1.0 if lines <= bound else bound / lines


class RequestSampling(SpanProcessor):
    """Hands every span on to `inner` but a request span outside the sample that ended well."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes or {}
        if attributes.get(SAMPLED) is False and span.status.status_code is not StatusCode.ERROR:
            return
        self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> Any:
        return self.inner.force_flush(timeout_millis)


__all__ = ["RequestSampling", "request_ratio"]
