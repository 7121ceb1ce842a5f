"""Benchmark: native batches over every native provider's stand-in against the OpenAI route alone (issue 38), and
what priming Anthropic's prompt cache saves (issue 52).

    .venv/bin/python bench/native_providers.py [--lines 50000] [--repeat 3] [--profile mix.prof]
    .venv/bin/python bench/native_providers.py --cache-only [--cache-lines 1000]

One `batchyard run --config` of N chat lines spread evenly over the native routes (OpenAI and Azure OpenAI
on the loopback upstream; Anthropic, Mistral, the Gemini API, Groq, Together AI, xAI, Fireworks AI, Amazon
Bedrock over moto's S3 and Vertex AI over gcp-storage-emulator: their stand-ins in tests/fakes, started by
`tests.support.native_config.StandIns`), and one
of the same N lines all on the OpenAI native route. Reported: wall from start to the output written (create to
completed), and the gateway process's CPU (user + system, from `getrusage` of the finished `run`) per 1,000
lines. Aim: CPU per line of the mix <= 1.2x the OpenAI route's. Medians of `--repeat`, alternating; the load
average at both ends. `--profile PATH`: one more run of the mix under cProfile, its stats written to PATH and
the top functions by cumulative time printed. Not a test: a shared machine is noisy, and the stand-ins run
beside the gateway.

The cache part (after the CPU part, or alone with `--cache-only`): one job of `--cache-lines` chat lines that
share a 2,000-token system prompt marked `cache_control`, on the Anthropic stand-in with its cache accounting
(tokens are its whitespace words), run with `prime_cache` on and off; printed: each run's cost in the team's
ledger, the priming's part of it and the stand-in's cache reads and writes. The route is priced as Anthropic
prices a model: cache reads 0.1x the input price, writes 1.25x, a batch at half of each. A cost computation:
its figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._native_cache import cache_costs  # noqa: E402
from tests.support.native_config import NATIVE_MODELS, StandIns  # noqa: E402

MIX = list(NATIVE_MODELS)  # a route per native provider (tests.support.native_config)
NATIVE = "native_poll_initial_seconds: 0.2, native_poll_max_seconds: 0.5"


def _write(path: Path, routes: list[str], lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": routes[i % len(routes)], "max_tokens": 16,
                    "messages": [{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": f"hello number {i}"}]}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def _run(config: Path, src: Path, out: Path, env: dict[str, str], profile: Path | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the gateway process) of one `batchyard run`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    python = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profile else [])]
    proc = subprocess.run([*python, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config",
                           str(config), "--no-progress"], cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    failed = sum(1 for line in out.open() if json.loads(line)["error"] is not None)
    if failed:
        raise SystemExit(f"{failed} lines failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=50_000, help="chat lines per run (default 50000; >= 500)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; medians (default 3)")
    parser.add_argument("--profile", type=Path, default=None, help="profile one more run of the mix into this file")
    parser.add_argument("--cache-only", action="store_true", help="run only the primed prompt cache's cost part")
    parser.add_argument("--cache-lines", type=int, default=1000, help="lines of the cache part's job (default 1000)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    print(f"commit {commit.stdout.strip()}   load average {os.getloadavg()[0]:.2f} (1 min) at start")
    if not args.cache_only:
        _cpu(args)
    cache_costs(args.cache_lines)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


def _cpu(args: argparse.Namespace) -> None:
    with StandIns(batch_delay=0.5, bucket="batchyard-bench") as stand_ins, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "native.yaml"
        config.write_text(stand_ins.config(NATIVE))
        env = stand_ins.env()
        mix, alone = Path(tmp) / "mix.jsonl", Path(tmp) / "alone.jsonl"
        _write(mix, MIX, args.lines)
        _write(alone, ["gpt-bulk"], args.lines)
        out = Path(tmp) / "out.jsonl"
        rounds: dict[str, list[tuple[float, float]]] = {"mix": [], "openai": []}
        for _ in range(args.repeat):
            rounds["mix"].append(_run(config, mix, out, env))
            rounds["openai"].append(_run(config, alone, out, env))
        if args.profile:
            _run(config, mix, out, env, args.profile)
    print(f"\n{args.lines} chat lines per run, medians of {args.repeat} (alternating)")
    per_k = {}
    for name, label in (("mix", f"{len(MIX)} native providers  "), ("openai", "OpenAI native alone  ")):
        wall = statistics.median(r[0] for r in rounds[name])
        per_k[name] = statistics.median(1000 * r[1] / args.lines for r in rounds[name])
        print(f"  {label}  wall {wall:7.2f} s   gateway CPU {per_k[name]:6.3f} s per 1,000 lines   "
              f"(walls {', '.join(f'{r[0]:.1f}' for r in rounds[name])})")
    print(f"  CPU per line, mix / OpenAI alone: {per_k['mix'] / per_k['openai']:.2f}   (aim <= 1.2)")
    if args.profile:
        print(f"\nthe mix under cProfile ({args.profile}), top 25 by cumulative time:")
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
