"""`bench/upstream_fanout.py --tracing`: what traces cost a batch's throughput.

The same `batchyard run` (one process, `--workers 0`) of N chat lines against the loopback upstream, three ways,
alternating (each repeat starting with the next mode), median of `--repeat`:

- traces off (no `OTEL_*` variable: the product's default);
- traces on, every request sampled (`batch_settings.tracing.request_sample_ratio: 1.0`), exported over OTLP/HTTP
  to a receiver on loopback (`tests.fakes.otlp_receiver`, in this process, counting what it decodes);
- traces on at a 1% request sample (`request_sample_ratio: 0.01`).

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
MODES = {"off": None, "all": 1.0, "1%": 0.01}


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


def tracing_mode(upstream: Upstream, n: int, repeat: int, concurrency: int, measure: Measure) -> None:
    runs: dict[str, list[tuple[float, int]]] = {mode: [] for mode in MODES}  # (wall seconds, spans received)
    with tempfile.TemporaryDirectory() as tmp_name, OTLPReceiver(keep=False) as receiver:
        tmp = Path(tmp_name)
        data = tmp / "in.jsonl"
        _input(data, n)
        configs = {}
        for mode, ratio in MODES.items():
            configs[mode] = tmp / f"{mode.strip('%')}.yaml"
            _config(configs[mode], upstream, concurrency, ratio)
        saved = dict(os.environ)
        try:
            for i in range(repeat):
                # each run starts with another mode (off, all, 1% / all, 1%, off / ...): no mode always
                # follows the same one (a run after the every-span run began while its exporter drained)
                order = list(MODES)[i % len(MODES):] + list(MODES)[:i % len(MODES)]
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
                    runs[mode].append((wall, receiver.count - before))
                print(f"  run {i + 1}: " + " | ".join(
                    f"{mode} {n / runs[mode][-1][0]:6.0f} req/s, {runs[mode][-1][1]} spans" for mode in MODES),
                    flush=True)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def rate(mode: str) -> float:
        return n / statistics.median(wall for wall, _ in runs[mode])

    print(f"\ntraces: {n} chat requests through `batchyard run --workers 0`, concurrency {concurrency}, "
          f"median of {repeat} ({os.cpu_count()} cores)")
    for mode, aim in (("off", None), ("all", 0.9), ("1%", 0.97)):
        spans = statistics.median(count for _, count in runs[mode])
        wall = statistics.median(w for w, _ in runs[mode])
        ratio = f"{rate(mode) / rate('off'):5.2f}x off (aim >= {aim})" if aim is not None else ""
        print(f"    {mode:>4}  {rate(mode):8.0f} req/s   {spans:8.0f} spans exported   "
              f"{spans / wall:8.0f} spans/s   {ratio}")


__all__ = ["tracing_mode"]
