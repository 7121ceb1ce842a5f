"""The API's SERVER spans: FastAPI's OpenTelemetry instrumentation, one span per request, continuing the
caller's W3C `traceparent`. `/metrics` and `/health` are left out (scrapes and probes, every few seconds)."""

from __future__ import annotations

from typing import Any

from gateway.tracing.switch import STATE

EXCLUDED_URLS = "/metrics,/health"  # the instrumentation's list: regular expressions searched in the URL


def instrument_app(app: Any) -> None:
    """Instrument a FastAPI app when tracing is on (nothing otherwise: the instrumentation is not imported)."""
    if STATE.provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=STATE.provider, excluded_urls=EXCLUDED_URLS)


__all__ = ["EXCLUDED_URLS", "instrument_app"]
