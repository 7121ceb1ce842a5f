"""The OTLP side of traces, shared by every process that exports: the exporter the standard variables ask
for (`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: `http/protobuf`, ours and the default, or `grpc` where its
package is installed) and the resource its spans carry."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.resources import Resource

from gateway.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

HTTP_PROTOBUF = "http/protobuf"


def protocol(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    env = os.environ if env is None else env
    return (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or HTTP_PROTOBUF).strip()


def otlp_exporter() -> SpanExporter:
    """The OTLP exporter the variables ask for."""
    chosen = protocol()
    if chosen == HTTP_PROTOBUF:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    if chosen == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise ConfigError("environment", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTLP over gRPC needs the package "
                              "opentelemetry-exporter-otlp-proto-grpc, which batchyard does not install; use "
                              f"{HTTP_PROTOBUF!r} (the default) or install it") from None
        return GrpcExporter()
    raise ConfigError("environment", "OTEL_EXPORTER_OTLP_PROTOCOL",
                      f"{chosen!r} is not an OTLP protocol batchyard sends: {HTTP_PROTOBUF!r} or 'grpc'")


class HashedResource(Resource):
    """The SDK's resource with its hash worked out once. The OTLP encoder files every span under its resource
    (a dict keyed by it), and the SDK's `Resource.__hash__` writes all the attributes out as JSON each time:
    about 4 us of the 45 a span costs to encode, for a value that never changes."""

    def __init__(self, attributes: Any, schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other is self or super().__eq__(other)


__all__ = ["HTTP_PROTOBUF", "HashedResource", "otlp_exporter", "protocol"]
