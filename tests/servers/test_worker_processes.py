"""`batchyard serve`'s worker processes: the installed code, and second place to the API for the CPU.

Started from a directory with a `gateway/` folder of its own (a checkout of something else, a user's
project), the workers must still run batchyard's code, not that folder's, or every shard fails with the
folder's errors. And they run nicer than the API process, so that on a small machine the API's answers
never wait behind a big batch's shards.
"""

from __future__ import annotations

import os
from pathlib import Path

from gateway.runtime.supervisor import WORKER_NICENESS
from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import chat_line, gateway_config, start_gateway, submit, wait_batch


def test_workers_ignore_a_gateway_folder_in_the_current_directory(upstream: Upstream, tmp_path: Path) -> None:
    here = tmp_path / "project"
    (here / "gateway" / "cli").mkdir(parents=True)
    for init in (here / "gateway" / "__init__.py", here / "gateway" / "cli" / "__init__.py"):
        init.write_text("raise ImportError('the wrong gateway package was imported')\n")
    config = gateway_config(upstream, models=("gpt-mini",))
    with start_gateway(config, tmp_path / "data", workers=1, cwd=here) as gw:
        client = gw.client(None)
        batch = wait_batch(client, submit(client, [chat_line(f"l{i}", "gpt-mini", f"hi {i}") for i in range(4)]).id)
        assert batch.status == "completed", gw.log()[-3000:]
        assert batch.request_counts is not None and batch.request_counts.completed == 4
        assert "the wrong gateway package" not in gw.log()
        workers = gw.http("GET", "/health").json()["workers"]  # an open gateway: /health lists them
        assert len(workers) == 1
        api_nice = os.getpriority(os.PRIO_PROCESS, gw.process.pid)
        assert os.getpriority(os.PRIO_PROCESS, workers[0]["pid"]) == min(19, api_nice + WORKER_NICENESS)
