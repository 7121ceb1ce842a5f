"""Benchmark: `batchyard serve` under many clients, and a large streamed upload.

    .venv/bin/python bench/server_load.py [--clients 50] [--lines 1000] [--upload-mb 200]
    .venv/bin/python bench/server_load.py --validation-only [--validate-lines 500000]
    .venv/bin/python bench/server_load.py --during-run [--run-lines 500000] [--run-seconds 60]
    .venv/bin/python bench/server_load.py --message-batch-create [--mb-requests 100000] [--mb-size-mb 200]
    .venv/bin/python bench/server_load.py --reservations [--res-teams 20] [--res-batches 50]

Each client uploads its own N-line batch file with the real `openai` SDK,
creates a batch, and polls it until it finishes; meanwhile a prober times
`GET /v1/batches/{id}`. All batches must complete with every custom_id once.
Prints throughput (and its ratio to `batchyard run` on the same lines, in one
file, measured in the same run), the probe's p50/p99, the server's peak RSS
(the API process and its worker processes), the peak RSS while one large
file is uploaded (flat: the upload is streamed to disk), and another team's
`GET /v1/batches` p50/p99 alone, while team alpha uploads a `--validate-lines`
file and while it validates (in a validation process, off the API's: the aim is p99 <= 50
ms; the file's last line is bad, so the batch fails once validated and never
runs), with the load average. `--validation-only` measures only that. `--during-run`: another team's
`GET /v1/batches` while a `--run-lines`-line batch runs on an upstream route, embedded then shared
(bench/_during_run.py). `--message-batch-create`: one `--mb-size-mb` MB Message Batch create of normal
requests, then one of pathological objects, then escape-heavy ones: the API's peak RSS over idle (and a
validation process's, where the body is read), the create's wall, another team's `GET /v1/models` p50/p99
(bench/_message_batch_create.py).
`--reservations`: creates per second of `--res-teams` teams each creating `--res-batches` small batches at once,
with `budget_reservation: estimate` and without (bench/_reservations.py).
Not a test: a shared 2-core machine is noisy; the upstream runs beside it.
"""

from __future__ import annotations

import argparse
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.config.schema import parse_config  # noqa: E402
from gateway.runtime.supervisor import default_workers  # noqa: E402
from tests.fakes.upstream.server import start_upstream  # noqa: E402
from tests.support.server_helpers import Gateway, gateway_config, start_gateway  # noqa: E402


class PeakRSS:
    """The peak RSS of a process and its children (the API process and its workers), sampled."""

    def __init__(self, pid: int) -> None:
        self._ps = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                tree = [self._ps, *self._ps.children(recursive=True)]
                self.peak = max(self.peak, sum(p.memory_info().rss for p in tree))
            time.sleep(0.02)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# Two teams: alpha's clients load the gateway and upload the file that validates; beta probes.
TEAMS = [{"team_id": "alpha", "api_keys": ["sk-alpha"]}, {"team_id": "beta", "api_keys": ["sk-beta"]}]
MASTER = "sk-bench-master"
# A line of the file: 500,000 of them made 184 MB.
_VALIDATE_TEXT = "hello there, how are you? " * 8


def _file(client: int, lines: int) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"c{client}-{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "gpt-mini", "messages": [{"role": "user", "content": f"{client} {i}"}]}}
                   ).encode() + b"\n"
        for i in range(lines)
    )


def _client(gw: Gateway, n: int, lines: int, ids: list[str]) -> tuple[str, int]:
    api = gw.client("sk-alpha")
    f = api.files.create(file=(f"batch-{n}.jsonl", _file(n, lines)), purpose="batch")
    batch = api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    ids.append(batch.id)
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(1.0)
        batch = api.batches.retrieve(batch.id)
    if batch.status != "completed" or batch.output_file_id is None:
        return batch.status, 0
    out = api.files.content(batch.output_file_id).text.splitlines()
    seen = [json.loads(x)["custom_id"] for x in out]
    assert seen == [f"c{n}-{i}" for i in range(lines)], f"batch {batch.id}: lines lost, repeated or out of order"
    return batch.status, len(seen)


def _probe(gw: Gateway, ids: list[str], stop: threading.Event, latencies: list[float]) -> None:
    with httpx.Client(base_url=gw.url, timeout=30, headers={"Authorization": "Bearer sk-alpha"}) as http:
        while not stop.is_set():
            if ids:
                started = time.perf_counter()
                http.get(f"/v1/batches/{ids[len(latencies) % len(ids)]}")
                latencies.append(time.perf_counter() - started)
            time.sleep(0.05)


