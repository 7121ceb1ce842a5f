"""`batchyard run … --data-dir D --retry-failed`: the real command, a loopback upstream that fails some lines the
first time (`#fail:400x1`: LiteLLM does not retry a 400, so the run ends with them failed).

- the retry runs only the lines without a 2xx reply, then the output (and error) file holds every line once,
  in input order, the new results in place; the same command without `--retry-failed` delivers the same;
- run again with nothing left to retry: it says so, exit status 0;
- no run of this input in D: exit status 1 and a message that says to run it first;
- `--retry-failed` without `--data-dir`: a usage error (exit status 2);
- a run killed before it finished: exit status 1, and the message says to continue it first;
- killed during the retry: the same command continues that retry batch (no second one), then merges it.

The command is called as a function (tests/support/cli_in_process.py: LiteLLM's imports paid once, not once a
call) except where a process is killed: those runs are `batchyard run` subprocesses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes.upstream.server import Upstream
from tests.servers.test_run import BATCHYARD, REPO, line, read_jsonl, write_config
from tests.support.cli_in_process import batchyard
from tests.support.waiting import eventually

Run = Callable[..., subprocess.CompletedProcess[bytes]]


@pytest.fixture()
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """`batchyard run ARGS` as tests.servers.test_run.run gives it (same environment and directory), in-process."""
    def call(*args: str) -> subprocess.CompletedProcess[bytes]:
        env = {"TEST_OPENAI_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        done = batchyard(capsys, "run", *args, env=env, cwd=REPO)
        return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.encode(), done.stderr.encode())
    return call


def _input(tmp_path: Path, failing: set[int], total: int = 6) -> Path:
    tag = uuid.uuid4().hex[:8]  # the upstream counts calls per exact text: each run's texts are its own
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(
        line(f"req-{i}", "gpt-4o-mini", f"{tag} line {i}" + (" #fail:400x1" if i in failing else ""))
        for i in range(total)) + "\n")
    return src


@pytest.mark.parametrize("split", [True, False], ids=["error-file", "errors-inline"])
def test_retry_failed_answers_every_line_once_in_input_order(upstream: Upstream, tmp_path: Path, split: bool,
                                                             run: Run) -> None:
    cfg, data = write_config(tmp_path / "c.yaml", upstream), tmp_path / "state"
    src, out, err = _input(tmp_path, {1, 4}), tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    common = ["-i", str(src), "-o", str(out), "--config", str(cfg), "--data-dir", str(data), "--no-progress",
              *(["--error-file", str(err)] if split else [])]
    first = run(*common)
    assert first.returncode == 0, first.stderr.decode()
    failed = read_jsonl(err) if split else [r for r in read_jsonl(out) if r["response"]["status_code"] != 200]
    assert [r["custom_id"] for r in failed] == ["req-1", "req-4"]

    again = run(*common, "--retry-failed")
    assert again.returncode == 0, again.stderr.decode()
    assert "2 now succeeded, 0 still failed" in again.stderr.decode()
    rows = read_jsonl(out)
    assert [r["custom_id"] for r in rows] == [f"req-{i}" for i in range(6)]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in rows)
    if split:
        assert err.read_text() == ""
    # The run's state holds the merged files: the plain command delivers them, and nothing is left to retry.
    out.unlink()
    assert run(*common).returncode == 0 and [r["custom_id"] for r in read_jsonl(out)] == [f"req-{i}" for i in range(6)]
    nothing = run(*common, "--retry-failed")
    assert nothing.returncode == 0 and "nothing to retry" in nothing.stderr.decode()
    assert [r["response"]["status_code"] for r in read_jsonl(out)] == [200] * 6


def test_lines_that_fail_again_stay_in_the_error_file_for_the_next_retry(upstream: Upstream, tmp_path: Path,
                                                                          run: Run) -> None:
    cfg, data = write_config(tmp_path / "c.yaml", upstream), tmp_path / "state"
    tag = uuid.uuid4().hex[:8]
    src, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    texts = [f"{tag} a", f"{tag} b #fail:400x2", f"{tag} c", f"{tag} d #fail:400x1"]
    src.write_text("\n".join(line(f"r{i}", "gpt-4o-mini", t) for i, t in enumerate(texts)) + "\n")
    common = ["-i", str(src), "-o", str(out), "--error-file", str(err), "--config", str(cfg), "--data-dir",
              str(data), "--no-progress"]
    assert run(*common).returncode == 0
    once = run(*common, "--retry-failed")
    assert once.returncode == 0 and "1 now succeeded, 1 still failed" in once.stderr.decode()
    assert [r["custom_id"] for r in read_jsonl(out)] == ["r0", "r2", "r3"]
    assert [r["custom_id"] for r in read_jsonl(err)] == ["r1"]
    twice = run(*common, "--retry-failed")
    assert twice.returncode == 0 and "1 now succeeded, 0 still failed" in twice.stderr.decode()
    assert [r["custom_id"] for r in read_jsonl(out)] == ["r0", "r1", "r2", "r3"] and err.read_text() == ""


def test_retry_failed_without_a_run_says_to_run_it_first(run: Run, upstream: Upstream, tmp_path: Path) -> None:
    cfg, src = write_config(tmp_path / "c.yaml", upstream), _input(tmp_path, set(), 2)
    proc = run("-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--config", str(cfg), "--data-dir",
               str(tmp_path / "empty"), "--retry-failed")
    assert proc.returncode == 1 and "run it first" in proc.stderr.decode() and b"Traceback" not in proc.stderr
    usage = run("-i", str(src), "-o", str(tmp_path / "o.jsonl"), "--config", str(cfg), "--retry-failed")
    assert usage.returncode == 2 and "--retry-failed needs --data-dir" in usage.stderr.decode()


def test_a_retry_killed_midway_is_continued_not_made_twice(run: Run, upstream: Upstream, tmp_path: Path) -> None:
    """SIGKILL during `--retry-failed`: the same command continues that retry batch, then merges it."""
    cfg, data = write_config(tmp_path / "c.yaml", upstream), tmp_path / "state"
    tag = uuid.uuid4().hex[:8]
    src, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    texts = [f"{tag} {i}" + (" #fail:400x1 #sleep:3000" if i % 2 else "") for i in range(8)]
    src.write_text("\n".join(line(f"r{i}", "gpt-4o-mini", t) for i, t in enumerate(texts)) + "\n")
    common = ["-i", str(src), "-o", str(out), "--error-file", str(err), "--config", str(cfg), "--data-dir",
              str(data), "--no-progress"]
    assert run(*common).returncode == 0 and len(read_jsonl(err)) == 4
    env = {**os.environ, "TEST_OPENAI_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    log = tmp_path / "retry.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([*BATCHYARD, "run", *common, "--retry-failed"], cwd=REPO, env=env, stdout=sink,
                                stderr=sink)
        try:
            eventually(lambda: b"as batch" in log.read_bytes(), what="the retry batch created")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    again = run(*common, "--retry-failed")
    assert again.returncode == 0, again.stderr.decode()
    said = again.stderr.decode()
    assert "continuing the retry" in said and "4 now succeeded, 0 still failed" in said
    assert [r["custom_id"] for r in read_jsonl(out)] == [f"r{i}" for i in range(8)] and err.read_text() == ""


def test_retry_failed_of_a_run_still_going_says_to_continue_it_first(upstream: Upstream, tmp_path: Path,
                                                                      run: Run) -> None:
    cfg, data = write_config(tmp_path / "c.yaml", upstream), tmp_path / "state"
    tag = uuid.uuid4().hex[:8]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(line(f"r{i}", "gpt-4o-mini", f"{tag} {i} #sleep:20000") for i in range(4)) + "\n")
    common = ["-i", str(src), "-o", str(out), "--config", str(cfg), "--data-dir", str(data), "--no-progress"]
    env = {**os.environ, "TEST_OPENAI_KEY": "sk-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    def sent() -> int:  # the upstream counts a request by model as it arrives (by text only once answered)
        return sum(upstream.stats()["by_model"].values())

    before = sent()
    proc = subprocess.Popen([*BATCHYARD, "run", *common], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: sent() > before, what="the run sending requests")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    still = run(*common, "--retry-failed")
    assert still.returncode == 1 and "is still going" in still.stderr.decode()
    assert b"Traceback" not in still.stderr

