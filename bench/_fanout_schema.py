"""`bench/upstream_fanout.py --schema`: what checking replies against their schema costs a batch's throughput.

N chat lines, each with a 20-field `json_schema` `response_format`; the loopback upstream answers every one with
JSON made from the schema (tests/fakes/upstream/structured.py), so every reply is valid and nothing is re-run.
The same `batchyard run` (one process, `--workers 0`) three ways a round, `--repeat` rounds, each round starting
with the next mode:

- the check off (`batch_settings.output_check.enabled: false`), twice (`off` and `off again`);
- the check on (the default: every reply parsed and validated, in a thread, as it is journaled).

Both send the same bytes and get the same replies: only the check differs. A ratio is taken within each round,
against the mean of that round's two off runs, and the median over rounds is the figure; `off again` against
`off` is the noise floor. Aim (issue 49): >= 0.95x. Also printed: each mode's CPU seconds per 1,000 lines (the
whole process), and the validator's time per line, measured in this process (`OutputReruns.settle` over the
replies the upstream gives, in the runner's chunks of 64).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.domain import BatchRequest, Endpoint, Result
from gateway.pipeline.output_reruns import OutputReruns
from tests.fakes.upstream.server import Upstream
from tests.fakes.upstream.structured import instance

Measure = Callable[[list[str]], tuple[float, int, float]]
MODES = {"off": False, "on": True, "off again": False}
AIM = 0.95
_TYPES = ("string", "integer", "number", "boolean")
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {f"field_{i}": {"type": _TYPES[i % 4]} for i in range(20)},
    "required": [f"field_{i}" for i in range(20)],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "record", "strict": True, "schema": SCHEMA}}


def _body(i: int) -> dict[str, Any]:
    return {"model": "bench-model", "messages": [{"role": "user", "content": f"request number {i}"}],
            "response_format": FORMAT}


def _input(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": _body(i)}) + "\n")


def _config(path: Path, upstream: Upstream, concurrency: int, enabled: bool) -> None:
    path.write_text(
        "model_list:\n"
        "  - model_name: bench-model\n"
        f"    litellm_params: {{model: openai/bench-model, api_key: sk-bench, api_base: '{upstream.v1_url}'}}\n"
        f"batch_settings: {{max_concurrency: {concurrency}, output_check: {{enabled: {str(enabled).lower()}}}}}\n"
    )


def validator_time(n: int) -> float:
    """Microseconds per line of the check, in this process, on valid replies like the upstream's."""
    requests = [BatchRequest(i + 1, f"req-{i}", Endpoint.CHAT, _body(i)) for i in range(n)]
    content = json.dumps(instance(SCHEMA))
    reply = {"id": "x", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 20, "total_tokens": 23}}
    results = [Result(line=r.line, custom_id=r.custom_id, status_code=200, body=reply) for r in requests]
    checks = OutputReruns(requests, 2)
    checks.settle(results[:64])  # the schema compiled once, as a run compiles it on its first reply
    started = time.perf_counter()
    for at in range(64, n, 64):
        done = checks.settle(results[at:at + 64])
        assert all(r.ok for r in done)
    return (time.perf_counter() - started) / max(n - 64, 1) * 1e6


def schema_mode(upstream: Upstream, n: int, repeat: int, concurrency: int, measure: Measure) -> None:
    rounds: list[dict[str, float]] = []
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}  # CPU seconds of each run (user + sys)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = tmp / "in.jsonl"
        _input(data, n)
        configs = {}
        for mode, enabled in MODES.items():
            configs[mode] = tmp / f"{len(configs)}.yaml"
            _config(configs[mode], upstream, concurrency, enabled)
        for i in range(repeat):
            order = list(MODES)[i % len(MODES):] + list(MODES)[:i % len(MODES)]
            runs: dict[str, float] = {}
            for mode in order:
                out = tmp / "out.jsonl"
                runs[mode], _, used = measure([sys.executable, "-m", "gateway.cli", "run", "-i", str(data), "-o",
                                            str(out), "--config", str(configs[mode]), "-q", "--workers", "0"])
                with out.open() as f:  # every reply valid: nothing failed, nothing re-run
                    failed = sum(1 for line in f if json.loads(line)["error"] is not None)
                assert failed == 0, f"{mode}: {failed} lines failed"
                cpu[mode].append(used)
            rounds.append(runs)
            base = (runs["off"] + runs["off again"]) / 2
            print(f"  round {i + 1}: " + " | ".join(f"{mode} {n / runs[mode]:5.0f} req/s ({base / runs[mode]:4.2f}x)"
                                                    for mode in MODES), flush=True)
    print(f"\noutput check: {n} chat lines with a 20-field json_schema, every reply valid, `batchyard run "
          f"--workers 0`, concurrency {concurrency}, {repeat} rounds ({os.cpu_count()} cores)")
    for mode in MODES:
        walls = [runs[mode] for runs in rounds]
        line = (f"    {mode:>9}  {n / statistics.median(walls):6.0f} req/s (median)  "
                f"{1000 * statistics.median(cpu[mode]) / n:5.2f} CPU s/1k")
        if MODES[mode]:
            ratios = [(runs["off"] + runs["off again"]) / 2 / runs[mode] for runs in rounds]
            line += (f"   {statistics.median(ratios):4.2f}x off (rounds {min(ratios):.2f}-{max(ratios):.2f}; "
                     f"aim >= {AIM})")
        print(line)
    off_cpu = statistics.median(cpu["off"] + cpu["off again"])
    print(f"    CPU: the check on takes {statistics.median(cpu['on']) / off_cpu:4.2f}x the CPU of the check off "
          "(whole process, start-up included; steadier than wall time on a busy machine)")
    floor = [runs["off"] / runs["off again"] for runs in rounds]
    print(f"    noise floor: `off again` against `off` in the same round {statistics.median(floor):4.2f}x "
          f"(rounds {min(floor):.2f}-{max(floor):.2f}; a quiet machine gives 1.00)")
    print(f"    the validator: {validator_time(n):.1f} us a line (parse + validate + bookkeeping, in one thread, "
          "off the event loop)")


__all__ = ["schema_mode", "validator_time"]
