"""Request spans exported from a helper process, so that encoding them does not take the batch's own time.

A batch sampled whole makes a span per request, tens of thousands of them. The SDK's OTLP exporter encodes
each one in Python (about 35 us a span, its protobuf built field by field) on the batch span processor's
thread, and that thread shares the interpreter lock with the event loop that sends the requests: at full
speed the encoding alone took about 4% of `batchyard run`'s throughput. So the request spans, finished
records when they are made (`gateway.tracing.request_spans`), are handed as plain tuples to a child process
(`main`, in `python -c`), which rebuilds them as the SDK's `ReadableSpan` and exports them with
the SDK's own `BatchSpanProcessor` and OTLP exporter, configured by the same `OTEL_*` variables (inherited).
The batch, stage, shard and API spans (a few per batch) stay on the in-process processor.

- The child starts with the first request span: a process that sends no request (`serve`'s API) has none.
- A writer thread sends the tuples in frames (a 4-byte length, then a pickle: our own parent to our own
  child, over its stdin) when `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` are waiting or every `OTEL_BSP_SCHEDULE_DELAY`
  ms; no more than `OTEL_BSP_MAX_QUEUE_SIZE` wait (past that a span is dropped and counted, as the SDK does).
- `force_flush` waits for the child's word that it exported everything sent; `shutdown` closes its stdin,
  and the child exports what it holds and ends. It ignores SIGINT (Ctrl-C reaches the whole process group):
  its parent's end, not the keyboard, ends it.
- The child gone (killed, crashed): a warning, and the spans go to the in-process processor from then on.
- A process forked from this one (os.fork; the product's own pools spawn) inherits the object but not the
  thread: it never touches the object's pipe or locks (`_mine`); its own `configure` makes its own child.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger("batchyard.tracing")

# A request span as it crosses: (name, trace_id, span_id, parent span_id, trace flags, tracestate header or
# "", kind, error, start ns, end ns, attributes). Plain values only: cheap to make and to pickle.
Record = tuple[str, int, int, int, int, str, int, bool, int, int, dict[str, Any]]
_LENGTH = struct.Struct("!I")
_CHILD = "import sys; sys.path.append(sys.argv[1]); from gateway.tracing.offload import main; main()"
_ERROR, _UNSET = Status(StatusCode.ERROR), Status(StatusCode.UNSET)


def readable(record: Record, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The SDK's finished span for a record (in the child, or in-process once the child is gone)."""
    name, trace_id, span_id, parent_id, flags, state, kind, error, start, end, attributes = record
    trace_flags, trace_state = TraceFlags(flags), TraceState.from_header([state]) if state else None
    parent = SpanContext(trace_id, parent_id, is_remote=False, trace_flags=trace_flags, trace_state=trace_state)
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace_flags, trace_state=trace_state)
    return ReadableSpan(name, context, parent, resource, MappingProxyType(attributes), kind=SpanKind(kind),
                        status=_ERROR if error else _UNSET, start_time=start, end_time=end,
                        instrumentation_scope=scope)


def _frame(out: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LENGTH.pack(len(data)) + data)
    out.flush()


