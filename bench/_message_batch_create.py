"""bench/server_load.py --message-batch-create: one large Message Batch create, its memory and its neighbours.

A fresh `serve` (one worker: the API process is what is measured) gets, from team alpha, a `--mb-requests`
request, `--mb-size-mb` MB `POST /v1/messages/batches` of normal requests (a user message of filler text),
then one of the same size and request count whose params are pathological (a list of `{}`, the issue's
shape, each request within the bound on values), then escape-heavy ones (issue 45: one request of one long
string of escapes, `\\ud83d\\ude00\\n\\"…`, up to 30 MB; and `--mb-requests` requests of escaped text, the
same size in all). For each: the API process's peak RSS over its idle RSS
(aim: <= 2x the body + 50 MB), the largest growth of one validation process (the body is read in one of
them, off the API's loop: the same bound holds there), the create's wall (aim for the normal one: <= 1.2x the
code before issue 34: run the same command with PYTHONPATH pointing at that checkout), and team beta's
`GET /v1/models` p50/p99 meanwhile (aim: p99 <= 50 ms), from a process of its own (a thread of the bench
shared its GIL with the sender and measured the bench's own pauses: p99 ~120 ms where the server's was ~17).
Each batch is cancelled once created (its requests are not what is measured).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from tests.fakes.upstream.server import start_upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway

MODEL = "gpt-mini"
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
MIB = 1024 * 1024
_SLICE = MIB  # the body is sent this much at a time (see `_slices`)


_ESCAPES = b"\\ud83d\\ude00\\n\\\"\\u0041\\t"  # a surrogate pair, a line break, a quote, a letter, a tab
_ONE_REQUEST_MAX = 30 * MIB  # one request stays under the Messages API's 32 MB


def _escaped(length: int) -> bytes:
    """A JSON string's text (no quotes) of `length` bytes or a few less, escapes all through."""
    return _ESCAPES * max(length // len(_ESCAPES), 1)


def _bodies(kind: str, requests: int, size: int) -> list[tuple[str, bytes]]:
    """The bodies one kind measures, named: `escapes` is two (one request of one long escaped string, and
    `requests` requests each with escaped text)."""
    if kind != "escapes":
        return [(kind, _body(requests, size, kind == "pathological"))]
    one = b'{"requests":[{"custom_id":"e","params":{"model":"%s","max_tokens":8,"messages":[{"role":"user",' \
        b'"content":"%s"}]}}]}' % (MODEL.encode(), _escaped(min(size, _ONE_REQUEST_MAX) - 120))
    each = max(size // requests - 120, len(_ESCAPES))
    parts = (b'{"custom_id":"r%d","params":{"model":"%s","max_tokens":8,"messages":[{"role":"user",'
             b'"content":"%s"}]}}' % (i, MODEL.encode(), _escaped(each)) for i in range(requests))
    return [("escapes/one", one), (f"escapes/{requests}", b'{"requests":[' + b",".join(parts) + b"]}")]


def _body(requests: int, size: int, pathological: bool) -> bytes:
    """`requests` requests of about `size` bytes in all: filler text, or a list of `{}` (3 bytes each)."""
    each = max(size // requests - 120, 8)
    if pathological:
        pad = b"[" + b",".join([b"{}"] * max(each // 3, 1)) + b"]"
        parts = (b'{"custom_id":"r%d","params":{"model":"%s","max_tokens":8,"messages":[],"pad":%s}}'
                 % (i, MODEL.encode(), pad) for i in range(requests))
    else:
        text = json.dumps("lorem ipsum " * (each // 12 + 1))[: each].encode().rstrip(b"\\") + b'"'
        parts = (b'{"custom_id":"r%d","params":{"model":"%s","max_tokens":8,"messages":[{"role":"user",'
                 b'"content":%s}]}}' % (i, MODEL.encode(), text) for i in range(requests))
    return b'{"requests":[' + b",".join(parts) + b"]}"


def _validation_processes(gw: Gateway) -> list[psutil.Process]:
    """The API process's pool of validation processes (spawned interpreters), where the body is read."""
    return [p for p in psutil.Process(gw.process.pid).children() if any("spawn_main" in a for a in p.cmdline())]


def _measure(gw: Gateway, body: bytes) -> tuple[float, float, float, list[float], int, float]:
    """(idle RSS, peak RSS, wall, beta's GET latencies, status, the largest growth of a validation process) of
    one create."""
    api = psutil.Process(gw.process.pid)
    idle = peak = api.memory_info().rss
    children = {p: p.memory_info().rss for p in _validation_processes(gw)}
    child_peak = dict(children)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, api.memory_info().rss)
            for child in children:
                with contextlib.suppress(psutil.Error):
                    child_peak[child] = max(child_peak[child], child.memory_info().rss)
            time.sleep(0.005)

    # Beta's GETs come from a process of their own: in a thread of this one they shared its GIL with the
    # sender and the RSS sampler, and measured this process's pauses as the server's.
    with _probe_process(gw) as latencies:
        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.perf_counter()
        reply = httpx.post(gw.url + "/v1/messages/batches", content=_slices(body), timeout=900,
                           headers={"x-api-key": "sk-alpha", "content-type": "application/json",
                                    "content-length": str(len(body))})
        wall = time.perf_counter() - started
        stop.set()
        sampler.join()
    if reply.status_code == 200:
        httpx.post(f"{gw.url}/v1/messages/batches/{reply.json()['id']}/cancel", headers={"x-api-key": "sk-alpha"},
                   timeout=60)
    else:
        print(f"    the create answered {reply.status_code}: {reply.text[:300]}")
    grown = max((child_peak[c] - children[c] for c in children), default=float("nan"))
    return idle, peak, wall, sorted(latencies), reply.status_code, grown


def _slices(body: bytes) -> Iterator[memoryview]:
    """The body, 1 MiB at a time. Given whole, httpx's sender sends what the socket takes and then copies the
    rest (`buffer = buffer[n:]`): hundreds of MB copied per send, the GIL held, GBs in all for one create."""
    view = memoryview(body)
    for start in range(0, len(view), _SLICE):
        yield view[start:start + _SLICE]


_PROBE = """
import sys, threading, time, httpx
url, stop = sys.argv[1], threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
latencies = []
with httpx.Client(headers={"Authorization": "Bearer sk-beta"}, timeout=60) as client:
    while not stop.is_set():
        started = time.perf_counter()
        client.get(url + "/v1/models")
        latencies.append(time.perf_counter() - started)
        time.sleep(0.01)
print(" ".join(repr(x) for x in latencies))
"""


@contextlib.contextmanager
def _probe_process(gw: Gateway) -> Iterator[list[float]]:
    """Team beta's `GET /v1/models` every 10 ms from a process of its own, until the block ends: the
    latencies, filled in as it ends (the probe stops when its stdin closes)."""
    latencies: list[float] = []
    with subprocess.Popen([sys.executable, "-c", _PROBE, gw.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as probe:
        assert probe.stdin is not None and probe.stdout is not None
        time.sleep(0.3)  # its interpreter and httpx imported: the probes cover the whole create
        try:
            yield latencies
        finally:
            probe.stdin.close()
            latencies.extend(float(x) for x in probe.stdout.read().split())


def message_batch_create(requests: int, size_mb: int, repeat: int = 1,
                         kinds: tuple[str, ...] = ("normal", "pathological", "escapes")) -> None:
    """Each kind `repeat` times on one server; with several, the medians too (wall, peak over idle, p99).
    `kinds=("normal",)` alone for the code before issue 34, which would hold the pathological body as Python
    objects (several GB)."""
    size = size_mb * MIB
    print(f"\none Message Batch create of {requests:,} requests, {size_mb} MB (API process RSS; team beta's "
          "GET /v1/models meanwhile)", flush=True)
    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        config = gateway_config(upstream, models=(MODEL,), teams=TEAMS, max_lines=max(requests, 50_000),
                                max_file_bytes=size * 2 + 64 * MIB)
        with start_gateway(config, Path(tmp) / "data", workers=1) as gw:
            for kind in kinds:
                for name, body in _bodies(kind, requests, size):
                    walls, peaks, p99s = [], [], []
                    for _ in range(repeat):
                        idle, peak, wall, lat, status, child = _measure(gw, body)
                        walls.append(wall)
                        peaks.append(peak - idle)
                        p99s.append(lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"))
                        _report(name, body, idle, peak, wall, lat, status, child)
                    if repeat > 1:
                        wall, over, p99 = statistics.median(walls), statistics.median(peaks), statistics.median(p99s)
                        print(f"  {name:12s} MEDIAN of {repeat}: wall {wall:6.2f} s  peak RSS over idle "
                              f"{over / MIB:7.1f} MiB  beta p99 {1000 * p99:6.1f} ms", flush=True)
                    del body
    print(f"  load average {os.getloadavg()[0]:.1f} (1 min)")


def _report(kind: str, body: bytes, idle: int, peak: int, wall: float, lat: list[float], status: int,
            child: float) -> None:
    bound = 2 * len(body) + 50 * MIB
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
    p50 = statistics.median(lat) if lat else float("nan")
    print(f"  {kind:12s} body {len(body) / MIB:7.1f} MiB  status {status}  wall {wall:6.2f} s  "
          f"peak RSS over idle {(peak - idle) / MIB:7.1f} MiB (bound {bound / MIB:.0f}: "
          f"{'ok' if peak - idle <= bound else 'OVER'})  idle {idle / MIB:.0f} MiB", flush=True)
    print(f"  {'':12s} a validation process's peak RSS over idle {child / MIB:7.1f} MiB (the body is read there; "
          f"bound {bound / MIB:.0f}: {'ok' if child <= bound else 'OVER'})", flush=True)
    print(f"  {'':12s} beta GET /v1/models p50 {1000 * p50:6.1f} ms  p99 {1000 * p99:6.1f} ms "
          f"({len(lat)} probes; aim p99 <= 50 ms)", flush=True)


__all__ = ["message_batch_create"]
