"""Benchmark: what our extensions cost (issue 28).

    .venv/bin/python bench/extensions.py [--estimate-lines 50000] [--results-lines 20000] [--repeat 3]

- **The cost estimate.** `GET /v1/files/{id}/cost_estimate` on an N-line file, against the validation of the
  same file (a batch created from it, timed from create until it leaves `validating`; then cancelled): the
  estimate does no more work than validation, so the aim is wall <= 1.0x. Another team's `GET /v1/batches`
  p50/p99 is probed meanwhile (aim p99 <= 50 ms).
- **Results while it runs.** An M-line batch on the loopback upstream, create to `completed`, unpolled and
  with `GET /v1/batches/{id}/results` followed every second (every new line read, the cursor kept), the two
  alternating: aim polled >= 0.95x unpolled throughput. Every custom_id must come back once through the
  polled results.

One `serve` (embedded, the product's default workers) for everything; medians of `--repeat`; the load
average at both ends. Not a test: a shared 2-core machine is noisy; the upstream runs beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.config.schema import parse_config  # noqa: E402
from gateway.runtime.supervisor import default_workers  # noqa: E402
from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.server_helpers import Gateway, gateway_config, start_gateway  # noqa: E402

TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
MASTER = "sk-bench-master"
FINISHED = ("completed", "failed", "expired", "cancelled")


def _write(path: Path, lines: int, text: str) -> None:
    with path.open("w") as f:
        for i in range(lines):
            body = {"model": "gpt-mini", "max_tokens": 64,
                    "messages": [{"role": "user", "content": f"{text} {i}"}]}
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


class Probe:
    """Team beta's `GET /v1/batches`, timed in a loop while something else runs."""

    def __init__(self, gw: Gateway) -> None:
        self._gw, self.latencies = gw, list[float]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self._gw.url, timeout=60, headers={"Authorization": "Bearer sk-beta"}) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                http.get("/v1/batches", params={"limit": 5})
                self.latencies.append(time.perf_counter() - started)
                time.sleep(0.01)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _estimate_vs_validation(gw: Gateway, path: Path) -> tuple[float, float, list[float]]:
    """One round: the estimate's wall (with beta's probe latencies) and the validation's wall."""
    alpha = gw.client("sk-alpha").with_options(timeout=600)
    with path.open("rb") as f:
        source = alpha.files.create(file=(path.name, f), purpose="batch")
    with Probe(gw) as probe:
        started = time.perf_counter()
        estimate = alpha.get(f"/files/{source.id}/cost_estimate", cast_to=object)
        estimate_wall = time.perf_counter() - started
    assert isinstance(estimate, dict) and estimate["error_count"] == 0, str(estimate)[:500]
    started = time.perf_counter()
    batch = alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    while (batch := alpha.batches.retrieve(batch.id)).status == "validating":
        time.sleep(0.02)
    validation_wall = time.perf_counter() - started
    alpha.batches.cancel(batch.id)
    while alpha.batches.retrieve(batch.id).status not in FINISHED:
        time.sleep(0.2)
    return estimate_wall, validation_wall, probe.latencies


def _run_batch(gw: Gateway, path: Path, lines: int, polled: bool) -> float:
    """Create to `completed`: lines per second. Polled: the results followed every second, each line once."""
    alpha = gw.client("sk-alpha").with_options(timeout=600)
    with path.open("rb") as f:
        source = alpha.files.create(file=(path.name, f), purpose="batch")
    started = time.perf_counter()
    batch = alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    seen: list[str] = []
    cursor: str | None = None
    while True:
        status = alpha.batches.retrieve(batch.id).status
        if polled:
            while True:  # everything new since the cursor, page by page
                params = {"limit": 10_000, **({"after": cursor} if cursor else {})}
                page = alpha.get(f"/batches/{batch.id}/results", cast_to=httpx.Response,
                                 options={"params": params})
                seen.extend(json.loads(raw)["custom_id"] for raw in page.text.splitlines())
                cursor = page.headers["x-next-cursor"]
                if page.headers["x-has-more"] == "false":
                    break
        if status in FINISHED:
            break
        time.sleep(1.0)
    wall = time.perf_counter() - started
    assert status == "completed", status
    if polled:
        assert sorted(seen) == sorted(f"r{i}" for i in range(lines)), "results lost or repeated through the cursor"
    return lines / wall


def _pct(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"p50 {1000 * statistics.median(ordered):5.1f} ms  p99 {1000 * p99:5.1f} ms ({len(ordered)} probes)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimate-lines", type=int, default=50_000,
                        help="lines of the file estimated and validated (default 50000; 0: skip)")
    parser.add_argument("--results-lines", type=int, default=20_000,
                        help="lines of the batch run unpolled and polled (default 20000; 0: skip)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each measure; medians (default 3)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    print(f"commit {commit.stdout.strip()}   load average {os.getloadavg()[0]:.2f} (1 min) at start")
    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, master_key=MASTER)
        workers = default_workers(parse_config(config), serving=True)
        with start_gateway(config, Path(tmp) / "data", workers=workers) as gw:
            if args.estimate_lines:
                path = Path(tmp) / "estimate.jsonl"
                _write(path, args.estimate_lines, "how many tokens does this sentence take, roughly?")
                rounds = [_estimate_vs_validation(gw, path) for _ in range(args.repeat)]
                estimate = statistics.median(r[0] for r in rounds)
                validation = statistics.median(r[1] for r in rounds)
                probes = [x for r in rounds for x in r[2]]
                print(f"\ncost_estimate on {args.estimate_lines} lines ({path.stat().st_size / 1e6:.1f} MB), "
                      f"medians of {args.repeat}")
                print(f"  estimate   {estimate:6.2f} s   (rounds {', '.join(f'{r[0]:.2f}' for r in rounds)})")
                print(f"  validation {validation:6.2f} s   (rounds {', '.join(f'{r[1]:.2f}' for r in rounds)})")
                print(f"  ratio estimate/validation {estimate / validation:.2f}   (aim <= 1.0)")
                print(f"  another team's GET /v1/batches during the estimates: {_pct(probes)}   (aim p99 <= 50 ms)")
            if args.results_lines:
                path = Path(tmp) / "results.jsonl"
                _write(path, args.results_lines, "hello")
                warm = Path(tmp) / "warm.jsonl"
                _write(warm, 500, "warm")
                _run_batch(gw, warm, 500, polled=False)  # warm-up: the workers' first LiteLLM calls
                plain, polled = [], []
                for _ in range(args.repeat):
                    plain.append(_run_batch(gw, path, args.results_lines, polled=False))
                    polled.append(_run_batch(gw, path, args.results_lines, polled=True))
                print(f"\n{args.results_lines}-line batch, create to completed, medians of {args.repeat} "
                      f"(alternating)")
                print(f"  unpolled {statistics.median(plain):7.0f} lines/s   ({', '.join(f'{x:.0f}' for x in plain)})")
                print(f"  polled   {statistics.median(polled):7.0f} lines/s   "
                      f"({', '.join(f'{x:.0f}' for x in polled)})   results read every 1 s")
                print(f"  ratio polled/unpolled {statistics.median(polled) / statistics.median(plain):.2f}   "
                      "(aim >= 0.95)")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
