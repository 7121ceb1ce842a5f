"""`bench/server_load.py --reservations`: creates per second with `budget_reservation: estimate` against the same
run without it. `--res-teams` teams (each with a `max_budget`) each create `--res-batches` small batches at once
against one embedded gateway (one store); the files are uploaded first (each reserving team's file starts its
estimate in the validation processes as it is stored: their rate is printed too), and a few creates warm the
validation processes before the creates are timed. Before any of it the server
must be ready (`_ready`: its readiness probe, its worker processes, and a team's key answered through the SDK);
the SDK retries a dropped connection, and a create that still fails is counted and named, not a crash. Not a
test: a shared machine is noisy."""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil

from tests.fakes.upstream.server import start_upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway

MASTER = "sk-bench-master"
READY_SECONDS = 120.0
RETRIES = 5  # the SDK's retries of a dropped connection or a 429/5xx, with its backoff


def _ready(gw: Gateway, workers: int, timeout: float = READY_SECONDS) -> float:
    """Wait until the server answers its readiness probe with its `workers` worker processes up, and a team's
    key through the SDK; how long it took (s). The server's own start already waited for `/health`."""
    began = time.monotonic()
    deadline = began + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not gw.alive():
            raise SystemExit(f"the gateway exited while starting:\n{gw.log()[-4000:]}")
        try:
            health = httpx.get(f"{gw.url}/health/readiness", headers={"authorization": f"Bearer {MASTER}"},
                               timeout=5)
            up = health.status_code == 200 and len(health.json().get("workers") or []) >= workers
            if up:
                gw.client("sk-t0").with_options(timeout=10, max_retries=0).files.list(limit=1)
                return time.monotonic() - began
            last = f"{health.status_code} {health.text[:200]}"
        except (httpx.HTTPError, openai.APIError, ValueError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise SystemExit(f"the gateway was not ready within {timeout:.0f} s (last: {last}):\n{gw.log()[-4000:]}")


def _file(team: int, batch: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"t{team}-b{batch}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "gpt-mini", "max_tokens": 16,
                                         "messages": [{"role": "user", "content": f"hello {i}"}]}}).encode() + b"\n"
                    for i in range(2))


def _cpu_seconds(gw: Gateway) -> dict[str, float]:
    """CPU seconds (user + system) so far of the API process and of all the gateway's processes together."""
    api = psutil.Process(gw.process.pid)
    total = 0.0
    for process in [api, *api.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        total += times.user + times.system
    times = api.cpu_times()
    return {"api": times.user + times.system, "all": total}


def _creates_per_second(gw: Gateway, teams: int, batches: int, warm: int) -> tuple[float, list[str], dict[str, float]]:
    """Upload every file, warm up with `warm` creates, then time every team's creates at once: creates per
    second (those that succeeded), why each create that failed failed, and the gateway's CPU milliseconds per
    create while they ran (the API process's, and all its processes', workers and validation included), with
    the files uploaded per second before them (a reserving team's file starts its estimate as it is stored)."""
    clients = {t: gw.client(f"sk-t{t}").with_options(timeout=300, max_retries=RETRIES) for t in range(teams)}
    uploading = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        files = list(pool.map(lambda tb: (tb[0], clients[tb[0]].files.create(
            file=(f"b{tb[1]}.jsonl", _file(*tb)), purpose="batch").id),
            [(t, b) for t in range(teams) for b in range(batches + warm // teams + 1)]))
    uploads = len(files) / (time.perf_counter() - uploading)
    warmups, timed = files[:warm], files[warm:warm + teams * batches]

    def create(item: tuple[int, str]) -> str | None:
        team, file_id = item
        try:
            clients[team].batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
        except openai.APIError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, warmups))
    cpu, started = _cpu_seconds(gw), time.perf_counter()
    with ThreadPoolExecutor(64) as pool:
        failed = [why for why in pool.map(create, timed) if why is not None]
    wall, spent = time.perf_counter() - started, _cpu_seconds(gw)
    per_create = {k: (spent[k] - cpu[k]) * 1000 / len(timed) for k in cpu}
    return (len(timed) - len(failed)) / wall, failed, per_create | {"uploads": uploads}


def reservations(teams: int, batches: int, workers: int) -> None:
    rates = {}
    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        for mode in ("none", "estimate"):
            config = gateway_config(upstream, models=("gpt-mini",), master_key=MASTER, budget_reservation=mode,
                                    teams=[{"team_id": f"t{t}", "api_keys": [f"sk-t{t}"], "max_budget": 1000.0}
                                           for t in range(teams)])
            config["model_list"][0]["model_info"] = {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}
            with start_gateway(config, Path(tmp) / mode, workers=workers) as gw:
                waited = _ready(gw, workers)
                rates[mode], failed, cpu = _creates_per_second(gw, teams, batches, warm=2 * (os.cpu_count() or 2))
            print(f"  budget_reservation: {mode:<9} {rates[mode]:7.1f} creates/s   ({teams} teams x {batches} batches "
                  f"at once; ready after {waited:.1f} s; load average {os.getloadavg()[0]:.1f}); CPU per create: API "
                  f"process {cpu['api']:.2f} ms, every gateway process {cpu['all']:.2f} ms; the uploads before: "
                  f"{cpu['uploads']:.1f} files/s", flush=True)
            if failed:
                print(f"  {len(failed)} of {teams * batches} creates failed, not counted; the first: {failed[0]}")
    if not rates["none"] or not rates["estimate"]:
        raise SystemExit("no create succeeded in one of the runs: no ratio")
    print(f"  ratio estimate/none {rates['estimate'] / rates['none']:.2f}   (aim >= 0.9)")
