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
from tests.fakes.upstream.server import Upstream
from tests.support import environ
from tests.support.cli_in_process import batchyard
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
    environ.restore(saved)


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


@pytest.mark.parametrize(("key", "says"), [
    ("drop_parms", "did you mean drop_params?"),
    ("cooldown_time", "a Router setting: write it in router_settings"),  # not "did you mean scaledown_models"
    ("zzzz_qqqq", "where nothing reads it"),
])
def test_a_litellm_settings_key_the_module_lacks_is_named_as_litellm_sets_it(key: str, says: str) -> None:
    """LiteLLM's proxy setattr()s any litellm_settings key on its module: the file loads there, so here too."""
    config = parse_config(_config(litellm_settings={key: 1}), "team.yaml")
    assert [(n.key, says in n.why) for n in config.notices] == [(f"litellm_settings.{key}", True)]
    assert key not in config.litellm_settings
    with pytest.raises(ConfigError) as caught:
        parse_config(_config(litellm_settings={key: 1}), "team.yaml", strict=True)
    assert caught.value.key == f"litellm_settings.{key}" and says in caught.value.problem


@pytest.mark.parametrize("section", ["credential_list", "search_tools", "mcp_servers", "mcp_tools", "agents",
                                     "vector_store_registry", "policies", "policy_attachments"])
def test_sections_the_proxy_reads_in_its_helpers_are_named(section: str) -> None:
    config = parse_config(_config(**{section: []}), "team.yaml")
    assert [n.key for n in config.notices] == ([] if section == "credential_list" else [section])


def test_a_credential_gives_its_values_to_the_deployments_naming_it() -> None:
    os.environ["TEAM_CREDENTIAL_KEY"] = "sk-from-credential"
    entry = {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "litellm_credential_name": "c1"}}
    config = parse_config({"model_list": [entry], "credential_list": [
        {"credential_name": "c1", "credential_values": {"api_key": "os.environ/TEAM_CREDENTIAL_KEY",
                                                         "api_base": "http://127.0.0.1:9/v1"},
         "credential_info": {"description": "team key"}}]}, "team.yaml", strict=True)
    params = config.routes["gpt"].model_list()[0]["litellm_params"]
    assert params == {"model": "openai/gpt-4o-mini", "api_key": "sk-from-credential",
                      "api_base": "http://127.0.0.1:9/v1"}
    with pytest.raises(ConfigError) as caught:
        parse_config({"model_list": [entry], "credential_list": []}, "team.yaml")
    assert caught.value.key == "model_list[0].litellm_params.litellm_credential_name"
    with pytest.raises(ConfigError) as caught:
        parse_config({"model_list": [entry], "credential_list": [
            {"credential_name": "c1", "credential_values": {"api_bse": "http://x"}}]}, "team.yaml")
    assert "did you mean api_base?" in caught.value.problem  # a credential's values are checked as litellm_params


@pytest.mark.parametrize(("params", "info", "key", "says"), [
    ({"api_bse": "http://127.0.0.1:9/v1"}, {}, "model_list[0].litellm_params", "api_bse: not a LiteLLM "
     "completion argument or provider setting (LiteLLM would send it to the provider); did you mean api_base?"),
    ({}, {"input_cost_per_tokn": 1e-6}, "model_list[0].model_info", "did you mean input_cost_per_token?"),
])
def test_a_deployment_key_litellm_does_not_know_is_refused(params: dict[str, Any], info: dict[str, Any], key: str,
                                                          says: str) -> None:
    entry = {**UPSTREAM, "litellm_params": {**UPSTREAM["litellm_params"], **params}, "model_info": info}
    with pytest.raises(ConfigError) as caught:
        parse_config({"model_list": [entry]}, "team.yaml")
    assert caught.value.key.startswith(key) and says in caught.value.problem


def test_litellm_s_own_deployment_keys_and_batchyard_s_load() -> None:
    entry = {"model_name": "gpt", "litellm_params": {"model": "anthropic/claude-3-5-haiku", "api_key": "k",
                                                    "top_k": 5, "thinking": {"type": "enabled"}, "rpm": 5},
             "model_info": {"id": "d1", "base_model": "claude", "max_input_tokens": 1000,
                            "input_cost_per_token": 1e-6, "mode": "chat", "allowed_params": ["top_k"]}}
    assert "gpt" in parse_config({"model_list": [entry]}, "team.yaml", strict=True).routes


def test_extra_body_is_passed_on_and_named() -> None:
    entry = {**UPSTREAM, "litellm_params": {**UPSTREAM["litellm_params"], "extra_body": {"guided_json": {}}}}
    config = parse_config({"model_list": [entry]}, "team.yaml", strict=True)  # passed on: strict keeps it
    assert [(n.key, n.applied) for n in config.notices] == [("model_list[0].litellm_params.extra_body", True)]
    assert config.routes["gpt"].model_list()[0]["litellm_params"]["extra_body"] == {"guided_json": {}}


