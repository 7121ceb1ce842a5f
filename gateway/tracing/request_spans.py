"""A span per upstream or engine request, named and attributed by the GenAI conventions (`genai`).

`capture` is called where a shard's requests are set off (`gateway.backends.bounded.BoundedRun`): it keeps
the current context (the shard's span), the shard's sampling share and whether the team's content is
captured. `traced` then runs each request's call under its span: CLIENT for an upstream, INTERNAL for the
in-process engine, named `{gen_ai.operation.name} {gen_ai.request.model}`, made with all its attributes when
the request ends (under the span id its `traceparent` carried). The backends send that `traceparent` on
(`gateway.tracing.batch_spans.headers`), so the upstream's or vLLM's spans join the trace.

What a span never holds: a key, a token, a header value, and (unless `capture_content_teams` names the team)
any prompt or completion text. The line's `custom_id` and our cost are ours to show.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
    set_span_in_context,
)

from gateway.tracing import genai
from gateway.tracing.batch_spans import OUTGOING, requests_sampling, w3c_propagators
from gateway.tracing.sampling import forced_span_id
from gateway.tracing.switch import STATE

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from gateway.domain import BatchRequest, Result
    from gateway.tracing.offload import Record

_ERROR, _UNSET = Status(StatusCode.ERROR), Status(StatusCode.UNSET)

Call = Callable[["BatchRequest"], Coroutine[Any, Any, "Result"]]


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """What the request spans of one run share."""

    context: Context
    ratio: float
    capture_content: bool
    provider: Callable[[str], str]  # the request's model -> gen_ai.provider.name
    kind: SpanKind
    parent: SpanContext  # the shard span's
    w3c: bool  # each request's headers made from its ids (`batch_spans.OUTGOING`), not by the propagators
    trace_state: str  # the parent's tracestate as a header ("" without): how an offloaded span carries it
    # a request's `traceparent` is these two around its span id: the trace's part is formatted once a shard
    traceparent: tuple[str, str]


def capture(provider: Callable[[str], str], *, internal: bool = False) -> RequestTrace | None:
    """The request spans' parent and sampling for the requests about to be set off (None: tracing is off)."""
    if STATE.tracer is None:
        return None
    sampling = requests_sampling()
    ratio, team = sampling if sampling is not None else (1.0, "")
    context = otel_context.get_current()
    kind = SpanKind.INTERNAL if internal else SpanKind.CLIENT
    w3c = w3c_propagators() and not baggage.get_all(context)
    parent = get_current_span(context).get_span_context()
    return RequestTrace(context, ratio, team in STATE.capture_teams, provider, kind, parent, w3c,
                        parent.trace_state.to_header() if parent.trace_state else "",
                        (f"00-{parent.trace_id:032x}-", f"-{parent.trace_flags:02x}"))


async def traced(trace: RequestTrace, req: BatchRequest, call: Call) -> Result:
    """`call(req)` under the request's span.

    The span is made when the request ends, whether it is in the sample or not: while it runs, its span id
    goes out in its `traceparent` (the upstream's and the engine's spans hang below it), and at its end the
    span is made whole, with every attribute and the request's start time (`_span`). A span held open for the
    request instead (attributes set twice, a recording span made current and restored) cost about 80 us a
    request against 24 (measured in-process, 20,000 requests).
    Outside the sample the span is made only if the request failed (`gateway.tracing.sampling`). Such a
    request (99 of 100 at a 1% sample) only sets its headers (`batch_spans.OUTGOING`): no OpenTelemetry
    context is made current for it, as it has no span to show while it runs (a log line written then names
    the shard's span). In the sample, or with propagators other than W3C's, the current span while it runs is
    a non-recording one with the id the real span will have."""
    sampled = trace.ratio >= 1.0 or random.random() < trace.ratio
    parent = trace.parent
    if not parent.is_valid:  # no shard span to hang under (its sampler dropped it): a span of its own
        return await _rooted(trace, req, call) if sampled else await call(req)
    span_id = random.getrandbits(64) or 1
    made = None
    if trace.w3c:
        made = {"traceparent": f"{trace.traceparent[0]}{span_id:016x}{trace.traceparent[1]}"}
        if trace.trace_state:
            made["tracestate"] = trace.trace_state
    started = time.time_ns()
    token = None
    if sampled or made is None:
        ghost = NonRecordingSpan(SpanContext(parent.trace_id, span_id, is_remote=False,
                                             trace_flags=parent.trace_flags, trace_state=parent.trace_state))
        token = otel_context.attach(set_span_in_context(ghost, trace.context))
    headers = OUTGOING.set(made)
    try:
        result = await call(req)
    except BaseException as exc:  # cancelled or a backend's bug: the span says so, the caller handles it
        if sampled:
            _span(trace, req, span_id, started, sampled, {genai.ERROR_TYPE: type(exc).__qualname__}, error=True)
        raise
    finally:
        OUTGOING.reset(headers)
        if token is not None:
            otel_context.detach(token)
    if sampled or not result.ok:
        _span(trace, req, span_id, started, sampled, *_outcome(req, result, trace.capture_content))
    return result


