"""A value the config took from the environment is never shown (issue 45, Must 8), whatever its key's name.

`max_active_batches: os.environ/SEC`, with SEC holding a key by mistake, once gave `must be an integer, got
'sk-live-…'` in `config check`, in `serve`'s log and in its exit message (only keys named like a key,
secret, password or token were hidden). Here, against the real commands: `config check` and `serve` refuse
such configs naming the key and never the value, for a value from `os.environ/` and one set by
`environment_variables`, through pydantic's message and one of our own checks; and a running `serve` never
writes such a value in its log, even where a caller sends it in a path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.upstream.server import Upstream
from tests.support.server_helpers import REPO_ROOT, Gateway, gateway_config, start_gateway
from tests.support.waiting import eventually

SECRET = "sk-live-9f8e7d6c5b4a39281706"
MODEL = {"model_name": "m", "litellm_params": {"model": "openai/m", "api_key": "os.environ/H45B_SEC"}}


def _config(team: dict[str, Any], environment: dict[str, str] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"model_list": [MODEL], "batch_settings": {"teams": [
        {"team_id": "fine", "api_keys": ["sk-fine-0123"]}, team]}}
    if environment:
        config["environment_variables"] = environment
    return config


CASES = [
    ("an integer key from os.environ/", _config({"team_id": "t", "api_keys": ["sk-t-0123"],
                                                 "max_active_batches": "os.environ/H45B_SEC"}),
     "batch_settings.teams[1].max_active_batches: must be an integer"),
    ("an integer key from environment_variables", _config(
        {"team_id": "t", "api_keys": ["sk-t-0123"], "max_active_batches": "os.environ/H45B_SET"},
        {"H45B_SET": SECRET + "-set"}), "batch_settings.teams[1].max_active_batches: must be an integer"),
    ("a team id from os.environ/ (our own check quotes it)", _config({"team_id": "os.environ/H45B_SEC_ID",
                                                                     "api_keys": ["sk-t-0123"]}),
     "batch_settings.teams[1].team_id: team '<hidden: set from the environment>' is not a valid team id"),
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "H45B_SEC": SECRET, "H45B_SEC_ID": SECRET + ":id"}


@pytest.mark.parametrize("command", ["config check", "serve"])
@pytest.mark.parametrize(("case", "config", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_config_error_never_echoes_a_value_from_the_environment(case: str, config: dict[str, Any], message: str,
                                                                   command: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["config", "check", str(path)] if command == "config check" else \
        ["serve", "--config", str(path), "--port", "9", "--data-dir", str(tmp_path / "data")]
    done = subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env=_env())
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "sk-live" not in done.stderr + done.stdout, done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(upstream, teams=[{"team_id": "alpha", "api_keys": ["sk-alpha-0123456789"]}],
                            models=["gpt-mini"])
    config["environment_variables"] = {"H45B_RUNNING_SECRET": SECRET + "-running"}
    with start_gateway(config, tmp_path_factory.mktemp("env") / "data") as server:
        yield server


def test_a_running_serve_never_logs_a_value_from_the_environment(gateway: Gateway) -> None:
    """Even where a caller sends the value itself (in a path, a query, a client request id), the log hides it."""
    value = SECRET + "-running"
    httpx.get(f"{gateway.url}/v1/files/{value}?after={value}", headers={"X-Client-Request-Id": value}, timeout=30)
    log = eventually(lambda: "/v1/files/" in gateway.log() and gateway.log(), timeout=15,
                     what="the request's access line")
    assert value not in log, log
    assert "<hidden: set from the environment>" in log