def test_a_provider_litellm_cannot_place_is_refused_at_load() -> None:
    entry = {"model_name": "m", "litellm_params": {"model": "mistralai/Mistral-7B-Instruct-v0.3", "api_key": "k"}}
    with pytest.raises(ConfigError) as caught:
        parse_config({"model_list": [entry]}, "team.yaml")
    assert caught.value.key == "model_list[0].litellm_params"
    assert "LiteLLM has no provider `mistralai`; did you mean `mistral/`?" in caught.value.problem
    placed = {"model_name": "m", "litellm_params": {"model": "mistralai/Mistral-7B-Instruct-v0.3",
                                                    "custom_llm_provider": "together_ai", "api_key": "k"}}
    assert "m" in parse_config({"model_list": [placed]}, "team.yaml").routes


def test_callbacks_the_proxy_starts_are_named_and_the_others_kept() -> None:
    config = parse_config(_config(litellm_settings={
        "callbacks": ["presidio", "prometheus", "hide_secrets"], "success_callback": ["websearch_interception"]}),
        "team.yaml")
    assert [n.key for n in config.notices] == ["litellm_settings.callbacks.presidio",
                                               "litellm_settings.callbacks.hide_secrets",
                                               "litellm_settings.success_callback.websearch_interception"]
    assert config.litellm_settings == {"callbacks": ["prometheus"], "success_callback": []}


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


def test_batchyard_s_own_model_info_keys_are_one_list() -> None:
    from gateway.config.entries import LocalModelInfo, ModelInfo, NativeModelInfo
    from gateway.config.litellm.deployment_keys import BATCHYARD_MODEL_INFO

    fields = set(ModelInfo.model_fields) | set(NativeModelInfo.model_fields) | set(LocalModelInfo.model_fields)
    assert fields <= set(BATCHYARD_MODEL_INFO), sorted(fields - set(BATCHYARD_MODEL_INFO))


def test_supported_environments_load_as_litellm_s_router_loads_them() -> None:
    from litellm.types.router import VALID_LITELLM_ENVIRONMENTS

    from gateway.config.litellm.deployment_keys import ENVIRONMENTS

    assert list(ENVIRONMENTS) == list(VALID_LITELLM_ENVIRONMENTS)
    prod = {**UPSTREAM, "model_info": {"supported_environments": ["production"]}}
    both = {**UPSTREAM, "model_name": "any", "model_info": {"supported_environments": ["staging", "production"]}}
    os.environ["LITELLM_ENVIRONMENT"] = "staging"
    config = parse_config({"model_list": [prod, both]}, "team.yaml")
    assert list(config.routes) == ["any"]  # the Router skips a deployment its environment leaves out
    assert [n.key for n in config.notices] == ["model_list[0]"] and "LITELLM_ENVIRONMENT=staging" in \
        config.notices[0].why
    os.environ["LITELLM_ENVIRONMENT"] = "prod"
    with pytest.raises(ConfigError, match="LiteLLM takes development, staging, production"):
        parse_config({"model_list": [prod]}, "team.yaml")


def test_a_router_litellm_refuses_is_a_config_error_at_check_run_and_serve(
        upstream: Upstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`supported_environments` without LITELLM_ENVIRONMENT: LiteLLM's Router refuses to build. config check and
    run build it and load refuses it first (serve too), so all three say so with exit status 2, and nothing is
    sent."""
    cfg = _write(tmp_path / "team.yaml", {"model_list": [{
        "model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "k",
                                                "api_base": upstream.v1_url},
        "model_info": {"supported_environments": ["production"]}}]})
    src = tmp_path / "in.jsonl"
    src.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "gpt", '
                   '"messages": [{"role": "user", "content": "hi"}]}}\n')
    os.environ.pop("LITELLM_ENVIRONMENT", None)
    before = upstream.stats()["requests"]
    for args in (["config", "check", str(cfg)], ["run", "-i", str(src), "-o", str(tmp_path / "o"), "--config",
                                                 str(cfg)],
                 ["serve", "--config", str(cfg), "--data-dir", str(tmp_path / "data"), "--port", "9"]):
        proc = batchyard(capsys, *args, cwd=REPO)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "model_list[0].model_info.supported_environments: set, but LITELLM_ENVIRONMENT is not" in proc.stderr
    assert upstream.stats()["requests"] == before and not (tmp_path / "o").exists()
    proc = batchyard(capsys, "config", "check", str(cfg), env={"LITELLM_ENVIRONMENT": "production"}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    # what only LiteLLM's Router refuses, config check, run and serve refuse alike: they build the same Router
    # (serve in a child process before it listens, not in workers that would exit and be restarted)
    _write(cfg, {"model_list": [{"model_name": "gpt", "litellm_params": {
        "model": "openai/gpt-4o-mini", "api_key": "k", "api_base": upstream.v1_url}}],
        "router_settings": {"cooldown_time": True}})
    for args in (["config", "check", str(cfg)], ["run", "-i", str(src), "-o", str(tmp_path / "o"), "--config",
                                                 str(cfg)],
                 ["serve", "--config", str(cfg), "--data-dir", str(tmp_path / "data"), "--port", "9"]):
        proc = batchyard(capsys, *args, cwd=REPO)
        assert proc.returncode == 2, (args, proc.stderr)
        assert ("model_list, router_settings: LiteLLM's Router refuses them: TypeError: Router cooldown_time must "
                "be a number of seconds, not a bool") in proc.stderr
    assert upstream.stats()["requests"] == before and not (tmp_path / "o").exists()
