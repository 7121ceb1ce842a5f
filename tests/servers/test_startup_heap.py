"""The cycle collector around `batchyard run`'s start-up (and `serve`'s and a `worker`'s): paused while
starting, the start-up heap frozen after, and never either in a process that only calls the command as a
function (a test, a notebook)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.heap import StartupHeap
from gateway.cli.main import main
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
CONFIG = """\
model_list:
  - model_name: known
    litellm_params: {model: openai/known, api_key: sk-test, api_base: "http://127.0.0.1:9/v1"}
"""


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector is undone after it."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_no_full_collection_while_starting_then_frozen_and_collecting_as_before(collector: None) -> None:
    before = gc.get_threshold()
    heap = StartupHeap()
    heap.pause()
    assert gc.get_threshold()[:2] == before[:2]  # the young generations are still collected
    assert gc.get_threshold()[2] > 1_000_000  # the oldest waits
    started = [object() for _ in range(10)]  # what start-up builds and keeps
    heap.freeze()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() >= len(started)
    heap.freeze()  # once only: a second call changes nothing
    heap.resume()
    assert gc.get_threshold() == before


def test_a_start_up_that_ends_early_collects_as_before(collector: None) -> None:
    before = gc.get_threshold()
    heap = StartupHeap()
    heap.pause()
    heap.pause()
    heap.resume()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_command_as_a_function_neither_pauses_nor_freezes(tmp_path: Path, collector: None) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("not json\n")
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    before = gc.get_threshold()
    main(["run", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--config", str(config), "--no-progress"])
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_the_command_in_its_own_process_freezes_its_start_up_heap(tmp_path: Path) -> None:
    """An upstream-only config: start-up ends when the input is stored and the runtime starts."""
    src = tmp_path / "in.jsonl"
    body = {"model": "nowhere", "messages": [{"role": "user", "content": "hi"}]}
    src.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n")
    seen = tmp_path / "seen.txt"
    probe = (
        "import gc, sys\n"
        "before = gc.get_threshold()\n"
        "from gateway.cli import offline\n"
        "real = offline._run\n"
        "async def spy(runtime, opts):\n"
        "    code = await real(runtime, opts)\n"
        f"    with open({str(seen)!r}, 'w') as f:  # the terminal is the command's own: write to a file\n"
        "        print('FROZEN', gc.get_freeze_count() > 0, 'AS_BEFORE', gc.get_threshold() == before, file=f)\n"
        "    return code\n"
        "offline._run = spy\n"
        "from gateway.cli import heap\n"
        "real_freeze = heap.StartupHeap.freeze\n"
        "def freeze(self):  # what had loaded by then is what the freeze keeps out of the collector's walks\n"
        f"    with open({str(seen)!r} + '.at', 'w') as f:\n"
        "        print('ROUTER_LOADED', 'litellm.router' in sys.modules, file=f)\n"
        "    real_freeze(self)\n"
        "heap.StartupHeap.freeze = freeze\n"
        "from gateway.cli.main import main\n"
        "sys.exit(main())\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    proc = subprocess.run(
        [sys.executable, "-c", probe, "run", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--config",
         str(config), "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seen.read_text().split() == ["FROZEN", "True", "AS_BEFORE", "True"]
    # frozen once the backends had started: LiteLLM's import and its Router (some 280,000 objects) are in the
    # frozen heap, not walked by each of the batch's full collections (2.5 s of a 20,000-line run, measured)
    assert (tmp_path / "seen.txt.at").read_text().split() == ["ROUTER_LOADED", "True"]


@pytest.mark.parametrize("command", [
    ["serve", "--host", "127.0.0.1", "--port", "0", "--workers", "0"],  # the API process
    ["worker"],  # a worker process
], ids=["serve", "worker"])
def test_serve_and_worker_freeze_their_start_up_heap_once_started(tmp_path: Path, command: list[str]) -> None:
    """Both live as long as what their start-up built (LiteLLM's import alone: some 280,000 objects)."""
    seen = tmp_path / "seen.txt"
    probe = (
        "import gc, sys\n"
        "from gateway.cli import heap\n"
        "real = heap.StartupHeap.freeze\n"
        "def spy(self):\n"
        "    real(self)\n"
        f"    with open({str(seen)!r}, 'w') as f:\n"
        "        print('FROZEN', gc.get_freeze_count() > 0, file=f)\n"
        "heap.StartupHeap.freeze = spy\n"
        "from gateway.cli.main import main\n"
        "sys.exit(main())\n"
    )
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    proc = subprocess.Popen(
        [sys.executable, "-c", probe, *command, "--config", str(config), "--data-dir", str(tmp_path / "data")],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: seen.exists() and seen.read_text().split() == ["FROZEN", "True"], timeout=60,
                   what=f"{command[0]} to freeze its start-up heap")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    # stopped cleanly (uvicorn raises SIGTERM again once it has shut down: the serve's exit is the signal's)
    assert proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in err, err[-2000:]
