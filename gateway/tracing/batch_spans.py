"""A batch's spans: one trace from its create call to its end, across every process that works on it.

A batch lives for hours and passes through several processes, so no one span can cover its life. Instead:

- `batch_create`: a short `batch.create` span at create (a child of the API's SERVER span, the root of the
  batch's trace; the caller's `traceparent` is a link on both: `gateway.tracing.caller_trace`); its context
  is stored with the batch record (`BatchRecord.trace_context`, W3C `traceparent`/`tracestate`, in both
  stores).
- `stage`: each later stage (`batch.validate`, `batch.finalize`) is a child of that stored context, in
  whichever process runs it; `status_event` marks a status change on the stage's span.
- `shard_span`: a span per shard attempt (route, team, lines, attempt), a child of the stored context; the
  request spans of its lines (`gateway.tracing.request_spans`) are its children.
- `headers`: the W3C headers of the current span, for a call out (an upstream, a native batch job's API).

Tracing off (`gateway.tracing.switch`): every helper returns at once and nothing is stored.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.tracing import genai
from gateway.tracing.caller_trace import caller_link
from gateway.tracing.sampling import request_ratio
from gateway.tracing.switch import STATE

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span

    from gateway.domain import Shard
    from gateway.store.records import BatchRecord

# The share of requests a shard's request spans keep, and the shard's team (set by `shard_span`)
_REQUESTS: contextvars.ContextVar[tuple[float, str] | None] = contextvars.ContextVar("batchyard_trace_requests",
                                                                                      default=None)


# The W3C headers of the request span running now, made once by `gateway.tracing.request_spans.traced` from
# the ids it already holds, where the propagators are W3C's own and the context carries no baggage: what
# `propagate.inject` would write, without its walk through the composite propagator (a few us a request).
OUTGOING: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("batchyard_trace_outgoing",
                                                                                 default=None)


def carrier() -> dict[str, str]:
    """The current span's context as W3C headers (empty when none is recording)."""
    made = OUTGOING.get()
    if made is not None:
        return dict(made)
    out: dict[str, str] = {}
    propagate.inject(out)
    return out


def w3c_propagators() -> bool:
    """Whether the global propagators are the default W3C pair (`OTEL_PROPAGATORS` unset or
    `tracecontext,baggage`), so that `traceparent`/`tracestate` are all a context without baggage writes."""
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    textmap = propagate.get_global_textmap()
    parts = (getattr(textmap, "_propagators", None) or []) if isinstance(textmap, CompositePropagator) else [textmap]
    return bool(parts) and all(type(p) in (TraceContextTextMapPropagator, W3CBaggagePropagator) for p in parts)


def headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span, for a request out; {} with tracing off."""
    if STATE.tracer is None:
        return {}
    return carrier()


def outgoing(base: dict[str, str]) -> dict[str, str]:
    """`base` with the current span's `traceparent` added (`base` itself with tracing off)."""
    if STATE.tracer is None:
        return base
    made = OUTGOING.get()  # a request's own (read, not copied: it is merged into a new dict here)
    return {**base, **(made if made is not None else carrier())}


def trace_id(trace_context: Mapping[str, str] | None) -> str | None:
    """The trace id (32 hex digits) of a stored context, for people to look the trace up; None without one."""
    parts = (trace_context or {}).get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 and parts[1].strip("0") else None


def stored_context(batch: BatchRecord | None) -> Context | None:
    """The context a stage of `batch` starts its span in (None: a root span, e.g. a batch created with
    tracing off)."""
    if batch is None or not batch.trace_context:
        return None
    return propagate.extract(batch.trace_context)


@contextlib.contextmanager
def _span(name: str, context: Context | None, attributes: dict[str, Any], kind: SpanKind = SpanKind.INTERNAL,
          fault: Callable[[Exception], str | None] | None = None, links: list[Link] | None = None) -> Iterator[Span]:
    """A current span; an exception marks it ERROR with `error.type` (its class) and, when `fault` names one,
    `batchyard.machine_fault`. The exception's message is not recorded: it may quote a line."""
    assert STATE.tracer is not None
    with STATE.tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes, links=links,
                                            record_exception=False, set_status_on_exception=False) as span:
        try:
            yield span
        except Exception as exc:
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute(genai.ERROR_TYPE, type(exc).__qualname__)
            kind_of_fault = fault(exc) if fault is not None else None
            if kind_of_fault:
                span.set_attribute(genai.MACHINE_FAULT, kind_of_fault)
            raise


def _batch_attributes(batch: BatchRecord) -> dict[str, Any]:
    return {genai.BATCH_ID: batch.id, genai.TEAM: batch.owner, genai.ENDPOINT: batch.endpoint}


