"""bench/faults.py's faults: each injected into a running batch on a fresh gateway, measured, printed as a row.

A fault is a `Fault`: its name, its mode, how to deploy for it, and `inject` / `clear` (None for the faults
that are in the batch itself: the hung upstream, the missing local model). `measure` runs one: a batch whose
lines take 100 ms each on the loopback upstream, 20 at a time, so that it runs for a while; the fault is injected
once a fifth of it is done and cleared `hold` seconds later.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._faults_setup import (
    MODEL,
    Deployment,
    Prober,
    batch,
    bench_config,
    chat_lines,
    deploy,
    outcome,
    percentiles,
    submit,
    wait_finished,
)
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.services import MotoS3

SHARD = 50
CONCURRENCY = 20
CLAIM_IDLE = 2.0
RECOVER_WITHIN = 120.0  # seconds after the fault clears: past this, the row says STUCK
FINISH_WITHIN = 300.0


class Skip(Exception):
    """This fault cannot run here (the reason is printed in its row)."""


@dataclass
class Row:
    name: str
    mode: str
    downtime: float = math.nan  # seconds the fault lasted
    recover: float = math.nan  # seconds from its clearing until a shard's worth of lines more had finished
    lost: int = 0  # custom_ids missing from, or repeated in, the output and error files
    failed: int = 0  # lines failed because of the fault
    extra: int = 0  # upstream calls beyond one per upstream line
    p50: float = math.nan  # another team's GET /v1/batches during the fault, ms
    p99: float = math.nan
    note: str = ""


@dataclass
class Fault:
    name: str
    mode: str
    # inject/clear get the deployment and what setup gave; None: the fault is in the batch itself
    inject: Callable[[Deployment, Any], None] | None = None
    clear: Callable[[Deployment, Any], None] | None = None
    hold: float = 5.0  # seconds between inject and clear
    directives: dict[int, str] = field(default_factory=dict)  # line index -> directive, for in-batch faults
    by_design: frozenset[str] = frozenset()  # error codes that are the fault's own answer, not a loss
    extra_models: list[dict[str, Any]] = field(default_factory=list)
    other_model: str | None = None  # every second line goes to this route (the missing local model)
    timeout: float = 30.0  # the route's timeout


# -- the environment each fault needs --------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "64m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        raise Skip("a full disk needs a tmpfs mount: run as root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def _fault_proxy() -> Any:
    try:
        from tests.fakes.fault_proxy import FaultProxy
    except ImportError:
        raise Skip("tests/fakes/fault_proxy.py is not in this checkout (it comes with the machine-faults "
                   "work)") from None
    return FaultProxy


@contextlib.contextmanager
def environment(fault: Fault, upstream: Upstream, tmp: Path) -> Iterator[tuple[Deployment, Any]]:
    """The gateway the fault runs on, and what inject/clear need (a ballast path, a proxy)."""
    config = bench_config(upstream, timeout=fault.timeout, extra_models=fault.extra_models, shard_size=SHARD,
                          max_concurrency=CONCURRENCY)
    if fault.name == "hung upstream":
        config["router_settings"]["num_retries"] = 1
    with contextlib.ExitStack() as stack:
        data = tmp / "data"
        extra: Any = None
        kwargs: dict[str, Any] = {"claim_idle": CLAIM_IDLE}
        if fault.name == "disk full":
            data = stack.enter_context(_tmpfs(tmp / "disk")) / "data"
            extra = data.parent / "ballast"
        elif fault.name.startswith("S3"):
            proxy_type = _fault_proxy()
            moto = MotoS3().start()
            stack.callback(moto.close)
            extra = stack.enter_context(proxy_type("127.0.0.1", moto.port))
            kwargs.update(blobs=moto.location("bench"), env={**moto.env(), "BATCHYARD_S3_ENDPOINT_URL": extra.url})
        elif fault.name == "Redis unreachable":
            kwargs["redis_proxy"] = _fault_proxy()
        d = stack.enter_context(deploy(fault.mode, config, data, **kwargs))
        yield d, (extra if extra is not None else d.redis_proxy)


def _fill(ballast: Path) -> None:
    block = b"\0" * (1 << 20)
    with contextlib.suppress(OSError), ballast.open("wb", buffering=0) as out:
        while True:
            out.write(block)


def _kill_redis(d: Deployment, _: Any) -> None:
    assert d.redis is not None
    d.redis.stop(signal.SIGKILL)


def _start_redis(d: Deployment, _: Any) -> None:
    assert d.redis is not None
    d.redis.start()


def _set_mode(mode: str) -> Callable[[Deployment, Any], None]:
    def switch(_: Deployment, proxy: Any) -> None:
        proxy.mode = mode
    return switch


FAULTS = [
    Fault("disk full", "embedded", inject=lambda d, ballast: _fill(ballast),
          clear=lambda d, ballast: ballast.unlink()),
    Fault("S3 503", "shared", inject=_set_mode("slowdown"), clear=_set_mode("pass")),
    Fault("S3 unreachable", "shared", inject=_set_mode("refuse"), clear=_set_mode("pass")),
    Fault("Redis killed", "shared", inject=_kill_redis, clear=_start_redis),
    Fault("Redis unreachable", "shared", inject=_set_mode("refuse"), clear=_set_mode("pass"),
          hold=max(5.0, 3 * CLAIM_IDLE)),
    Fault("hung upstream", "embedded", directives={i: "#hang" for i in range(0, 10_000_000, 50)},
          by_design=frozenset({"upstream_timeout"}), timeout=2.0),
    Fault("missing local model", "embedded", other_model="tiny", by_design=frozenset({"model_unavailable"}),
          extra_models=[{"model_name": "tiny", "litellm_params": {"model": "vllm/" + tempfile.gettempdir()
                                                                   + "/batchyard-no-such-model"}}]),
]


# -- one run ---------------------------------------------------------------------------------------


def _done(url: str, batch_id: str) -> tuple[int, str]:
    b = batch(url, batch_id)
    counts = b.get("request_counts") or {}
    return int(counts.get("completed", 0)) + int(counts.get("failed", 0)), str(b["status"])


def _until_done(url: str, batch_id: str, at_least: int, timeout: float) -> float:
    """Seconds until `at_least` lines are done (or the batch finished)."""
    started = time.monotonic()
    while True:
        done, status = _done(url, batch_id)
        if done >= at_least or status in ("completed", "failed", "expired", "cancelled"):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"batch {batch_id}: {done} lines done after {timeout:.0f} s, {status}")
        time.sleep(0.1)


def measure(fault: Fault, upstream: Upstream, lines: int) -> Row:
    row = Row(fault.name, fault.mode)
    with tempfile.TemporaryDirectory() as tmp, environment(fault, upstream, Path(tmp)) as (d, extra):
        sent = chat_lines("f", lines, "#sleep:100", fault.directives)
        if fault.other_model:
            for line in sent[1::2]:
                line["body"]["model"] = fault.other_model
        upstream.reset()
        during: list[float] = []
        with Prober(d.url) as prober:
            batch_id = submit(d.url, sent)
            try:
                if fault.inject is not None and fault.clear is not None:
                    _until_done(d.url, batch_id, lines // 5, 300)
                    prober.take()
                    started = time.monotonic()
                    fault.inject(d, extra)
                    time.sleep(max(0.0, fault.hold - (time.monotonic() - started)))  # the fault's length
                    fault.clear(d, extra)
                    row.downtime = time.monotonic() - started
                    during = prober.take()
                    done_then, _ = _done(d.url, batch_id)
                    row.recover = _until_done(d.url, batch_id, min(lines, done_then + SHARD), RECOVER_WITHIN)
                wait_finished(d.url, batch_id, FINISH_WITHIN)
            except RuntimeError as stuck:  # it did not resume: the row says so, and the next fault runs
                done, status = _done(d.url, batch_id)
                row.lost, row.note = lines - done, f"STUCK: {status}, {done}/{lines} done ({stuck})"
                row.p50, row.p99 = percentiles(during or prober.take())
                return row
            if fault.inject is None:
                during = prober.take()  # the fault lasted the whole batch
        result = outcome(d.url, batch_id)
        row.lost = result.lost(sent) + result.repeated()
        row.failed = sum(n for code, n in result.codes.items() if code not in fault.by_design)
        upstream_lines = sum(1 for line in sent if line["body"]["model"] == MODEL)
        row.extra = int(upstream.stats()["requests"]) - upstream_lines
        row.p50, row.p99 = percentiles(during)
        by_design = sum(n for code, n in result.codes.items() if code in fault.by_design)
        row.note = f"{result.status}" + (f", {by_design} {'/'.join(sorted(fault.by_design))} by design"
                                         if by_design else "")
        other = {status: n for status, n in prober.statuses.items() if status != 200}
        if other:
            row.note += ", GETs answered " + ", ".join(f"{n} x {status}" for status, n in sorted(other.items()))
        if prober.errors:
            row.note += f", {prober.errors} GETs not answered at all"
    return row


def _median(rows: list[Row]) -> Row:
    def med(name: str) -> Any:
        return statistics.median(getattr(r, name) for r in rows)

    first = rows[0]
    return Row(first.name, first.mode, med("downtime"), med("recover"), med("lost"), med("failed"), med("extra"),
               med("p50"), med("p99"), first.note + (f" (median of {len(rows)})" if len(rows) > 1 else ""))


def run_faults(only: str | None, repeat: int, lines: int) -> None:
    chosen = [f for f in FAULTS if only is None or f.name.lower().replace(" ", "-") == only.lower().replace(" ", "-")]
    if not chosen:
        names = ", ".join(f.name.lower().replace(" ", "-") for f in FAULTS)
        raise SystemExit(f"no fault named {only!r}; one of: {names}")
    print(f"{lines}-line batch, 100 ms a line, {CONCURRENCY} at a time, {SHARD}-line shards; "
          f"claim-idle {CLAIM_IDLE:g} s (shared); aims: lost 0, failed 0, another team's GET p99 <= 50 ms")
    print(f"{'fault':<20} {'mode':<9} {'down s':>6} {'recover s':>9} {'lost':>5} {'failed':>6} {'extra':>6} "
          f"{'GET p50':>8} {'GET p99':>8}  note", flush=True)
    with start_upstream() as upstream:
        for fault in chosen:
            rows: list[Row] = []
            try:
                for _ in range(repeat):
                    rows.append(measure(fault, upstream, lines))
            except Skip as why:
                print(f"{fault.name:<20} {fault.mode:<9} skipped: {why}", flush=True)
                continue
            r = _median(rows)
            print(f"{r.name:<20} {r.mode:<9} {_s(r.downtime, 6)} {_s(r.recover, 9)} {r.lost:5.0f} {r.failed:6.0f} "
                  f"{r.extra:6.0f} {_s(r.p50, 6)}ms {_s(r.p99, 6)}ms  {r.note}", flush=True)


def _s(value: float, width: int) -> str:
    """A figure, or '-' where it does not apply (the faults in the batch itself have no downtime)."""
    return f"{value:{width}.1f}" if not math.isnan(value) else f"{'-':>{width}}"
