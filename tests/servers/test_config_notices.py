"""A LiteLLM setting batchyard does not apply is named, never silent, never fatal; strict config refuses it.

And the file is read as LiteLLM's proxy reads it: `include` merged (lists extended, other values replaced,
each file once, a missing one named), `environment_variables` set before any `os.environ/` is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.litellm.notices import REASONS
from gateway.config.schema import load_config, parse_config
from gateway.errors import ConfigError
from tests.support.server_helpers import start_gateway

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk-x"}}

# (the config's extra sections, the dotted key named, words of why)
NOT_APPLIED: list[tuple[dict[str, Any], str, str]] = [
    ({"general_settings": {"database_url": "os.environ/UNSET_DATABASE_URL"}}, "general_settings.database_url",
     "batchyard keeps its own store"),
    ({"general_settings": {"store_model_in_db": True}}, "general_settings.store_model_in_db", "own store"),
    ({"general_settings": {"proxy_batch_write_at": 60}}, "general_settings.proxy_batch_write_at", "own store"),
    ({"general_settings": {"enable_jwt_auth": True}}, "general_settings.enable_jwt_auth", "master_key"),
    ({"general_settings": {"alerting": ["slack"]}}, "general_settings.alerting", "no alerts"),
    ({"general_settings": {"background_health_checks": True}}, "general_settings.background_health_checks",
     "proxy server"),
    ({"litellm_settings": {"cache": True}}, "litellm_settings.cache", "not applied to batch lines"),
    ({"litellm_settings": {"cache_params": {"type": "redis", "host": "os.environ/UNSET_REDIS"}}},
     "litellm_settings.cache_params", "litellm_settings.cache"),
    ({"litellm_settings": {"max_budget": 10}}, "litellm_settings.max_budget", "teams[].max_budget"),
    ({"litellm_settings": {"set_verbose": True}}, "litellm_settings.set_verbose", "logging"),
    ({"litellm_settings": {"return_response_headers": True}}, "litellm_settings.return_response_headers",
     "module setting"),
    ({"router_settings": {"cache_responses": True}}, "router_settings.cache_responses", "another team"),
    ({"guardrails": [{"guardrail_name": "g"}]}, "guardrails", "section of LiteLLM's proxy"),
    ({"environment_variables": {"PATH": "/tmp"}}, "environment_variables.PATH", "never lets a config set it"),
]


@pytest.fixture(autouse=True)
def own_environment() -> Iterator[None]:
    """environment_variables sets the process environment (as LiteLLM's proxy does): put it back after."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _config(**sections: Any) -> dict[str, Any]:
    return {"model_list": [UPSTREAM], **sections}


@pytest.mark.parametrize(("extra", "key", "says"), NOT_APPLIED, ids=[c[1] for c in NOT_APPLIED])
def test_named_not_applied_and_refused_when_strict(extra: dict[str, Any], key: str, says: str) -> None:
    config = parse_config(_config(**extra), "team.yaml")
    assert [(n.key, says in n.why) for n in config.notices] == [(key, True)]
    assert "gpt" in config.routes  # loading succeeds
    assert key.partition(".")[2] not in {**config.litellm_settings, **config.router_settings}  # nor is it applied
    for raw, strict in ((_config(**extra), True), (_config(**extra, batch_settings={"strict_config": True}), False)):
        with pytest.raises(ConfigError) as caught:
            parse_config(raw, "team.yaml", strict=strict)
        assert (caught.value.key, caught.value.path) == (key, "team.yaml")
        assert caught.value.problem.startswith("not applied: ") and says in caught.value.problem


def test_settings_with_a_meaning_here_are_applied_not_named() -> None:
    config = parse_config(_config(
        general_settings={"master_key": "sk-m"},
        litellm_settings={"request_timeout": 30, "num_retries": 1, "callbacks": ["prometheus"]},
        router_settings={"routing_strategy": "least-busy", "num_retries": 2, "timeout": 9},
    ), "team.yaml", strict=True)
    assert config.notices == []
    assert config.master_key == "sk-m"
    assert config.litellm_settings == {"request_timeout": 30, "num_retries": 1, "callbacks": ["prometheus"]}
    assert config.router_settings == {"routing_strategy": "least-busy", "num_retries": 2, "timeout": 9}


@pytest.mark.parametrize(("extra", "key", "says"), [
    ({"litellm_settings": {"drop_parms": True}}, "litellm_settings.drop_parms", "did you mean drop_params?"),
    ({"general_settings": {"master_kye": "k"}}, "general_settings.master_kye", "did you mean master_key?"),
    ({"router_settings": {"routing_stratgy": "x"}}, "router_settings.routing_stratgy",
     "did you mean routing_strategy?"),
    ({"litellm_setings": {}}, "litellm_setings", "did you mean litellm_settings?"),
    ({"general_settings": {"zzzz_qqqq": 1}}, "general_settings.zzzz_qqqq", "unknown key"),
])
def test_a_key_nobody_knows_is_an_error_with_the_closest_name(extra: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(**extra), "team.yaml")
    assert caught.value.key == key and caught.value.problem.startswith("unknown key")
    assert says in caught.value.problem


def test_every_reason_names_a_key_litellm_knows_and_the_docs_list() -> None:
    docs = (REPO / "docs" / "configuration.md").read_text()
    for key in REASONS:
        section, _, name = key.partition(".")
        parse_config(_config(**{section: {name: 1}}), "team.yaml")  # named, not refused
        assert f"`{key}`" in docs, key


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_include_merges_as_litellm_does(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "more.yaml", {"model_list": [{**UPSTREAM, "model_name": "c"}],
                                            "include": ["../main.yaml"]})  # already read: not read again
    _write(tmp_path / "models.yaml", {"model_list": [{**UPSTREAM, "model_name": "b"}], "include": ["sub/more.yaml"],
                                      "router_settings": {"num_retries": 5}})
    main = _write(tmp_path / "main.yaml", {"include": ["models.yaml"], "model_list": [UPSTREAM],
                                           "router_settings": {"num_retries": 1, "timeout": 3}})
    config = load_config(main)
    assert list(config.routes) == ["gpt", "b", "c"]  # lists extended, in order
    assert config.router_settings == {"num_retries": 5}  # any other value replaced, as LiteLLM merges


def test_a_missing_include_is_named(tmp_path: Path) -> None:
    main = _write(tmp_path / "main.yaml", {"include": ["models.yaml"]})
    with pytest.raises(ConfigError) as caught:
        load_config(main)
    assert caught.value.key == "include" and "models.yaml: no such file" in caught.value.problem
    with pytest.raises(ConfigError, match="include: must be a list of file paths"):
        load_config(_write(tmp_path / "bad.yaml", {"include": "models.yaml", "model_list": [UPSTREAM]}))


def test_environment_variables_are_set_before_os_environ_is_read() -> None:
    os.environ["OPERATOR_BASE"] = "http://127.0.0.1:9/v1"
    config = parse_config({
        "environment_variables": {"TEAM_KEY": "sk-from-file", "TEAM_BASE": "os.environ/OPERATOR_BASE",
                                  "TEAM_UNSET_COPY": "os.environ/NO_SUCH_VARIABLE_SET", "TEAM_PORT": 8080},
        "model_list": [{"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini",
                                                                "api_key": "os.environ/TEAM_KEY",
                                                                "api_base": "os.environ/TEAM_BASE"}}],
    }, "team.yaml")
    params = config.routes["gpt"].model_list()[0]["litellm_params"]
    assert (params["api_key"], params["api_base"]) == ("sk-from-file", "http://127.0.0.1:9/v1")
    assert (os.environ["TEAM_PORT"], "TEAM_UNSET_COPY" in os.environ) == ("8080", False)  # as LiteLLM sets them
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(environment_variables={"TEAM_SECRET": {"nested": "sk-hidden-value"}}), "team.yaml")
    assert caught.value.key == "environment_variables.TEAM_SECRET" and "sk-hidden-value" not in str(caught.value)


def test_serve_logs_the_notice_and_health_shows_it_to_the_master_key(tmp_path: Path) -> None:
    raw = _config(general_settings={"master_key": "sk-master", "database_url": "postgres://x"},
                  litellm_settings={"cache": True})
    with start_gateway(raw, tmp_path / "data", workers=0) as gateway:
        admin = gateway.http("GET", "/health", key="sk-master").json()
        anyone = gateway.http("GET", "/health").json()
        log = gateway.log()
    assert admin["config_notices"] == [
        "general_settings.database_url: batchyard keeps its own store (SQLite in --data-dir, or Redis and shared "
        "storage)",
        f"litellm_settings.cache: {REASONS['litellm_settings.cache']}",
    ]
    assert anyone == {"status": "healthy"}
    assert log.count("2 LiteLLM setting(s) not applied") == 1 and "general_settings.database_url" in log
    assert "postgres://x" not in log
