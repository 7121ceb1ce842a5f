"""The name a wildcard route takes from a line is a name: the checks of gateway.config.model_names, the patterns
refused at load, a deployment name as one URL path segment, and the per-model caches' bounds."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.model_names import MAX_NAME_CHARS, name_problem, path_segment, slash_allowed
from gateway.config.schema import parse_config
from gateway.config.wildcards import RESOLVED_KEPT, pattern_refusal
from gateway.domain import Endpoint
from gateway.errors import ConfigError


@pytest.mark.parametrize("name", ["gpt-4o", "gpt-4o-mini-2024-07-18", "ft:gpt-4o-mini:my-org:custom_suffix:9aB",
                                  "claude-3-5-sonnet@20240620", "my_deployment.v2", "o1+x=y~z,1"])
def test_names_every_provider_uses_pass(name: str) -> None:
    assert name_problem(name, slash=False) is None


@pytest.mark.parametrize(("name", "why"), [
    ("", "empty"), ("..", "'..'"), (".", "'.'"), ("a/../b", "'/'"), ("gpt#", "'#'"), ("gpt?x=1", "'?'"),
    ("%2e%2e", "'%'"), ("a\\b", "'\\\\'"), ("a b", "' '"), ("a\r\nb", "'\\r'"), ("a\x1b[31m", "'\\x1b'"),
    ("a\u202eb", "'\\u202e'"), ("x" * (MAX_NAME_CHARS + 1), "the limit is 256"),
])
def test_paths_queries_fragments_controls_and_long_names_are_refused(name: str, why: str) -> None:
    problem = name_problem(name, slash=False)
    assert problem is not None and why in problem, problem


@pytest.mark.parametrize(("name", "ok"), [("meta-llama/Llama-3.1-8B", True), ("a//b", False), ("a/./b", False),
                                          ("a/../b", False), ("/a", False), ("a/", False)])
def test_a_slash_only_where_the_provider_holds_one_and_never_an_empty_or_dot_segment(name: str, ok: bool) -> None:
    assert (name_problem(name, slash=True) is None) is ok


def test_which_providers_names_hold_a_slash() -> None:
    assert not slash_allowed("azure", "https://x.openai.azure.com")
    assert not slash_allowed("openai", None) and not slash_allowed("openai", "https://api.openai.com/v1")
    assert slash_allowed("openai", "http://127.0.0.1:8000/v1")  # an OpenAI-compatible server (a vLLM)
    assert slash_allowed("hosted_vllm", "http://vllm:8000") and slash_allowed("bedrock", None)
    assert not slash_allowed("anthropic", None) and not slash_allowed("gemini", None)


def test_a_name_is_one_percent_encoded_path_segment() -> None:
    assert path_segment("gpt-4o") == "gpt-4o"
    assert path_segment("a/../b?c#d%e f") == "a%2F..%2Fb%3Fc%23d%25e%20f"


@pytest.mark.parametrize(("pattern", "model", "refused"), [
    ("*gpt*", "openai/gpt*", "more '*'"),  # LiteLLM would send the line's text as written, provider and all
    ("*", "*", "whose provider"),
    ("x/*", "*-mini", "whose provider"),
    ("*", "openai/*", None), ("openai/*", "openai/*", None), ("*-mini", "openai/*-mini", None),
    ("p/*", "openai/fixed", None),
])
def test_patterns_whose_line_could_choose_the_provider_are_refused(pattern: str, model: str,
                                                                   refused: str | None) -> None:
    why = pattern_refusal(pattern, model)
    assert (why is None) if refused is None else (why is not None and refused in why and repr(pattern) in why)


def _entry(name: str, model: str, **info: Any) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": model, "api_key": "k"}, "model_info": info}


def test_the_config_names_the_refused_pattern_and_allow_unpriced_only_on_a_wildcard() -> None:
    with pytest.raises(ConfigError, match=r"model_list\[1\]\.litellm_params\.model.*wildcard '\*gpt\*'"):
        parse_config({"model_list": [_entry("x", "openai/x"), _entry("*gpt*", "openai/gpt*")]})
    with pytest.raises(ConfigError, match=r"model_list\[0\]\.model_info\.allow_unpriced.*not a wildcard"):
        parse_config({"model_list": [_entry("x", "openai/x", allow_unpriced=True)]})
    config = parse_config({"model_list": [_entry("openai/*", "openai/*", allow_unpriced=True)]})
    assert config.routes["openai/*"].model_info.allow_unpriced


def test_a_concrete_model_is_a_name_of_the_routes_provider_or_no_route_with_the_reason() -> None:
    config = parse_config({"model_list": [_entry("azure/*", "azure/*"), _entry("*", "openai/*"),
                                          _entry("exact", "openai/x")]})
    route = config.route("azure/my-deployment")
    assert route is not None and route.entries[0].litellm_params.model == "azure/my-deployment"
    for walk in ("azure/gpt-4o/../o1#", "azure/a/.", "azure/%2e%2e", "azure/x?y"):
        assert config.route(walk) is None
        assert "refuses it: not a model name of provider azure" in (config.resolver.refusal(walk) or "")
    # another provider's prefix on `*` -> `openai/*`: the provider stays openai (whose public names hold no /)
    assert config.route("anthropic/mini-x") is None
    assert "'/'" in (config.resolver.refusal("anthropic/mini-x") or "")
    plain = config.route("gpt-4o")  # a plain name: the route's provider, never a ValueError
    assert plain is not None and plain.entries[0].litellm_params.model == "openai/gpt-4o"


def test_the_resolvers_cache_is_bounded() -> None:
    config = parse_config({"model_list": [_entry("openai/*", "openai/*")]})
    for i in range(RESOLVED_KEPT + 500):
        assert config.route(f"openai/m{i}") is not None
    assert len(config.resolver._cache) == RESOLVED_KEPT


def test_metrics_label_a_wildcards_models_by_the_pattern_unless_the_config_names_them() -> None:
    team = {"team_id": "t", "api_keys": ["k"], "models": ["openai/*", "openai/listed"]}
    config = parse_config({"model_list": [_entry("openai/*", "openai/*"), _entry("exact", "openai/x")],
                           "batch_settings": {"teams": [team]}})
    assert [config.metric_route(n) for n in ("openai/any", "openai/listed", "exact", "openai/*")] == [
        "openai/*", "openai/listed", "exact", "openai/*"]


def test_the_pass_throughs_azure_url_holds_the_name_as_one_segment_and_its_targets_are_bounded() -> None:
    from providers.passthrough import TARGETS_KEPT, PassThrough, _Target

    target = _Target(id="d", provider="azure", model="a/../b#c", base="https://r.openai.azure.com", headers={},
                     api_version="2024-10-21", timeout=1.0, num_retries=0, has_limits=False)
    assert target.url(Endpoint.CHAT) == ("https://r.openai.azure.com/openai/deployments/a%2F..%2Fb%23c/chat/"
                                         "completions?api-version=2024-10-21")

    class Router:
        num_retries = 0
        timeout = 1

    wire = PassThrough(Router(), 4)
    deployment = {"model_name": "azure/*", "model_info": {"id": "d"},
                  "litellm_params": {"model": "azure/*", "api_base": "https://r.openai.azure.com", "api_key": "k"}}
    assert "'#'" in str(wire.target(deployment, "azure/*", "azure/x#y"))  # a reason, never a target or a raise
    plain = {**deployment, "litellm_params": {**deployment["litellm_params"], "model": "gpt-4o"}}
    assert "provider" in str(wire._new_target("d", plain, "gpt-4o"))  # no `provider/`: a reason, no ValueError
    for i in range(TARGETS_KEPT + 100):
        assert not isinstance(wire.target(deployment, "azure/*", f"azure/m{i}"), str)
    assert len(wire._targets) == TARGETS_KEPT
