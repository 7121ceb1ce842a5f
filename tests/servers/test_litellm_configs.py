"""LiteLLM's own example configs work as they are (tests/data/litellm_configs, its README says where each is from).

Each loads; `batchyard config check` prints its routes and the LiteLLM settings batchyard does not apply
(a subprocess, as a user runs it); a small batch through `batchyard run` answers through the loopback
upstream, with the notice on stderr once; `--strict-config` refuses the same file before anything starts.
Per example, `config check` and `run` are called as functions (tests/support/cli_in_process.py: LiteLLM's
imports paid once, not once a case); the `--strict-config` case runs each command as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config.schema import load_config
from gateway.errors import ConfigError
from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support import environ
from tests.support.cli_in_process import batchyard

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "data" / "litellm_configs"
BATCHYARD = [sys.executable, "-m", "gateway.cli"]
FILE_KEY = "sk-from-the-config-file"  # environment_variables_config.yaml sets it; `keyed_upstream` requires it

# file -> (its model_names with their route kind, the LiteLLM settings it holds that batchyard does not apply)
EXAMPLES: dict[str, tuple[dict[str, str], list[str]]] = {
    "spend_tracking_config.yaml": ({"fake-openai-endpoint": "pass-through"},
                                   ["general_settings.use_redis_transaction_buffer",
                                    "general_settings.coordination_redis"]),
    "multi_instance_simple_config.yaml": ({"fake-openai-endpoint": "pass-through"},
                                          ["general_settings.coordination_redis"]),
    "store_model_db_config.yaml": ({"fake-openai-endpoint": "pass-through"},
                                   ["general_settings.store_model_in_db",
                                    "general_settings.custom_team_metadata_validate",
                                    "general_settings.team_metadata_validation_timeout",
                                    "general_settings.team_metadata_validation_error_message"]),
    "production_config.yaml": ({"gpt-4o": "pass-through"},
                               ["general_settings.database_url", "general_settings.proxy_batch_write_at",
                                "general_settings.database_connection_pool_limit",
                                "general_settings.store_model_in_db", "general_settings.disable_spend_logs",
                                "general_settings.alerting", "litellm_settings.set_verbose",
                                "litellm_settings.json_logs", "litellm_settings.cache",
                                "litellm_settings.cache_params"]),
    "include_config.yaml": ({"included-gpt": "pass-through"}, []),
    "environment_variables_config.yaml": ({"env-gpt": "pass-through"}, []),
    "docs_credentials_config.yaml": ({"gpt-4o": "pass-through"}, []),
    # zephyr-beta's hosts answer nothing: its lines are answered by gpt-3.5-turbo, litellm_settings.fallbacks
    "docs_reliability_config.yaml": ({"zephyr-beta": "LiteLLM", "gpt-3.5-turbo": "pass-through",
                                      "gpt-3.5-turbo-16k": "pass-through"}, ["litellm_settings.cooldown_time"]),
}


@pytest.fixture(scope="module")
def keyed_upstream() -> Iterator[Upstream]:
    """A loopback upstream that takes only the key environment_variables_config.yaml sets."""
    with start_upstream(api_key=FILE_KEY) as server:
        yield server


@pytest.fixture()
def own_environment() -> Iterator[None]:
    """environment_variables sets the process environment, as LiteLLM's proxy does: put it back after."""
    saved = dict(os.environ)
    yield
    environ.restore(saved)


def _env(upstream: Upstream) -> dict[str, str]:
    # The examples' own variables: their api_base at the loopback upstream, their key the one it takes.
    return {**os.environ, "FAKE_OPENAI_API_BASE": upstream.v1_url, "OPENAI_API_KEY": FILE_KEY,
            "AZURE_API_BASE": upstream.url, "AZURE_API_KEY": "az-test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _batchyard(upstream: Upstream, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BATCHYARD, *args], cwd=REPO, env=_env(upstream), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.usefixtures("own_environment")
def test_each_example_loads_naming_what_it_does_not_apply(name: str, upstream: Upstream) -> None:
    os.environ.update(_env(upstream))
    routes, not_applied = EXAMPLES[name]
    config = load_config(CONFIGS / name)
    assert sorted(config.routes) == sorted(routes)
    assert [n.key for n in config.notices] == not_applied
    assert all(n.why for n in config.notices)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_config_check_prints_the_routes(name: str, upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    proc = batchyard(capsys, "config", "check", str(CONFIGS / name), env=_env(upstream), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    routes, not_applied = EXAMPLES[name]
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[2:] if line and line[0] != " "
            and not line.startswith("config:")}
    assert {model: row[1] for model, row in rows.items()} == routes, proc.stdout
    for key in not_applied:
        assert f"  {key}: " in proc.stdout
    if not not_applied:
        assert "every LiteLLM setting in the file is applied" in proc.stdout


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_small_batch_answers_through_each_example(name: str, upstream: Upstream, keyed_upstream: Upstream,
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    routes, not_applied = EXAMPLES[name]
    if name == "environment_variables_config.yaml":  # its key comes from the file's environment_variables
        upstream = keyed_upstream
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"{model}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": model, "messages": [{"role": "user", "content": f"n{i}"}]}})
                           + "\n" for model in routes for i in range(3)))
    out = tmp_path / "out.jsonl"
    proc = batchyard(capsys, "run", "-i", str(src), "-o", str(out), "--config", str(CONFIGS / name),
                     "--no-progress", env=_env(upstream), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["response"]["status_code"] for r in results] == [200] * len(results), results
    assert [r["response"]["body"]["choices"][0]["message"]["content"] for r in results][:1] == ["echo: n0"]
    # the notice, once, at start; the config's environment values never shown
    assert proc.stderr.count("not applied (--strict-config refuses them)") == (1 if not_applied else 0)
    assert FILE_KEY not in proc.stderr and FILE_KEY not in caplog.text  # nor in what it logged


def test_strict_config_refuses_an_example_before_anything_starts(upstream: Upstream, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "gpt-4o", "messages": []}}) + "\n")
    before = upstream.stats()["requests"]
    config = str(CONFIGS / "production_config.yaml")
    for command in (["run", "-i", str(src), "-o", str(tmp_path / "out"), "--config", config, "--strict-config"],
                    ["config", "check", config, "--strict-config"],
                    ["serve", "--config", config, "--strict-config", "--data-dir", str(tmp_path / "data"),
                     "--port", "9"],
                    ["worker", "--config", config, "--strict-config", "--data-dir", str(tmp_path / "data")]):
        proc = _batchyard(upstream, *command)
        assert proc.returncode == 2, (command, proc.stderr)
        assert f"{config}: general_settings.database_url: not applied: batchyard keeps its own store" in proc.stderr
        assert "also not applied: general_settings.proxy_batch_write_at" in proc.stderr
    assert not (tmp_path / "out").exists() and upstream.stats()["requests"] == before


@pytest.mark.usefixtures("own_environment")
def test_load_balancer_example_is_refused_for_the_provider_litellm_cannot_place(upstream: Upstream) -> None:
    """Its `mistralai/mistral-7b-instruct` has a provider LiteLLM's Router cannot place: every line of it would
    fail there, so it is refused at load, naming the entry (test_litellm_routes runs the file without it)."""
    os.environ["FAKE_OPENAI_API_BASE"] = upstream.v1_url
    with pytest.raises(ConfigError) as caught:
        load_config(CONFIGS / "load_balancer.yaml")
    assert caught.value.key == "model_list[3].litellm_params"
    assert caught.value.problem == "LiteLLM has no provider `mistralai`; did you mean `mistral/`?"
