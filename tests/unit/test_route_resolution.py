"""Routes as LiteLLM resolves them, at load: what is refused, naming the key, and what a name resolves to.

The end-to-end side (batches answered through each route) is tests/servers/test_litellm_routes.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.schema import parse_config
from gateway.errors import ConfigError

UP = {"api_key": "sk-test", "api_base": "http://127.0.0.1:9/v1"}


def entry(name: str, model: str, **extra: Any) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": model, **UP}, **extra}


def refused(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "c.yaml")
    return caught.value


def test_an_unknown_prefix_less_model_is_refused_as_before() -> None:
    error = refused({"model_list": [entry("m", "no-such-model-anywhere")]})
    assert error.key == "model_list[0].litellm_params.model"
    assert "'no-such-model-anywhere' names no provider; write provider/model" in str(error)


def test_a_known_prefix_less_model_gets_litellms_provider() -> None:
    config = parse_config({"model_list": [entry("m", "gpt-4o-mini"), entry("c", "claude-sonnet-4-20250514")]})
    assert config.routes["m"].entries[0].litellm_params.model == "openai/gpt-4o-mini"
    assert config.routes["c"].entries[0].litellm_params.model == "anthropic/claude-sonnet-4-20250514"


def test_local_and_native_routes_cannot_be_wildcards() -> None:
    local = refused({"model_list": [{"model_name": "local/*", "litellm_params": {"model": "vllm/some/model"}}]})
    assert local.key == "model_list[0].model_name" and "local (vllm/) model cannot be one" in str(local)
    native = refused({"model_list": [entry("openai/*", "openai/*", model_info={"batch_mode": "native"})]})
    assert native.key == "model_list[0].model_name" and "native" in str(native)


@pytest.mark.parametrize("key", ["fallbacks", "context_window_fallbacks", "content_policy_fallbacks"])
def test_fallbacks_a_local_or_native_route_cannot_honour_are_refused_naming_both(key: str) -> None:
    models = [entry("up", "openai/gpt-4o-mini"), {"model_name": "here", "litellm_params": {"model": "vllm/m"}},
              entry("jobs", "openai/gpt-4o-mini", model_info={"batch_mode": "native"})]
    to_local = refused({"model_list": models, "router_settings": {key: [{"up": ["here"]}]}})
    assert to_local.key == f"router_settings.{key}.up"
    assert "'up' -> 'here'" in str(to_local) and "'here' is a local route" in str(to_local)
    from_native = refused({"model_list": models, "router_settings": {key: [{"jobs": ["up"]}]}})
    assert "'jobs' -> 'up'" in str(from_native) and "'jobs' is a native route" in str(from_native)
    ok = parse_config({"model_list": models, "router_settings": {key: [{"up": ["up2"]}]}})  # upstream only: fine
    assert ok.router_settings[key] == [{"up": ["up2"]}]


def test_aliases_must_name_a_route() -> None:
    models = [entry("target", "openai/gpt-4o-mini")]
    error = refused({"model_list": models, "router_settings": {"model_group_alias": {"a": "nowhere"}}})
    assert error.key == "router_settings.model_group_alias.a" and "'nowhere' is not a model_name" in str(error)
    typo = refused({"model_list": models, "router_settings": {"model_group_alias": {"a": {"model": "target",
                                                                                           "hiden": True}}}})
    assert typo.key == "router_settings.model_group_alias.a.hiden"


def test_tpm_rpm_and_max_parallel_requests_beside_litellm_params() -> None:
    config = parse_config({"model_list": [entry("m", "openai/x", tpm=100, rpm=5, max_parallel_requests=2)]})
    [deployment] = config.routes["m"].model_list()
    assert deployment["tpm"] == 100 and deployment["rpm"] == 5
    assert deployment["litellm_params"]["max_parallel_requests"] == 2  # where the Router reads it
    local = refused({"model_list": [{"model_name": "l", "litellm_params": {"model": "vllm/m"}, "tpm": 5}]})
    assert local.key == "model_list[0].tpm"  # a local engine has no deployment limits of LiteLLM's


def test_teams_may_name_patterns_and_models_a_wildcard_serves() -> None:
    models = [entry("*", "openai/*"), entry("exact", "openai/x")]
    team = {"team_id": "t", "api_keys": ["k"], "models": ["openai/gpt-4*", "gpt-4o", "*"],
            "model_rpm_limit": {"gpt-4o": 5}}
    config = parse_config({"model_list": models, "batch_settings": {"teams": [team]}})
    assert config.batch.teams[0].models == ["openai/gpt-4*", "gpt-4o", "*"]
    bad = dict(team, model_rpm_limit={"*": 5})
    error = refused({"model_list": models, "batch_settings": {"teams": [bad]}})
    assert "limits are per model" in str(error)


def test_resolution_is_cached_per_model() -> None:
    config = parse_config({"model_list": [entry("*", "openai/*"), entry("openai/gpt-4*", "openai/gpt-4*")],
                           "router_settings": {"model_group_alias": {"latest": "openai/gpt-4*"}}})
    first = config.route("gpt-4o")
    assert first is not None and first is config.route("gpt-4o")
    assert (first.model_name, first.declared, first.entries[0].litellm_params.model) == ("gpt-4o", "*",
                                                                                       "openai/gpt-4o")
    pattern = config.route("openai/gpt-4.1")
    assert pattern is not None and pattern.declared == "openai/gpt-4*"
    assert pattern.entries[0].litellm_params.model == "openai/gpt-4.1"
    assert config.routes["*"].entries[0].litellm_params.model == "openai/*"  # the declared route is untouched
    assert config.listed_models() == ["*", "latest", "openai/gpt-4*"]


def test_a_teams_pattern_lets_its_lines_through_and_no_others() -> None:
    import json

    from gateway.domain import BatchRequest
    from gateway.pipeline.validate import LineChecker

    config = parse_config({"model_list": [entry("*", "openai/*"), entry("exact", "openai/x")],
                           "router_settings": {"model_group_alias": {"nick": "exact"}}})

    def checked(allowed: list[str], model: str) -> object:
        line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}})
        return LineChecker(config, endpoint=None, allowed_models=allowed).check(line.encode(), 1)

    assert isinstance(checked(["openai/gpt-4*"], "openai/gpt-4.1"), BatchRequest)  # a pattern in the team's list
    assert isinstance(checked(["*"], "anything-at-all"), BatchRequest)  # the wildcard route by its name
    assert isinstance(checked(["exact"], "nick"), BatchRequest)  # an alias of a model the team may use
    for allowed, model in ((["openai/gpt-4*"], "claude-3"), (["exact"], "gpt-4o")):
        refused_line = checked(allowed, model)
        assert not isinstance(refused_line, BatchRequest)
        assert "does not exist or is not supported" in str(refused_line)


@pytest.mark.parametrize(("pattern", "deployment", "model"), [
    ("wild/*", "openai/*", "wild/w3"),
    ("*", "openai/*", "gpt-4o"),
    ("openai/*", "openai/*", "gpt-4o"),  # no prefix: LiteLLM tries `openai/gpt-4o` next
    ("openai/fo::*:static::*", "openai/fo::*:static::*", "openai/fo::bar:static::baz"),
    ("p/*", "openai/fixed", "p/anything"),
])
def test_the_pass_throughs_concrete_model_is_the_one_litellms_router_sets(pattern: str, deployment: str,
                                                                          model: str) -> None:
    # The pass-through asks the Router by the pattern and fills the `*`s itself (gateway.config.wildcards):
    # the model it sends is the one LiteLLM's own pattern router puts in the deployment it hands out.
    from litellm.litellm_core_utils.pattern_match_deployments import PatternMatchRouter

    from gateway.config.wildcards import pattern_model

    router = PatternMatchRouter()
    router.add_pattern(pattern, {"model_name": pattern, "litellm_params": {"model": deployment}})
    found = router.get_deployments_by_pattern(model)  # what the Router does asked by the concrete name
    assert found
    assert pattern_model(pattern, deployment, model) == found[0]["litellm_params"]["model"]
