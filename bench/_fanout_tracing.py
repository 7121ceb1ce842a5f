"""`bench/upstream_fanout.py --tracing`: what traces cost a batch's throughput.

The same `batchyard run` (one process, `--workers 0`) of N chat lines against the loopback upstream, four ways,
in rounds (each round starting with the next mode), `--repeat` rounds:

- traces off (no `OTEL_*` variable: the product's default), twice a round (`off` and `off again`);
- traces on, every request sampled (`batch_settings.tracing.request_sample_ratio: 1.0`), exported over OTLP/HTTP
  to a receiver on loopback (`tests.fakes.otlp_receiver`, in this process, counting what it decodes);
- traces on at a 1% request sample (`request_sample_ratio: 0.01`).

Why paired rounds and a second off run: on these shared machines the same run's speed drifts by 10-20% over
minutes (memory bandwidth taken by the host's other tenants: a pure-CPU loop stays steady, a dict walk over
200 MB does not), far more than the few per cent measured. So a mode's ratio is taken within each round, against
the mean of that round's two off runs, and the median over rounds is the figure; `off again` against `off` in
the same round is the noise floor, printed beside it (a perfect bench would show 1.00).

Aims (issue 37): >= 0.9x the off throughput with every request sampled, >= 0.97x at 1%. Also printed: the
spans the receiver got per run and per second of the run. The batch span processor's queue is raised
(`OTEL_BSP_MAX_QUEUE_SIZE`) so that no span is dropped at full speed: the figure is the cost of all of them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.fakes.otlp_receiver import OTLPReceiver
from tests.fakes.upstream.server import Upstream

Measure = Callable[[list[str]], tuple[float, int, float]]
MODES: dict[str, float | None] = {"off": None, "all": 1.0, "off again": None, "1%": 0.01}
AIMS = {"all": 0.9, "1%": 0.97}


def _input(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            body = {"model": "bench-model", "messages": [{"role": "user", "content": f"request number {i}"}]}
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def _config(path: Path, upstream: Upstream, concurrency: int, ratio: float | None) -> None:
    tracing = f", tracing: {{request_sample_ratio: {ratio}}}" if ratio is not None else ""
    path.write_text(
        "model_list:\n"
        "  - model_name: bench-model\n"
        f"    litellm_params: {{model: openai/bench-model, api_key: sk-bench, api_base: '{upstream.v1_url}'}}\n"
        f"batch_settings: {{max_concurrency: {concurrency}{tracing}}}\n"
    )


def _rounds(upstream: Upstream, n: int, repeat: int, concurrency: int,
            measure: Measure) -> list[dict[str, tuple[float, int]]]:
    """Each round: every mode once, as (wall seconds, spans received)."""
    rounds: list[dict[str, tuple[float, int]]] = []
    with tempfile.TemporaryDirectory() as tmp_name, OTLPReceiver(keep=False) as receiver:
        tmp = Path(tmp_name)
        data = tmp / "in.jsonl"
        _input(data, n)
        configs: dict[str, Path] = {}
        for mode, ratio in MODES.items():
            configs[mode] = tmp / f"{len(configs)}.yaml"
            _config(configs[mode], upstream, concurrency, ratio)
        saved = dict(os.environ)
        try:
            for i in range(repeat):
                # each round starts with another mode: no mode always follows the same one (a run after the
                # every-span run began while its exporter drained)
                order = list(MODES)[i % len(MODES):] + list(MODES)[:i % len(MODES)]
                runs: dict[str, tuple[float, int]] = {}
                for mode in order:
                    ratio = MODES[mode]
                    os.environ.clear()
                    os.environ.update({k: v for k, v in saved.items() if not k.startswith("OTEL_")})
                    if ratio is not None:
                        os.environ.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                                           "OTEL_BSP_MAX_QUEUE_SIZE": str(max(2048, 2 * n))})
                    before = receiver.count
                    wall, _, _ = measure([sys.executable, "-m", "gateway.cli", "run", "-i", str(data), "-o",
                                          str(tmp / "out.jsonl"), "--config", str(configs[mode]), "-q",
                                          "--workers", "0"])
                    runs[mode] = (wall, receiver.count - before)
                rounds.append(runs)
                base = _base(runs)
                print(f"  round {i + 1}: " + " | ".join(
                    f"{mode} {n / runs[mode][0]:5.0f} req/s"
                    + (f" ({base / runs[mode][0]:4.2f}x, {runs[mode][1]} spans)" if MODES[mode] else "")
                    for mode in MODES), flush=True)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return rounds


def _base(runs: dict[str, tuple[float, int]]) -> float:
    """The round's off wall time: the mean of its two off runs."""
    return (runs["off"][0] + runs["off again"][0]) / 2


def tracing_mode(upstream: Upstream, n: int, repeat: int, concurrency: int, measure: Measure) -> None:
    rounds = _rounds(upstream, n, repeat, concurrency, measure)
    print(f"\ntraces: {n} chat requests through `batchyard run --workers 0`, concurrency {concurrency}, "
          f"{repeat} rounds ({os.cpu_count()} cores); a ratio is the median over rounds of the mode's throughput "
          "against the same round's off runs")
    for mode in MODES:
        walls = [runs[mode][0] for runs in rounds]
        spans = statistics.median(runs[mode][1] for runs in rounds)
        line = f"    {mode:>9}  {n / statistics.median(walls):6.0f} req/s (median)"
        if mode in AIMS:
            ratios = [_base(runs) / runs[mode][0] for runs in rounds]
            line += (f"  {spans:6.0f} spans exported  {spans / statistics.median(walls):5.0f} spans/s   "
                     f"{statistics.median(ratios):4.2f}x off (rounds {min(ratios):.2f}-{max(ratios):.2f}; "
                     f"aim >= {AIMS[mode]})")
        print(line)
    floor = [runs["off"][0] / runs["off again"][0] for runs in rounds]
    print(f"    noise floor: `off again` against `off` in the same round {statistics.median(floor):4.2f}x "
          f"(rounds {min(floor):.2f}-{max(floor):.2f}; a quiet machine gives 1.00)")


__all__ = ["tracing_mode"]
