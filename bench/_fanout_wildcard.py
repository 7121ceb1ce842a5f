"""`bench/upstream_fanout.py --wildcard-half`: the per-line cost of wildcard routes, and config load time.

1. Config load: a 200-entry `model_list` with 20 wildcard routes (`load_config`, in this process, median of
   `--repeat` x 20 loads), then the first resolution of 1,000 distinct model names through those routes and
   the same lookups again (cached: one dictionary read each).
2. The same `batchyard run` twice against the loopback upstream: every line naming an exact model_name, and
   half of the lines naming models a wildcard route serves (20 concrete models through `wild/*`). Alternating
   (each repeat starting with the other), median of `--repeat`; the ratio of the two throughputs is the
   figure (aim >= 0.97).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.fakes.upstream.server import Upstream

REPO = Path(__file__).resolve().parent.parent


def _big_config(base: str) -> str:
    """180 exact model_names and 20 wildcard routes (19 `pN/*`, and `wild/*` that the lines use)."""
    params = f"api_key: sk-b, api_base: '{base}'"
    lines = ["model_list:"]
    lines += [f"  - {{model_name: m{i}, litellm_params: {{model: openai/m{i}, {params}}}}}" for i in range(180)]
    names = [f"p{i}/*" for i in range(19)] + ["wild/*"]
    lines += [f"  - {{model_name: '{name}', litellm_params: {{model: 'openai/*', {params}}}}}" for name in names]
    return "\n".join(lines) + "\n"


def _input(path: Path, n: int, wildcard_half: bool) -> None:
    with path.open("w") as f:
        for i in range(n):
            model = f"wild/w{i % 20}" if wildcard_half and i % 2 else "m0"
            body = {"model": model, "messages": [{"role": "user", "content": f"request number {i}"}]}
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def _timed(fn: Callable[[], object], times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - started) / times


def config_load(base: str, repeat: int) -> None:
    from gateway.config.schema import load_config

    with tempfile.TemporaryDirectory() as tmp_name:
        path = Path(tmp_name) / "big.yaml"
        path.write_text(_big_config(base))
        load = statistics.median(_timed(lambda: load_config(path), 20) for _ in range(repeat))
        config = load_config(path)
        names = [f"wild/x{i}" for i in range(1000)]
        started = time.perf_counter()
        for name in names:
            config.route(name)
        first = (time.perf_counter() - started) / len(names)
        again = _timed(lambda: [config.route(name) for name in names], 20) / len(names)
    print(f"config load, 200 entries with 20 wildcard routes: {1000 * load:.2f} ms (median of {repeat} x 20)")
    print(f"  a wildcard model's first resolution {1e6 * first:.1f} us, then (cached) {1e6 * again:.2f} us")


def wildcard_mode(upstream: Upstream, n: int, repeat: int, concurrency: int,
                  measure: Callable[[list[str]], tuple[float, int, float]]) -> None:
    config_load(upstream.v1_url, repeat)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        config = tmp / "bench.yaml"
        config.write_text(_big_config(upstream.v1_url) + f"batch_settings: {{max_concurrency: {concurrency}}}\n")
        exact, half = tmp / "exact.jsonl", tmp / "half.jsonl"
        _input(exact, n, wildcard_half=False)
        _input(half, n, wildcard_half=True)

        def ours(src: Path) -> list[str]:
            return [sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp / "out.jsonl"),
                    "--config", str(config), "-q", "--workers", "0"]

        runs: dict[str, list[float]] = {"exact": [], "half": []}
        for i in range(repeat):
            for kind in (("exact", "half") if i % 2 == 0 else ("half", "exact")):  # neither always first
                runs[kind].append(n / measure(ours(exact if kind == "exact" else half))[0])
            print(f"  run {i + 1}: exact names {runs['exact'][-1]:6.0f} req/s | half through wild/* "
                  f"{runs['half'][-1]:6.0f} req/s", flush=True)
        out = [json.loads(line) for line in (tmp / "out.jsonl").read_text().splitlines()]
        ok = sum(1 for r in out if (r.get("response") or {}).get("status_code") == 200)
        if ok != n:
            raise SystemExit(f"only {ok} of {n} lines answered 200 through the wildcard route")
    exact_rate, half_rate = statistics.median(runs["exact"]), statistics.median(runs["half"])
    print(f"\nwildcard routes: {n} chat requests, concurrency {concurrency}, median of {repeat}")
    print(f"    every line an exact model_name   {exact_rate:8.0f} req/s")
    print(f"    half through a wildcard route    {half_rate:8.0f} req/s")
    print(f"    throughput ratio                 {half_rate / exact_rate:8.2f}   (aim >= 0.97)")


__all__ = ["config_load", "wildcard_mode"]
