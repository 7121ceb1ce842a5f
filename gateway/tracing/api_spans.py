"""The API's SERVER spans: FastAPI's OpenTelemetry instrumentation, one span per request, the root of a trace
of the gateway's own (the caller's `traceparent` a link on it, or its parent with `trust_caller_trace`:
`gateway.tracing.caller_trace`). `/metrics` and `/health` are left out (scrapes and probes, every few
seconds)."""

from __future__ import annotations

from typing import Any

from gateway.tracing.caller_trace import CallerTraceHeaders
from gateway.tracing.switch import STATE

EXCLUDED_URLS = "/metrics,/health"  # the instrumentation's list: regular expressions searched in the URL


def instrument_app(app: Any, *, trust_caller_trace: bool = False) -> None:
    """Instrument a FastAPI app when tracing is on (nothing otherwise: the instrumentation is not imported,
    no caller's trace header is read, and none is sent anywhere)."""
    if STATE.provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=STATE.provider, excluded_urls=EXCLUDED_URLS)
    # The caller's trace headers are taken out before the instrumentation's middleware reads them: the
    # stack it builds is wrapped once more, outermost.
    build = app.build_middleware_stack

    def build_with_caller_headers() -> Any:
        return CallerTraceHeaders(build(), trust=trust_caller_trace)

    app.build_middleware_stack = build_with_caller_headers


__all__ = ["EXCLUDED_URLS", "instrument_app"]
