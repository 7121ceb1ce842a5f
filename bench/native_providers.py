"""Benchmark: native batches over every provider's stand-in against the OpenAI route alone (issue 38).

    .venv/bin/python bench/native_providers.py [--lines 50000] [--repeat 3]

One `batchyard run --config` of N chat lines spread evenly over the native routes (OpenAI on the loopback
upstream, Anthropic, Mistral, the Gemini API, Amazon Bedrock over moto's S3: their stand-ins in tests/fakes),
and one of the same N lines all on the OpenAI native route. Reported: wall from start to the output written,
and the gateway process's CPU (user + system, from `getrusage` of the finished `run`) per 1,000 lines. Aim:
CPU per line of the mix <= 1.2x the OpenAI route's. Medians of `--repeat`, alternating; the load average at
both ends. Not a test: a shared machine is noisy, and the stand-ins run beside the gateway. (Vertex AI is not
a native provider yet.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakes.stub_process import start_stub  # noqa: E402
from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.services import S3_ENV, MotoS3, process_env  # noqa: E402

ROLE = "arn:aws:iam::123456789012:role/batchyard-bench"
MIX = ["gpt-bulk", "claude-bulk", "mistral-bulk", "gemini-bulk", "bedrock-bulk"]


def _config(urls: dict[str, str], bucket: str) -> str:
    native = "batch_mode: native, native_poll_initial_seconds: 0.2, native_poll_max_seconds: 0.5"
    return f"""
model_list:
  - model_name: gpt-bulk
    litellm_params: {{model: openai/gpt-4o-mini, api_base: "{urls['upstream']}", api_key: sk-o}}
    model_info: {{{native}}}
  - model_name: claude-bulk
    litellm_params: {{model: anthropic/claude-haiku-4-5, api_base: "{urls['anthropic']}", api_key: sk-a}}
    model_info: {{{native}}}
  - model_name: mistral-bulk
    litellm_params: {{model: mistral/mistral-small-latest, api_base: "{urls['mistral']}/v1", api_key: sk-m}}
    model_info: {{{native}}}
  - model_name: gemini-bulk
    litellm_params: {{model: gemini/gemini-2.5-flash-lite, api_base: "{urls['gemini']}", api_key: g-key}}
    model_info: {{{native}}}
  - model_name: bedrock-bulk
    litellm_params: {{model: bedrock/anthropic.claude-3-5-haiku-20241022-v1:0, aws_region_name: us-east-1}}
    model_info: {{{native}, native_s3_bucket: {bucket}, native_role_arn: "{ROLE}"}}
"""


def _write(path: Path, routes: list[str], lines: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": routes[i % len(routes)], "max_tokens": 16,
                    "messages": [{"role": "system", "content": "Answer briefly."},
                                 {"role": "user", "content": f"hello number {i}"}]}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def _run(config: Path, src: Path, out: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the gateway process) of one `batchyard run`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(out), "--config",
                           str(config), "--no-progress"], cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    failed = sum(1 for line in out.open() if json.loads(line)["error"] is not None)
    if failed:
        raise SystemExit(f"{failed} lines failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _servers(stack: ExitStack) -> Iterator[tuple[dict[str, str], MotoS3]]:
    moto = MotoS3("batchyard-bench").start()
    stack.callback(moto.close)
    urls = {"upstream": stack.enter_context(start_upstream(batch_delay=0.5)).v1_url}
    for name in ("anthropic", "mistral", "gemini"):
        urls[name] = stack.enter_context(start_stub(f"tests.fakes.stubs_{name}", ["--batch-delay", "0.5"])).url
    urls["bedrock"] = stack.enter_context(start_stub("tests.fakes.stubs_bedrock", [
        "--batch-delay", "0.5", "--s3-endpoint", moto.url])).url
    yield urls, moto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=50_000, help="chat lines per run (default 50000; >= 500)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; medians (default 3)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    print(f"commit {commit.stdout.strip()}   load average {os.getloadavg()[0]:.2f} (1 min) at start")
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        urls, moto = next(_servers(stack))
        config = Path(tmp) / "native.yaml"
        config.write_text(_config(urls, moto.bucket))
        env = process_env({**S3_ENV, "AWS_ENDPOINT_URL_S3": moto.url, "AWS_ENDPOINT_URL_BEDROCK": urls["bedrock"]})
        mix, alone = Path(tmp) / "mix.jsonl", Path(tmp) / "alone.jsonl"
        _write(mix, MIX, args.lines)
        _write(alone, ["gpt-bulk"], args.lines)
        out = Path(tmp) / "out.jsonl"
        rounds: dict[str, list[tuple[float, float]]] = {"mix": [], "openai": []}
        for _ in range(args.repeat):
            rounds["mix"].append(_run(config, mix, out, env))
            rounds["openai"].append(_run(config, alone, out, env))
    print(f"\n{args.lines} chat lines per run, medians of {args.repeat} (alternating)")
    per_k = {}
    for name, label in (("mix", "five native providers"), ("openai", "OpenAI native alone  ")):
        wall = statistics.median(r[0] for r in rounds[name])
        per_k[name] = statistics.median(1000 * r[1] / args.lines for r in rounds[name])
        print(f"  {label}  wall {wall:7.2f} s   gateway CPU {per_k[name]:6.3f} s per 1,000 lines   "
              f"(walls {', '.join(f'{r[0]:.1f}' for r in rounds[name])})")
    print(f"  CPU per line, mix / OpenAI alone: {per_k['mix'] / per_k['openai']:.2f}   (aim <= 1.2)")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
