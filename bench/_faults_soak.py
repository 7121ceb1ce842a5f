"""bench/faults.py --soak DURATION: a steady rate of small batches in both modes, and the processes' RSS.

Both modes run side by side for the whole duration: embedded `serve` (one worker process) and shared (an API
replica and one `batchyard worker` over Redis with AOF). Each gets a `--soak-lines`-line batch on the upstream
route every `--soak-every` seconds (never more than a few unfinished at once: a slow machine skips a tick and
says so). The RSS of each mode's API process and of each worker is sampled; one row is printed a minute.
At the end: for each process, the mean RSS over the last third of the run against minutes 5-10 of 30 (the
windows scale with the duration: [D/6, D/3] and [2D/3, D]); within 5% is flat. Every batch must complete
with each of its custom_ids once.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench._faults_setup import (
    FINISHED,
    Deployment,
    Prober,
    batch,
    bench_config,
    chat_lines,
    deploy,
    outcome,
    percentiles,
    submit,
)
from tests.fakes.upstream.server import start_upstream

MIB = 1024 * 1024
MAX_UNFINISHED = 4  # a tick waits while this many of a mode's batches are unfinished


def parse_duration(text: str) -> float:
    """'30m', '90s', '1h', '1h30m' or a number of seconds -> seconds."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (e.g. 30m, 90s, 1h)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


@dataclass
class Load:
    """One mode's steady stream of batches, run in a thread."""

    d: Deployment
    lines: int
    every: float
    submitted: list[tuple[str, list[dict]]] = field(default_factory=list)
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _unfinished(self) -> int:
        return sum(1 for batch_id, _ in self.submitted[-MAX_UNFINISHED * 2:]
                   if batch(self.d.url, batch_id)["status"] not in FINISHED)

    def _run(self) -> None:
        tick = time.monotonic()
        n = 0
        while not self._stop.is_set():
            try:
                if self._unfinished() >= MAX_UNFINISHED:
                    self.skipped += 1
                else:
                    lines = chat_lines(f"{self.d.mode[0]}{n}", self.lines)
                    self.submitted.append((submit(self.d.url, lines), lines))
                    n += 1
            except Exception as exc:  # the bench reports it at the end; one bad tick does not end the soak
                self.errors.append(f"{type(exc).__name__}: {exc}")
            tick += self.every
            self._stop.wait(max(0.0, tick - time.monotonic()))

    @contextlib.contextmanager
    def running(self) -> Iterator[Load]:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()

    def check(self, timeout: float = 300) -> tuple[int, int, int]:
        """(batches completed, lines lost or repeated, lines failed) once every batch has finished."""
        deadline = time.monotonic() + timeout
        completed = bad = failed = 0
        for batch_id, lines in self.submitted:
            while batch(self.d.url, batch_id)["status"] not in FINISHED and time.monotonic() < deadline:
                time.sleep(0.5)
            result = outcome(self.d.url, batch_id)
            completed += result.status == "completed"
            bad += result.lost(lines) + result.repeated()
            failed += sum(result.codes.values())
        return completed, bad, failed


def _rss(pid: int) -> float:
    with contextlib.suppress(psutil.Error):
        return float(psutil.Process(pid).memory_info().rss) / MIB
    return float("nan")


def _window(samples: list[tuple[float, float]], start: float, end: float) -> float:
    values = [rss for t, rss in samples if start <= t <= end and rss == rss]
    return sum(values) / len(values) if values else float("nan")


def soak(seconds: float, lines: int, every: float) -> None:
    sample_every = min(60.0, max(1.0, seconds / 60))
    print(f"soak: {seconds / 60:.1f} min, a {lines}-line batch every {every:g} s per mode, "
          f"RSS sampled every {sample_every:.0f} s", flush=True)
    samples: dict[str, list[tuple[float, float]]] = {}
    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        config = bench_config(upstream)
        modes = [stack.enter_context(deploy(mode, config, Path(tmp) / mode / "data"))
                 for mode in ("embedded", "shared")]
        loads = [Load(d, lines, every) for d in modes]
        probers = [stack.enter_context(Prober(d.url, every=0.5)) for d in modes]
        for load in loads:
            stack.enter_context(load.running())
        started = time.monotonic()
        next_print = 60.0
        while (elapsed := time.monotonic() - started) < seconds:
            for d in modes:
                for role, pid in d.processes().items():
                    samples.setdefault(f"{d.mode} {role}", []).append((elapsed, _rss(pid)))
            if elapsed >= next_print or elapsed + sample_every >= seconds:
                next_print += 60.0
                row = "  ".join(f"{name} {values[-1][1]:6.1f}" for name, values in samples.items())
                print(f"  {elapsed / 60:5.1f} min  RSS MiB: {row}", flush=True)
            time.sleep(max(0.0, min(sample_every, seconds - elapsed)))
        for load in loads:
            load._stop.set()
        print("\nbatches:", flush=True)
        for load, prober in zip(loads, probers, strict=True):
            completed, bad, failed = load.check()
            p50, p99 = percentiles(prober.take())
            print(f"  {load.d.mode:<8}  {completed}/{len(load.submitted)} completed, {bad} lines lost or repeated, "
                  f"{failed} failed, {load.skipped} ticks skipped (backlog), {len(load.errors)} submit errors; "
                  f"another team's GET /v1/batches p50 {p50:.1f} ms p99 {p99:.1f} ms")
            for error in load.errors[:3]:
                print(f"            {error}")
        print(f"  upstream calls {upstream.stats()['requests']}")
    base, last = (seconds / 6, seconds / 3), (2 * seconds / 3, seconds)
    print(f"\nRSS flat? mean of [{base[0] / 60:.1f}, {base[1] / 60:.1f}] min against "
          f"[{last[0] / 60:.1f}, {last[1] / 60:.1f}] min (aim: within 5%)")
    for name, values in samples.items():
        before, after = _window(values, *base), _window(values, *last)
        change = (after - before) / before if before else float("nan")
        verdict = "ok" if abs(change) <= 0.05 else "GROWS" if change > 0 else "shrinks"
        print(f"  {name:<18} {before:7.1f} -> {after:7.1f} MiB  {100 * change:+5.1f}%  {verdict}")
