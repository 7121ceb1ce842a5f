"""The trace headers a caller sends, read as OpenTelemetry advises for an untrusted caller.

A caller is another team's program: its `traceparent` must not pick the batch's trace id or its sampled flag,
and its `tracestate` and `baggage` (vendor and application data) must not travel on to the upstreams the
batch calls. So, before FastAPI's instrumentation reads them (`CallerTraceHeaders`, the outermost ASGI layer
with tracing on):

- every trace header is taken out of the request; the API's span for the call starts the batch's own
  trace, and the caller's `traceparent`, when well formed, becomes a *link* on it and on `batch.create`
  (`caller_link`): the caller's trace still finds the batch, the batch's trace is the gateway's;
- with `batch_settings.trust_caller_trace: true` (a deployment whose callers are the operator's own), a
  well-formed `traceparent` is left in and continued, as before; `tracestate`, `baggage` and the other
  propagators' headers are still taken out, so nothing of the caller's goes to an upstream either way;
- a `traceparent` is W3C's 55 characters (version, trace id, span id, flags) or it is ignored: no header of
  the caller's is read past that size.
"""

from __future__ import annotations

import contextvars
import re
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from opentelemetry.trace import Link

TRACEPARENT = b"traceparent"
TRACEPARENT_CHARS = 55  # W3C Trace Context, version 00: 2-32-16-2 hex digits and their dashes
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
# Every header a propagator OpenTelemetry ships reads (W3C's, B3's, Jaeger's, OpenTracing's, AWS X-Ray's,
# Google's): none of the caller's is read by the instrumentation nor carried on.
_TRACE_HEADERS = frozenset({
    b"traceparent", b"tracestate", b"baggage", b"b3", b"x-b3-traceid", b"x-b3-spanid", b"x-b3-parentspanid",
    b"x-b3-sampled", b"x-b3-flags", b"uber-trace-id", b"x-amzn-trace-id", b"x-cloud-trace-context",
    b"grpc-trace-bin", b"ot-tracer-traceid", b"ot-tracer-spanid", b"ot-tracer-sampled",
})
_TRACE_PREFIXES = (b"uberctx-", b"ot-baggage-")

# The caller's `traceparent`, parsed, while its request runs (read by `batch_spans.batch_create`)
_CALLER: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar("batchyard_caller_trace",
                                                                                    default=None)


def parsed_traceparent(value: bytes) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a well-formed W3C `traceparent` of at most 55 characters; None else."""
    if len(value) != TRACEPARENT_CHARS or (m := _TRACEPARENT.fullmatch(value)) is None or m.group(1) == b"ff":
        return None
    trace_id, span_id = int(m.group(2), 16), int(m.group(3), 16)
    return (trace_id, span_id, int(m.group(4), 16)) if trace_id and span_id else None


def caller_link() -> Link | None:
    """A link to the span the caller's `traceparent` named, for the batch's own spans; None without one."""
    found = _CALLER.get()
    if found is None:
        return None
    from opentelemetry.trace import Link, SpanContext, TraceFlags

    trace_id, span_id, flags = found
    return Link(SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1)),
                {"batchyard.link": "caller"})


class CallerTraceHeaders:
    """The caller's trace headers out of each HTTP request (the `traceparent` left in when `trust`, and well
    formed), the caller's `traceparent` kept for `caller_link`."""

    def __init__(self, app: ASGIApp, *, trust: bool) -> None:
        self.app, self.trust = app, trust

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kept: list[tuple[bytes, bytes]] = []
        caller: tuple[int, int, int] | None = None
        for name, value in scope.get("headers") or ():
            lower = name.lower()
            if lower == TRACEPARENT:  # the first well-formed one counts; with trust, it alone goes on
                if caller is None and (caller := parsed_traceparent(value)) is not None and self.trust:
                    kept.append((name, value))
            elif lower not in _TRACE_HEADERS and not lower.startswith(_TRACE_PREFIXES):
                kept.append((name, value))
        token = _CALLER.set(None if self.trust else caller)
        try:
            await self.app({**scope, "headers": kept}, receive, send)
        finally:
            _CALLER.reset(token)


__all__ = ["TRACEPARENT_CHARS", "CallerTraceHeaders", "caller_link", "parsed_traceparent"]
