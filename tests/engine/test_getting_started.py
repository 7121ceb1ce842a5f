"""docs/getting-started.md, followed as a newcomer follows it: its own blocks, run in a fresh copy of the clone.

The blocks marked `<!-- getting-started: NAME -->` are taken from the page, so a change there that breaks
a step fails here. The copy holds the repository's files (tracked, and new ones not ignored) in a
directory of its own, not the checkout the tests run from; `.venv` and `.batchyard/models` in it stand in
for what `bash scripts/demo.sh` builds (the test's own venv, the tiny models), and the demo's printed next
steps are checked against the page. The one change to the page's text: its port (4000) becomes a free one.
None of vLLM's CPU variables is set for the server (`VLLM_CPU_KVCACHE_SPACE` included): the defaults run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from local_engine import TinyModels
from tests.support.engine_helpers import ENGINE_MARKS, REPO, built_tiny_models
from tests.support.waiting import eventually, free_port

pytestmark = ENGINE_MARKS

PAGE = REPO / "docs" / "getting-started.md"
MARK = re.compile(r"<!-- getting-started: (\w+) -->\n```(\w+)\n(.*?)\n```", re.S)
STEPS = ("demo", "activate", "serve", "client", "submit", "dashboard")
PAGE_PORT = "4000"


def page_blocks() -> dict[str, tuple[str, str]]:
    """name -> (language, text) of the page's marked blocks."""
    blocks = {name: (lang, text) for name, lang, text in MARK.findall(PAGE.read_text())}
    assert set(blocks) == set(STEPS), f"the page's marked blocks: {sorted(blocks)}"
    return blocks


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a clone has them (and new files not ignored), copied into `dest`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return built_tiny_models(tmp_path_factory)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory, tiny_models: TinyModels) -> Path:
    root = fresh_copy(tmp_path_factory.mktemp("newcomer") / "batchyard")
    (root / ".venv").symlink_to(Path(sys.prefix))  # what setup.sh makes: this venv, with batchyard in it
    (root / ".batchyard").mkdir()
    (root / ".batchyard" / "models").symlink_to(Path(tiny_models.llama).parent)  # what tiny_model builds
    return root


def newcomer_env(clone: Path) -> dict[str, str]:
    """A shell with none of the test's settings for vLLM, the copy's code first on the path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VLLM_CPU_KVCACHE", "OPENAI_", "BATCHYARD_", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(clone)  # the copy's code, not the checkout's, in every process it starts
    return env


def shell(block: str, activate: str, port: int) -> list[str]:
    return ["bash", "-euo", "pipefail", "-c", f"{activate}\n{block.replace(PAGE_PORT, str(port))}"]


@pytest.fixture(scope="module")
def server(clone: Path) -> Iterator[int]:
    """The page's serve block, in the background, on a free port."""
    blocks, port = page_blocks(), free_port()
    serve = blocks["serve"][1].strip()
    assert serve.startswith("batchyard serve ") and "\n" not in serve
    log = (clone / "serve.log").open("wb")
    proc = subprocess.Popen(shell(f"exec {serve} --port {port}", blocks["activate"][1], port), cwd=clone,
                            env=newcomer_env(clone), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def up() -> bool:
        assert proc.poll() is None, (clone / "serve.log").read_text()[-3000:]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        eventually(up, timeout=60, what="the server answers /health")
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as the page says
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_the_demo_names_the_pages_next_steps() -> None:
    blocks = page_blocks()
    assert blocks["demo"][1].startswith("bash scripts/demo.sh")
    demo = (REPO / "scripts" / "demo.sh").read_text()
    assert "source $ACTIVATE" in demo and 'ACTIVATE=".venv/bin/activate"' in demo
    assert blocks["activate"][1].strip() == "source .venv/bin/activate"
    assert f'echo "  {blocks["serve"][1].strip()}"' in demo, "the demo prints the page's serve command"


def test_the_page_from_the_server_to_the_dashboard(clone: Path, server: int) -> None:
    blocks, port, env = page_blocks(), server, newcomer_env(clone)
    activate = blocks["activate"][1]
    lines = [json.loads(line) for line in (clone / "examples" / "chat_batch.jsonl").read_text().splitlines()]

    (clone / "client.py").write_text(blocks["client"][1].replace(PAGE_PORT, str(port)))
    client = subprocess.run(shell("python client.py", activate, port), cwd=clone, env=env, capture_output=True,
                            text=True, timeout=240)
    assert client.returncode == 0, client.stdout + client.stderr
    first = client.stdout.splitlines()[0].split()
    assert first[1] == "completed", client.stdout
    outputs = [json.loads(line) for line in client.stdout.splitlines()[1:] if line.startswith("{")]
    assert [o["custom_id"] for o in outputs] == [line["custom_id"] for line in lines]  # merged, in input order
    assert {o["response"]["status_code"] for o in outputs} == {200}

    submit = subprocess.run(shell(blocks["submit"][1], activate, port), cwd=clone, env=env, capture_output=True,
                            text=True, timeout=240)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    written = [json.loads(line) for line in (clone / "results-server.jsonl").read_text().splitlines()]
    assert [w["custom_id"] for w in written] == [line["custom_id"] for line in lines]
    assert {w["response"]["status_code"] for w in written} == {200}
    submitted = re.search(r"created batch (batch_\w+)", submit.stderr)
    assert submitted is not None, submit.stderr

    url = blocks["dashboard"][1].strip().replace(PAGE_PORT, str(port))
    page = httpx.get(url, timeout=10, follow_redirects=True)
    assert page.status_code == 200
    assert first[0] in page.text and submitted.group(1) in page.text  # both batches, no login asked
