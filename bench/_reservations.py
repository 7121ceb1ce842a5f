"""`bench/server_load.py --reservations`: creates per second with `budget_reservation: estimate` against the same
run without it. `--res-teams` teams (each with a `max_budget`) each create `--res-batches` small batches at once
against one embedded gateway (one store); the files are uploaded first, and a few creates warm the validation
processes (where a reserving create's estimate is made) before anything is timed. Not a test: a shared machine
is noisy."""

from __future__ import annotations

import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.fakes.upstream.server import start_upstream
from tests.support.server_helpers import Gateway, gateway_config, start_gateway

MASTER = "sk-bench-master"


def _file(team: int, batch: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"t{team}-b{batch}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "gpt-mini", "max_tokens": 16,
                                         "messages": [{"role": "user", "content": f"hello {i}"}]}}).encode() + b"\n"
                    for i in range(2))


def _creates_per_second(gw: Gateway, teams: int, batches: int, warm: int) -> float:
    """Upload every file, warm up with `warm` creates, then time every team's creates at once."""
    clients = {t: gw.client(f"sk-t{t}").with_options(timeout=300) for t in range(teams)}
    with ThreadPoolExecutor(32) as pool:
        files = list(pool.map(lambda tb: (tb[0], clients[tb[0]].files.create(
            file=(f"b{tb[1]}.jsonl", _file(*tb)), purpose="batch").id),
            [(t, b) for t in range(teams) for b in range(batches + warm // teams + 1)]))
    warmups, timed = files[:warm], files[warm:warm + teams * batches]

    def create(item: tuple[int, str]) -> None:
        team, file_id = item
        clients[team].batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, warmups))
    started = time.perf_counter()
    with ThreadPoolExecutor(64) as pool:
        list(pool.map(create, timed))
    return len(timed) / (time.perf_counter() - started)


def reservations(teams: int, batches: int, workers: int) -> None:
    rates = {}
    with start_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        for mode in ("none", "estimate"):
            config = gateway_config(upstream, models=("gpt-mini",), master_key=MASTER, budget_reservation=mode,
                                    teams=[{"team_id": f"t{t}", "api_keys": [f"sk-t{t}"], "max_budget": 1000.0}
                                           for t in range(teams)])
            config["model_list"][0]["model_info"] = {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-6}
            with start_gateway(config, Path(tmp) / mode, workers=workers) as gw:
                rates[mode] = _creates_per_second(gw, teams, batches, warm=2 * (os.cpu_count() or 2))
            print(f"  budget_reservation: {mode:<9} {rates[mode]:7.1f} creates/s   ({teams} teams x {batches} batches "
                  f"at once; load average {os.getloadavg()[0]:.1f})", flush=True)
    print(f"  ratio estimate/none {rates['estimate'] / rates['none']:.2f}   (aim >= 0.9)")
