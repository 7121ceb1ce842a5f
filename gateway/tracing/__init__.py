"""OpenTelemetry traces: one batch, one trace, from the API call to each upstream or engine request.

- `switch`: on from the standard `OTEL_*` variables (off without them: the no-op path), the process's resource;
- `genai`: the attribute names (the GenAI semantic conventions' version followed, and ours);
- `batch_spans`: the batch's create span and stored context, its stages, its shards, native job calls, the
  `traceparent` headers for a call out;
- `request_spans`: a span per request (sampled; failures always kept) with the GenAI attributes;
- `offload`: the request spans exported from a child process (their encoding off the batch's own time);
- `otlp`: the OTLP exporter the variables ask for, and the resource its spans carry;
- `sampling`: the request sampling rule, and the span ids that let a failure outside the sample be kept;
- `api_spans`: the API's SERVER spans (FastAPI's instrumentation);
- `process`: a process's start (its role, its log lines);
- `logs`: `trace_id`/`span_id` on the log lines written inside a span.

It imports nothing above `gateway.config`: the pipeline, the providers, the engine, the API and the CLI call it.
"""

from gateway.tracing.api_spans import instrument_app
from gateway.tracing.batch_spans import (
    batch_create,
    client_span,
    headers,
    outgoing,
    pacing_event,
    remote_span,
    shard_span,
    stage,
    status_event,
    stored_context,
    trace_id,
)
from gateway.tracing.process import start_process
from gateway.tracing.request_spans import RequestTrace, capture, traced
from gateway.tracing.switch import configure, enabled, flush, shutdown

__all__ = [
    "RequestTrace",
    "batch_create",
    "capture",
    "client_span",
    "configure",
    "enabled",
    "flush",
    "headers",
    "instrument_app",
    "outgoing",
    "pacing_event",
    "remote_span",
    "shard_span",
    "shutdown",
    "stage",
    "start_process",
    "status_event",
    "stored_context",
    "trace_id",
    "traced",
]