def _read(stream: IO[bytes]) -> Any:
    """The next frame's value; None at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


class OffloadedSpans(SpanProcessor):
    """The parent's side: request span records in (`add`), frames out to the exporting child.

    A span processor of the provider, put before the in-process one, so that the provider's `force_flush`
    and `shutdown` (at exit too: the SDK registers it) reach it first, while its fallback still exports.
    The spans the provider itself ends (batch, stage, shard, API) are not its business: `on_end` passes."""

    def __init__(self, resource: Resource, scope: InstrumentationScope, fallback: SpanProcessor) -> None:
        self._resource, self._scope, self._fallback = resource, scope, fallback
        # the `OTEL_BSP_*` variables read as the SDK reads them for its own processor (`fallback`, built from
        # them already: a value it refuses has stopped the process before this)
        self._batch = BatchSpanProcessor._default_max_export_batch_size()
        self._limit = max(BatchSpanProcessor._default_max_queue_size(), self._batch)
        self._delay = BatchSpanProcessor._default_schedule_delay_millis() / 1000
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the records waiting
        self._sending = threading.RLock()  # one frame at a time on the pipe, and a flush's ack after its spans
        self._waiting: list[Record] = []
        self._wake = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._writer: threading.Thread | None = None
        self._gone = False  # the child failed: records go to the fallback processor
        self._closed = False
        self.dropped = 0

    def on_end(self, span: ReadableSpan) -> None:
        return None

    @property
    def pid(self) -> int | None:
        """The exporting child's process id, while it runs (None before the first span, and once it ended)."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def _mine(self) -> bool:
        return os.getpid() == self._pid

    def add(self, record: Record) -> None:
        if self._closed or not self._mine():
            return
        if self._gone:
            self._fallback.on_end(readable(record, self._resource, self._scope))
            return
        with self._lock:
            if len(self._waiting) >= self._limit:
                self.dropped += 1
                return
            self._waiting.append(record)
            full = len(self._waiting) >= self._batch
            if self._writer is None:
                self._start()
        if self._gone:  # it would not start: this one and those after it go in-process
            self._hand_back(self._take())
            return
        if full:
            self._wake.set()

    def _start(self) -> None:
        """The child and the writer thread (under the lock, at the first record)."""
        # the child finds this package where this process did (at the end of its path: an installed copy, the
        # same one, comes first), whatever the working directory
        root = str(Path(__file__).resolve().parents[2])
        try:
            self._child = subprocess.Popen([sys.executable, "-c", _CHILD, root], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, close_fds=True)
            assert self._child.stdin is not None
            _frame(self._child.stdin, (dict(self._resource.attributes), self._resource.schema_url,
                                       self._scope.name, self._scope.version))
        except Exception as exc:  # no process to start, or it ended at once
            self._lost(exc)
        self._writer = threading.Thread(target=self._write_loop, name="batchyard-span-offload", daemon=True)
        self._writer.start()

    def _write_loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._send()

    def _send(self) -> bool:
        """Send what waits; False (and the fallback from then on) if the child is gone."""
        with self._sending:
            if self._closed:
                return False
            records = self._take()
            if not records or self._gone:
                self._hand_back(records)
                return not self._gone
            child = self._child
            try:
                assert child is not None and child.stdin is not None
                _frame(child.stdin, ("spans", records))
            except Exception as exc:  # a broken pipe (OSError), the pipe closed under us (ValueError)
                self._lost(exc)
                self._hand_back(records)
                return False
            return True

    def _take(self) -> list[Record]:
        with self._lock:
            records, self._waiting = self._waiting, []
        return records

    def _hand_back(self, records: Sequence[Record]) -> None:
        for record in records:
            self._fallback.on_end(readable(record, self._resource, self._scope))

    def _lost(self, exc: BaseException) -> None:
        if not self._gone:
            self._gone = True
            log.warning("the span export process is gone (%s); request spans are exported in-process from now "
                        "on", type(exc).__name__)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Send what waits and wait for the child to have exported everything it got."""
        if not self._mine() or self._child is None or self._closed:
            return True
        with self._sending:
            if not self._send():
                return True  # the fallback has them: the provider flushes it next
            child = self._child
            try:
                assert child.stdin is not None and child.stdout is not None
                _frame(child.stdin, ("flush", timeout_millis))
                # its answer comes once it exported (its processor's own flush honours the timeout); a child
                # that does not answer does not hold this process: a late answer only ends a later flush early
                ready, _, _ = select.select([child.stdout], [], [], timeout_millis / 1000 + 5)
                return bool(ready) and bool(_read(child.stdout))
            except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
                self._lost(exc)
                return False

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Send what waits, let the child export it and end (killed past `timeout_s`)."""
        if not self._mine() or self._closed:
            return
        with self._sending:
            self._send()
            self._closed = True
            self._wake.set()
            child = self._child
            if child is None:
                return
            try:
                assert child.stdin is not None
                child.stdin.close()
            except OSError:
                pass
        try:
            child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if self.dropped:
            log.warning("%d request spans were dropped: more than OTEL_BSP_MAX_QUEUE_SIZE (%d) waited",
                        self.dropped, self._limit)


def main() -> None:
    """The child: frames in on stdin, the SDK's batch processor and OTLP exporter out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from gateway.tracing.otlp import HashedResource, otlp_exporter

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    start = _read(stdin)
    if start is None:
        return
    attributes, schema_url, scope_name, scope_version = start
    resource, scope = HashedResource(attributes, schema_url), InstrumentationScope(scope_name, scope_version)
    processor = BatchSpanProcessor(otlp_exporter())
    try:
        while (message := _read(stdin)) is not None:
            kind, payload = message
            if kind == "spans":
                for record in payload:
                    processor.on_end(readable(record, resource, scope))
            elif kind == "flush":
                _frame(stdout, processor.force_flush(payload))
    finally:
        processor.shutdown()


__all__ = ["OffloadedSpans", "Record", "readable"]
