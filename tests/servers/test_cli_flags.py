"""The command line says what each flag does, and refuses a flag the chosen mode would not use.

`serve --redis-url U --workers 4` would start no worker; embedded `serve --blobs s3://…` would
keep files in --data-dir. Accepted and then ignored would be a lie: each is a usage error (exit
status 2) naming the flag and the mode.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.cli.main import build_parser, main
from gateway.cli.report import throughput
from tests.support.services import process_env
from tests.support.waiting import free_port

REPO = Path(__file__).resolve().parents[2]

REFUSED = [
    (["serve", "--redis-url", "redis://127.0.0.1:1/0", "--workers", "4"], "--workers", "shared mode"),
    (["serve", "--redis-url", "redis://127.0.0.1:1/0", "--data-dir", "d"], "--data-dir", "shared mode"),
    (["serve", "--blobs", "s3://bucket/p"], "--blobs", "embedded mode"),
    (["serve", "--claim-idle", "5"], "--claim-idle", "embedded mode"),
    (["serve", "--with-worker"], "--with-worker", "embedded mode"),
    (["worker", "--upstream-only", "--models", "llama", "--data-dir", "d"], "--models", "--upstream-only"),
    (["worker", "--data-dir", "d", "--blobs", "s3://bucket/p"], "--blobs", "embedded mode"),
    (["worker", "--redis-url", "redis://127.0.0.1:1/0", "--data-dir", "d"], "--data-dir", "shared mode"),
]


@pytest.mark.parametrize(("argv", "flag", "mode"), REFUSED, ids=[" ".join(case[0]) for case in REFUSED])
def test_a_flag_the_mode_would_not_use_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, mode: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([argv[0], "--config", "unread.yaml", *argv[1:]])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {flag} does not apply" in err and mode in err, err


RUN = ["run", "-i", "in.jsonl", "-o", "out.jsonl"]
# (argv, what stderr says): each a usage error (exit status 2) before any file is read
REFUSED_VALUES = [
    ([*RUN, "--config", "c.yaml", "--dtype", "float16"], "--dtype: engine flags apply with --model only"),
    ([*RUN, "--config", "c.yaml", "--max-model-len", "64", "--served-model-name", "a", "b"],
     "--served-model-name, --max-model-len: engine flags apply with --model only"),
    ([*RUN, "--config", "c.yaml", "--gpu-memory-utilization", "0.8", "--enable-prefix-caching"],
     "--gpu-memory-utilization, --enable-prefix-caching: engine flags apply with --model only"),
    ([*RUN, "--config", "c.yaml", "--max-num-seqs=8"], "--max-num-seqs: engine flags apply with --model only"),
    ([*RUN, "--config", "c.yaml", "--enforce-eager"], "--enforce-eager: engine flags apply with --model only; with "
     "--config, set them in the config's model_list[].engine_args"),
    ([*RUN, "--config", "c.yaml", "stray"], "unrecognized arguments: stray"),
    ([*RUN, "--model", "m", "--workers", "2"], "--workers does not apply with --model"),
    ([*RUN, "--config", "c.yaml", "--dry-run", "--data-dir", "d"], "--data-dir: does not apply with --dry-run"),
    ([*RUN, "--config", "c.yaml", "--workers", "-1"], "argument --workers: -1: must be 0 or more"),
    ([*RUN, "--model", "m", "--max-model-len", "0"], "argument --max-model-len: 0: must be a positive integer"),
    (["serve", "--config", "c.yaml", "--redis-url", "redis://127.0.0.1:1/0", "--claim-idle", "0"],
     "argument --claim-idle: 0: must be a positive number of seconds"),
    (["worker", "--config", "c.yaml", "--redis-url", "redis://127.0.0.1:1/0", "--claim-idle", "-5"],
     "argument --claim-idle: -5: must be a positive number of seconds"),
    (["worker", "--config", "c.yaml", "--redis-url", "redis://127.0.0.1:1/0", "--claim-idle", "nan"],
     "argument --claim-idle: nan: must be a positive number of seconds"),
    (["serve", "--config", "c.yaml", "--workers", "-1"], "argument --workers: -1: must be 0 or more"),
    (["serve", "--config", "c.yaml", "--port", "70000"], "argument --port: 70000: not a TCP port"),
    (["worker", "--config", "c.yaml", "--metrics-port", "-1"], "argument --metrics-port: -1: not a TCP port"),
]


@pytest.mark.parametrize(("argv", "says"), REFUSED_VALUES, ids=[" ".join(case[0]) for case in REFUSED_VALUES])
def test_a_flag_that_would_be_ignored_or_mean_nothing_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {says}" in err, err


def test_engine_flags_beside_a_config_are_refused_by_the_installed_command(tmp_path: Path) -> None:
    config = tmp_path / "team.yaml"
    config.write_text(yaml.safe_dump({"model_list": [
        {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-unused"}}]}))
    (tmp_path / "in.jsonl").write_text("")
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(tmp_path / "in.jsonl"), "-o",
                           str(tmp_path / "out.jsonl"), "--config", str(config), "--dtype", "float16"],
                          cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--dtype: engine flags apply with --model only" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_refused_by_the_installed_command_before_the_config_is_read() -> None:
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", "no-such.yaml", "--blobs",
                           "s3://bucket/p"], cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--blobs does not apply in embedded mode" in proc.stderr and "Traceback" not in proc.stderr


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_flag_says_what_it_does_and_its_default() -> None:
    parser = build_parser()
    commands = {"batchyard": parser, **{f"batchyard {n}": p for n, p in _subparsers(parser).items()}}
    commands |= {f"batchyard config {n}": p for n, p in _subparsers(commands["batchyard config"]).items()}
    assert set(commands) == {"batchyard", "batchyard run", "batchyard serve", "batchyard worker",
                             "batchyard submit", "batchyard spend", "batchyard config", "batchyard config check"}
    missing = []
    for name, command in commands.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or not action.option_strings:
                continue
            if action.help == argparse.SUPPRESS:
                continue  # internal (--parent-pid, set by the process that starts a worker)
            text = action.help or ""
            flag = f"{name} {action.option_strings[-1]}"
            if len(text) < 10:
                missing.append(f"{flag}: no help")
            has_default = action.default not in (None, False, argparse.SUPPRESS)
            if has_default and "default" not in text:
                missing.append(f"{flag}: its default {action.default!r} is not in its help")
    assert missing == []


def test_serve_help_gives_host_and_port_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 127.0.0.1;" in text and "(default: 4000)" in text and "(default: .batchyard/data)" in text


def test_the_summary_rate_means_something_for_a_small_run() -> None:
    # a 10-line demo on a local engine: 30 s of start-up, then 3 s of requests
    line = throughput(10, 1200, 33.0, 30.0)
    assert line.startswith("throughput: 3.33 req/s, 400 output tokens/s over 3.0s of running")
    assert "local engines ready in 30.0s" in line
    assert throughput(10, 0, 30.0, None) == "throughput: 0.33 req/s over 30.0s of running"
    assert throughput(5000, 0, 2.0, None).startswith("throughput: 2500 req/s")
    assert throughput(0, 0, 1.0, None) == "throughput: nothing ran"


@contextlib.contextmanager
def _serve(tmp_path: Path, *flags: str) -> Iterator[Path]:
    config = tmp_path / "team.yaml"
    config.write_text(yaml.safe_dump({"model_list": [
        {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-unused"}}]}))
    port = free_port()
    log = tmp_path / f"serve{len(flags)}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port),
             "--data-dir", str(tmp_path / "data"), "--workers", "0", *flags],
            cwd=REPO, env=process_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield log
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_verbose_reaches_the_log_level(tmp_path: Path) -> None:
    with _serve(tmp_path) as log:
        pass
    quiet = log.read_text()
    assert "batchyard serving on http://127.0.0.1:" in quiet and " DEBUG " not in quiet, quiet
    with _serve(tmp_path, "-v") as log:
        pass
    assert " DEBUG gateway.cli.serve: routes: gpt (upstream)" in log.read_text()
