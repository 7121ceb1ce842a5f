"""An OTLP/HTTP trace receiver on loopback, as a collector would take our spans: a real HTTP server on
`POST /v1/traces` that decodes each export (protobuf, gzip or not) with opentelemetry-proto's own classes and
keeps every span, flattened for the tests (`Span`). It answers as a collector does (an empty
`ExportTraceServiceResponse`); `requests` counts every export it got, whatever its content."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.support.waiting import free_port

if TYPE_CHECKING:
    import pytest

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass
class Span:
    trace_id: str  # 32 hex digits
    span_id: str  # 16
    parent_span_id: str  # "" for a root
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL, ...
    attributes: dict[str, Any]
    resource: dict[str, Any]  # service.name, service.instance.id, batchyard.role, ...
    status: int  # 0 unset, 1 ok, 2 error
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # the span ids linked


class OTLPReceiver:
    """`keep=False`: only count the spans (`count`), for a benchmark's receiver."""

    def __init__(self, *, keep: bool = True) -> None:
        self.port = free_port()
        self.spans: list[Span] = []
        self.requests = 0
        self.count = 0  # spans received
        self.keep = keep
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """What `OTEL_EXPORTER_OTLP_ENDPOINT` names (the exporter adds `/v1/traces`)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OTLPReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404 if self.path != "/v1/traces" else 415)
                    self.end_headers()
                    return
                receiver.take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True).start()
        return self

    def take(self, request: ExportTraceServiceRequest) -> None:
        if not self.keep:
            n = sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)
            with self._lock:
                self.requests += 1
                self.count += n
            return
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(Span(
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(),
                        name=s.name, kind=KINDS.get(s.kind, str(s.kind)), attributes=_attributes(s.attributes),
                        resource=resource, status=s.status.code,
                        events=[(e.name, _attributes(e.attributes)) for e in s.events],
                        links=[link.span_id.hex() for link in s.links],
                    ))
        with self._lock:
            self.requests += 1
            self.count += len(found)
            self.spans += found

    def named(self, name: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def receiving(monkeypatch: pytest.MonkeyPatch) -> Iterator[OTLPReceiver]:
    """A receiver, and the standard variable that switches traces on pointing at it, for this process and the
    ones it starts; the batch processors send every 100 ms (the spans come while a test waits)."""
    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        yield receiver


__all__ = ["KINDS", "OTLPReceiver", "Span", "receiving"]