def _span(trace: RequestTrace, req: BatchRequest, span_id: int, started: int, sampled: bool,
          outcome: dict[str, Any], error: bool) -> None:
    """The request's span, with the id its `traceparent` carried, handed on ended: to the export process
    (`gateway.tracing.offload`, with OTLP) or to the span processor.

    A request span is a finished record when it is made: it is built as the SDK's `ReadableSpan` (what the
    processor and exporter take) instead of through `Tracer.start_span`, whose live-span machinery (a lock,
    the sampler, each attribute validated and copied into a bounded mapping) is for spans still open. Its
    parent's sampling decision holds (a parent the sampler dropped: no span), its attributes are of the types
    OTel allows by construction (`_attributes`, `_outcome`), and a team whose content is captured (unbounded
    strings) goes through the tracer, which applies `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`."""
    parent = trace.parent
    if not parent.trace_flags.sampled:
        return
    operation = genai.operation(req.url)
    attributes = _attributes(trace, req, operation, sampled=sampled)
    attributes.update(outcome)
    name = f"{operation} {req.model}"
    if trace.capture_content or STATE.processor is None:
        assert STATE.tracer is not None
        with forced_span_id(span_id):
            span = STATE.tracer.start_span(name, context=trace.context, kind=trace.kind, attributes=attributes,
                                           start_time=started, record_exception=False,
                                           set_status_on_exception=False)
        span.set_status(_ERROR if error else _UNSET)
        span.end()
        return
    record: Record = (name, parent.trace_id, span_id, parent.span_id, parent.trace_flags, trace.trace_state,
                      trace.kind.value, error, started, time.time_ns(), attributes)
    if STATE.offload is not None:  # exported from a helper process (`gateway.tracing.offload`)
        STATE.offload.add(record)
        return
    from gateway.tracing.offload import readable  # the tests' exporter only: with OTLP they went above

    assert STATE.resource is not None and STATE.scope is not None  # set with the processor
    STATE.processor.on_end(readable(record, STATE.resource, STATE.scope))


async def _rooted(trace: RequestTrace, req: BatchRequest, call: Call) -> Result:
    """A sampled request with no parent span: a root span of its own, held open while it runs."""
    operation = genai.operation(req.url)
    assert STATE.tracer is not None
    with STATE.tracer.start_as_current_span(f"{operation} {req.model}", context=trace.context, kind=trace.kind,
                                            attributes=_attributes(trace, req, operation, sampled=True),
                                            record_exception=False, set_status_on_exception=False) as span:
        try:
            result = await call(req)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute(genai.ERROR_TYPE, type(exc).__qualname__)
            raise
        outcome, error = _outcome(req, result, trace.capture_content)
        span.set_attributes(outcome)
        if error:
            span.set_status(Status(StatusCode.ERROR))
    return result


def _attributes(trace: RequestTrace, req: BatchRequest, operation: str, *, sampled: bool) -> dict[str, Any]:
    # Few on purpose: the SDK checks every attribute of every span, and a batch has thousands of them.
    model = req.model
    attributes: dict[str, Any] = {genai.OPERATION_NAME: operation, genai.PROVIDER_NAME: trace.provider(model),
                                  genai.REQUEST_MODEL: model, genai.CUSTOM_ID: req.custom_id}
    if not sampled:
        attributes[genai.SAMPLED] = False  # kept because it failed
    return attributes


def _outcome(req: BatchRequest, result: Result, capture_content: bool) -> tuple[dict[str, Any], bool]:
    """The reply's facts for the request's span (content only with `capture_content`), and whether it failed."""
    body = result.body if isinstance(result.body, dict) else {}
    attributes: dict[str, Any] = {}
    if capture_content:
        attributes[genai.INPUT_MESSAGES] = _json(_input(req.body))
    if not result.ok:
        attributes.update({genai.ERROR_TYPE: _error_type(result, body), genai.LINE: req.line})
        if result.status_code is not None:
            attributes[genai.HTTP_STATUS] = result.status_code
        return attributes, True
    usage = result.usage
    attributes.update({genai.INPUT_TOKENS: usage.input_tokens, genai.OUTPUT_TOKENS: usage.output_tokens,
                       genai.PROMPT_TOKENS: usage.input_tokens, genai.COMPLETION_TOKENS: usage.output_tokens})
    if isinstance(body.get("model"), str):
        attributes[genai.RESPONSE_MODEL] = body["model"]
    reasons = _finish_reasons(body)
    if reasons:
        attributes[genai.FINISH_REASONS] = tuple(reasons)  # as the SDK keeps a sequence: immutable
    if result.cost_usd is not None:
        attributes[genai.COST] = result.cost_usd
    if capture_content:
        attributes[genai.OUTPUT_MESSAGES] = _json(_output(body))
    return attributes, False


def _error_type(result: Result, body: dict[str, Any]) -> str:
    if result.error is not None:
        return str(result.error.get("code") or "error")
    error = body.get("error")
    if isinstance(error, dict):
        named = error.get("type") or error.get("code")
        if named:
            return str(named)
    return str(result.status_code)


def _finish_reasons(body: dict[str, Any]) -> list[str]:
    choices = body.get("choices")
    if isinstance(choices, list):
        return [str(c["finish_reason"]) for c in choices if isinstance(c, dict) and c.get("finish_reason")]
    if isinstance(body.get("stop_reason"), str):  # Anthropic's Messages
        return [body["stop_reason"]]
    return []


def _input(body: dict[str, Any]) -> Any:
    return next((body[k] for k in ("messages", "input", "prompt") if k in body), None)


def _output(body: dict[str, Any]) -> Any:
    choices = body.get("choices")
    if isinstance(choices, list):
        return [c.get("message", c.get("text")) for c in choices if isinstance(c, dict)]
    return body.get("content", body.get("output"))


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


__all__ = ["RequestTrace", "capture", "traced"]
