"""Log lines written while a span is active carry its `trace_id` and `span_id` (the W3C hex forms), so a
log line leads to its trace. A `logging.Filter` on the root logger's handlers: it adds the two fields to every
record (empty outside a span, or with tracing off), and `install` puts them at the end of the handlers'
format (`trace_ids`: both, or nothing outside a span)."""

from __future__ import annotations

import logging

from opentelemetry import trace

from gateway.tracing.switch import STATE

TRACE_FORMAT = "%(trace_ids)s"  # " trace_id=… span_id=…" inside a span, nothing outside


class TraceIds(logging.Filter):
    """Sets `record.trace_id` / `record.span_id` from the span active where the line is written."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = span_id = ""
        if STATE.tracer is not None:
            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                trace_id, span_id = format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")
        record.trace_id, record.span_id = trace_id, span_id
        record.trace_ids = f" trace_id={trace_id} span_id={span_id}" if trace_id else ""
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Add the filter to the handlers of `logger` (the root's), and with tracing on the ids to their format."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if any(isinstance(f, TraceIds) for f in handler.filters):
            continue
        handler.addFilter(TraceIds())
        formatter = handler.formatter
        if STATE.tracer is not None and formatter is not None and "%(trace_ids)" not in (formatter._fmt or ""):
            handler.setFormatter(logging.Formatter((formatter._fmt or "%(message)s") + TRACE_FORMAT,
                                                   formatter.datefmt))


__all__ = ["TRACE_FORMAT", "TraceIds", "install"]