@contextlib.contextmanager
def batch_create(batch: BatchRecord) -> Iterator[None]:
    """The `batch.create` span around a batch's admission and first write; sets `batch.trace_context`."""
    if STATE.tracer is None:
        yield
        return
    link = caller_link()  # the caller's traceparent: a link, never the parent (gateway.tracing.caller_trace)
    if link is not None:
        root = trace.get_current_span()  # the API's span for the call: the root of the batch's trace
        if root.is_recording():
            root.add_link(link.context, link.attributes)
    with _span("batch.create", None, _batch_attributes(batch), links=[link] if link is not None else None) as span:
        if span.get_span_context().is_valid:  # not sampled too: its stages then follow the decision
            batch.trace_context = carrier()
        yield


@contextlib.contextmanager
def stage(name: str, batch: BatchRecord | None) -> Iterator[None]:
    """A stage of the batch's life (`batch.validate`, `batch.finalize`) in the batch's trace."""
    if STATE.tracer is None or batch is None:
        yield
        return
    with _span(name, stored_context(batch), {**_batch_attributes(batch), genai.STATUS: batch.status.value}):
        yield


@contextlib.contextmanager
def remote_span(name: str, trace_context: Mapping[str, str] | None) -> Iterator[None]:
    """A span in another process's trace (`trace_context`: the W3C headers it handed over); none without."""
    if STATE.tracer is None or not trace_context:
        yield
        return
    with _span(name, propagate.extract(dict(trace_context)), {}):
        yield


def status_event(status: Any, **counts: int) -> None:
    """A status change, as an event on the current span (the stage's); final counts as its attributes too."""
    if STATE.tracer is None:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    value = str(getattr(status, "value", status))
    span.add_event("batch.status", {genai.STATUS: value, **{f"batchyard.batch.{k}": v for k, v in counts.items()}})
    span.set_attribute(genai.STATUS, value)
    for key, number in counts.items():
        span.set_attribute(f"batchyard.batch.{key}", number)


def pacing_event(route: str, before: int, after: int, attributes: Mapping[str, Any]) -> None:
    """A background route's allowed concurrency changed (`providers.background`): the event
    `background.concurrency` on a span of its own (the pacing runs outside any batch's trace)."""
    if STATE.tracer is None:
        return
    attrs = {genai.ROUTE: route, "batchyard.background.allowed_before": before,
             "batchyard.background.allowed": after, **attributes}
    from opentelemetry.context import Context as Root  # an empty context: a root span, in no batch's trace

    span = STATE.tracer.start_span("background.pace", context=Root(), attributes={genai.ROUTE: route})
    span.add_event("background.concurrency", attrs)
    span.end()


@contextlib.contextmanager
def shard_span(shard: Shard, batch: BatchRecord, attempt: int | None = None,
               fault: Callable[[Exception], str | None] | None = None) -> Iterator[None]:
    """A shard's run, a child of its batch's stored context; its request spans are sampled at the batch's
    ratio (`gateway.tracing.sampling.request_ratio`). `fault`: the kind of machine fault an exception is, if
    any (the store's classifier, handed in): the span names the fault the shard stopped on."""
    if STATE.tracer is None:
        yield
        return
    attributes: dict[str, Any] = {**_batch_attributes(batch), genai.ROUTE: shard.route, genai.SHARD: shard.index,
                                  genai.SHARD_LINES: shard.size, genai.LINES: batch.counts.total}
    if attempt is not None:
        attributes[genai.ATTEMPT] = attempt
    with _span("batch.shard", stored_context(batch), attributes, fault=fault):
        token = _REQUESTS.set((request_ratio(STATE.settings, batch.counts.total or shard.size), batch.owner))
        try:
            yield
        finally:
            _REQUESTS.reset(token)


@contextlib.contextmanager
def client_span(name: str, attributes: Mapping[str, Any] | None = None, *, current: bool = True) -> Iterator[None]:
    """A call out that is no request of a line: a native batch job's call to its provider (`batch_job.create`,
    `.poll`, `.download`), `submit`'s session with a gateway. A CLIENT span in the current trace (a shard's, or
    a new one); an exception marks it ERROR with its type."""
    if STATE.tracer is None:
        yield
        return
    if not current:  # around the yields of an async generator: its consumer must not run inside the span
        span = STATE.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=dict(attributes or {}))
        try:
            yield
        except Exception as exc:
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute(genai.ERROR_TYPE, type(exc).__qualname__)
            raise
        finally:
            span.end()
        return
    with _span(name, None, dict(attributes or {}), SpanKind.CLIENT):
        yield


def requests_sampling() -> tuple[float, str] | None:
    """(the share of requests to keep, the team) of the shard running here; None outside a shard span."""
    return _REQUESTS.get()


__all__ = [
    "batch_create",
    "carrier",
    "client_span",
    "headers",
    "outgoing",
    "remote_span",
    "requests_sampling",
    "shard_span",
    "stage",
    "status_event",
    "stored_context",
    "trace_id",
]