def _chunks(total: int) -> Iterator[bytes]:
    line = json.dumps({"custom_id": "x" * 40, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "gpt-mini", "messages": [{"role": "user", "content": "y" * 400}]}}
                      ).encode() + b"\n"
    block = line * ((1 << 20) // len(line))
    sent = 0
    while sent < total:
        yield block
        sent += len(block)


def _wait_workers(gw: Gateway, want: int) -> None:
    """Until the worker processes are up (their start, importing LiteLLM, is not load)."""
    deadline = time.monotonic() + 120
    admin = {"Authorization": f"Bearer {MASTER}"}  # /health lists workers to the master key only
    while len(httpx.get(gw.url + "/health", headers=admin, timeout=10).json().get("workers", [])) < want:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.2)


def _run_rate(config: dict, tmp: Path, clients: int, lines: int) -> float:
    """`batchyard run` on every client's lines in one file: requests per second, whole process."""
    import yaml

    path = tmp / "all.jsonl"
    path.write_bytes(b"".join(_file(n, lines) for n in range(clients)))
    (tmp / "run.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(path), "-o", str(tmp / "out.jsonl"),
                    "--config", str(tmp / "run.yaml"), "-q"], check=True, env=env, cwd=REPO)
    return clients * lines / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--lines", type=int, default=1_000)
    parser.add_argument("--upload-mb", type=int, default=200)
    parser.add_argument("--workers", type=int, default=None, help="serve --workers (default: the product's)")
    parser.add_argument("--validate-lines", type=int, default=500_000,
                        help="lines of the file (~360 bytes each) validated while another team's GET /v1/batches "
                             "is probed (default 500000, the issue's 184 MB file; 0: skip)")
    parser.add_argument("--validation-only", action="store_true",
                        help="measure only GET /v1/batches alone and while the file validates (default: off)")
    parser.add_argument("--during-run", action="store_true",
                        help="measure only another team's GET /v1/batches while a big batch runs, in both modes")
    parser.add_argument("--run-lines", type=int, default=500_000, help="--during-run: the batch's lines")
    parser.add_argument("--run-seconds", type=float, default=60.0, help="--during-run: the measurement window")
    parser.add_argument("--message-batch-create", action="store_true",
                        help="measure only one large Message Batch create (normal, pathological objects, escapes)")
    parser.add_argument("--mb-requests", type=int, default=100_000, help="--message-batch-create: its requests")
    parser.add_argument("--mb-size-mb", type=int, default=200, help="--message-batch-create: its body's size")
    parser.add_argument("--mb-repeat", type=int, default=1, help="--message-batch-create: creates of each kind "
                        "(medians printed past one)")
    parser.add_argument("--mb-kinds", default="normal,pathological,escapes",
                        help="--message-batch-create: which bodies, comma-separated: normal, pathological, escapes "
                        "(one request of one long escaped string, and --mb-requests requests of escaped text); "
                        "normal alone for the code before issue 34, which holds a pathological body as Python objects)")
    parser.add_argument("--reservations", action="store_true",
                        help="creates per second with budget_reservation: estimate, against the same without")
    parser.add_argument("--res-teams", type=int, default=20, help="--reservations: teams creating at once")
    parser.add_argument("--res-batches", type=int, default=50, help="--reservations: batches each team creates")
    args = parser.parse_args()
    if args.reservations:
        from bench._reservations import reservations

        print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
        reservations(args.res_teams, args.res_batches, args.workers or 1)
        return
    if args.message_batch_create:
        from bench._message_batch_create import message_batch_create

        print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
        message_batch_create(args.mb_requests, args.mb_size_mb, args.mb_repeat, tuple(args.mb_kinds.split(",")))
        return
    if args.during_run:
        from bench._during_run import during_run

        print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the start")
        during_run(args.run_lines, args.run_seconds)
        return
    mib = 1024 * 1024
    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        config = gateway_config(upstream, models=("gpt-mini",), teams=TEAMS, master_key=MASTER,
                                max_lines=max(1_000_000, args.validate_lines),
                                max_file_bytes=(max(args.upload_mb, args.validate_lines * 400 // mib) + 10) * mib)
        # The product's rule, worked out here and passed on, so that the bench knows how many to wait for.
        workers = default_workers(parse_config(config), serving=True) if args.workers is None else args.workers
        with start_gateway(config, Path(tmp) / "data", workers=workers) as gw:
            _wait_workers(gw, workers)
            if args.validation_only:
                alone = _validation_probe(gw, args.validate_lines)
                gw.stop()
                _print_validation(args.validate_lines, alone)
                return
            api = psutil.Process(gw.process.pid)
            idle_rss = sum(p.memory_info().rss for p in [api, *api.children(recursive=True)])
            ids: list[str] = []
            latencies: list[float] = []
            stop = threading.Event()
            prober = threading.Thread(target=_probe, args=(gw, ids, stop, latencies), daemon=True)
            started = time.perf_counter()
            with PeakRSS(gw.process.pid) as load_rss:
                prober.start()
                with ThreadPoolExecutor(args.clients) as pool:
                    outcomes = list(pool.map(lambda n: _client(gw, n, args.lines, ids), range(args.clients)))
                stop.set()
                prober.join()
            wall = time.perf_counter() - started
            done = sum(1 for status, _ in outcomes if status == "completed")
            total = sum(n for _, n in outcomes)
            with PeakRSS(gw.process.pid) as upload_rss:
                reply = httpx.post(
                    gw.url + "/v1/files", timeout=600, data={"purpose": "batch"},
                    headers={"Authorization": "Bearer sk-alpha"},
                    files={"file": ("big.jsonl", b"".join(_chunks(args.upload_mb * mib)))},
                )
            assert reply.status_code == 200, reply.text[:500]
            validation = _validation_probe(gw, args.validate_lines) if args.validate_lines else None
        run_rate = _run_rate(config, Path(tmp), args.clients, args.lines)
    lat = sorted(latencies)
    print(f"\nserver load: {args.clients} clients x {args.lines}-line batches against a loopback upstream")
    print(f"  batches completed         {done}/{args.clients}   requests answered {total}/{args.clients * args.lines}")
    print(f"  throughput                {total / wall:8.0f} requests/s   ({wall:.0f} s wall)")
    print(f"  batchyard run, same lines {run_rate:8.0f} requests/s   ratio serve/run {total / wall / run_rate:.2f}"
          "   (aim >= 0.9)")
    if lat:
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(f"  GET /v1/batches/{{id}}      p50 {1000 * statistics.median(lat):6.1f} ms   p99 {1000 * p99:6.1f} ms"
              f"   ({len(lat)} probes)")
    print(f"  server peak RSS under load {load_rss.peak / mib:7.0f} MiB   (idle {idle_rss / mib:.0f} MiB)")
    print(f"  server peak RSS during a {args.upload_mb} MB upload {upload_rss.peak / mib:7.0f} MiB")
    if validation is not None:
        _print_validation(args.validate_lines, validation)
    print(f"  load average {os.getloadavg()[0]:.1f} (1 min)")


class Validation(NamedTuple):
    megabytes: float  # the file's size
    seconds: float  # from create until the batch was seen out of `validating`
    # beta's GET /v1/batches latencies (sorted) and the 1-minute load average at the end of each phase:
    # nothing else going on, alpha's upload of the file, and its validation
    alone: tuple[list[float], float]
    upload: tuple[list[float], float]
    during: tuple[list[float], float]


def _percentiles(latencies: list[float]) -> str:
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return (f"p50 {1000 * statistics.median(latencies):6.1f} ms   p99 {1000 * p99:6.1f} ms   "
            f"({len(latencies)} probes)")


def _print_validation(lines: int, v: Validation) -> None:
    print(f"\nanother team's GET /v1/batches while a {lines}-line file ({v.megabytes:.0f} MB) validates "
          f"in {v.seconds:.1f} s ({lines / v.seconds:,.0f} lines/s)")
    for name, (latencies, load) in (("alone", v.alone), ("during the upload", v.upload),
                                    ("during the validation", v.during)):
        aim = "   (aim p99 <= 50 ms)" if name == "during the validation" else ""
        print(f"  {name:<25} {_percentiles(latencies)}   load average {load:.1f}{aim}")


def _validation_probe(gw: Gateway, lines: int) -> Validation:
    """Team beta's GET /v1/batches timed with nothing else going on, while team alpha uploads a `lines`-line
    file, and while it validates (its last line is bad: the batch fails once validated, and never runs)."""
    row = {"custom_id": "", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "gpt-mini", "messages": [{"role": "user", "content": _VALIDATE_TEXT}]}}
    path = Path(tempfile.mkdtemp()) / "validate.jsonl"
    with path.open("w") as f:  # written in pieces: the bench holds no 184 MB string
        for i in range(lines - 1):
            f.write(json.dumps({**row, "custom_id": f"v{i}"}) + "\n")
        f.write("{bad\n")
    alpha = gw.client("sk-alpha").with_options(timeout=600)
    latencies: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=gw.url, timeout=60, headers={"Authorization": "Bearer sk-beta"}) as http:
            while not stop.is_set():
                t = time.perf_counter()
                http.get("/v1/batches", params={"limit": 5})
                latencies.append(time.perf_counter() - t)
                time.sleep(0.01)

    def phase() -> tuple[list[float], float]:
        took = sorted(latencies)
        del latencies[:]
        return took, os.getloadavg()[0]

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    time.sleep(5.0)
    alone = phase()
    with path.open("rb") as raw:
        source = alpha.files.create(file=("validate.jsonl", raw), purpose="batch")
    upload = phase()
    path.unlink()
    started = time.perf_counter()
    batch = alpha.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    while alpha.batches.retrieve(batch.id).status == "validating":
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    during = phase()
    stop.set()
    prober.join()
    return Validation(source.bytes / 1e6, seconds, alone, upload, during)


if __name__ == "__main__":
    main()
