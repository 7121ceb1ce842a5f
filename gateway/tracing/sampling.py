"""Which request spans are sent: a share of a batch's requests, and every failed one.

A request's `traceparent` goes out while it runs, but whether its span is kept can only be known at its end
(a failure is always kept). So every request runs under a span id only (in its `traceparent`; in the
sample also as a non-recording current span: no attributes, no export, almost no cost), and at its end a
real span is made with that same id and the request's start time when it is in the sample, or failed: then
marked `batchyard.request.sampled: false` (a span the tracer makes takes the id through `forced_span_id`,
read by `SpanIds`, the provider's id generator). Whatever the upstream
traced under that `traceparent` then hangs below it. Batch, stage and shard spans are not sampled here: the
SDK's sampler (`OTEL_TRACES_SAMPLER`) decides those.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from gateway.config.sections import TracingSettings

_FORCED: contextvars.ContextVar[int] = contextvars.ContextVar("batchyard_forced_span_id", default=0)


def request_ratio(settings: TracingSettings, lines: int) -> float:
    """The share of a batch's requests that get a span: the config's ratio, or all of a batch under
    `max_request_spans_per_batch` lines and that many spans' worth of a larger one."""
    if settings.request_sample_ratio is not None:
        return settings.request_sample_ratio
    bound = settings.max_request_spans_per_batch
    return 1.0 if lines <= bound else bound / lines


class SpanIds(RandomIdGenerator):
    """The SDK's random ids, but the span id `forced_span_id` names while it is in force."""

    def generate_span_id(self) -> int:
        return _FORCED.get() or super().generate_span_id()


@contextlib.contextmanager
def forced_span_id(span_id: int) -> Iterator[None]:
    """The next span started here gets `span_id` (that of a request outside the sample, now kept)."""
    token = _FORCED.set(span_id)
    try:
        yield
    finally:
        _FORCED.reset(token)


__all__ = ["SpanIds", "forced_span_id", "request_ratio"]
