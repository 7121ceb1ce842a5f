"""A line's `model` selects a model on a wildcard route, and nothing else; no line an upstream answers is free.

Against a real `batchyard serve` and the recording loopback upstream (it answers 401 to any key but the
operator's and counts every path and model it is asked for), one test per finding of issue 45:

- the Azure deployment walk (`..`, `%2e%2e`, `?`, `#`, `/.`, control characters, over-long names): refused at
  validation with `model_not_found` and the reason, nothing sent; a real name is one encoded path segment;
- a pattern that lets the line choose the provider (`"*gpt*"` -> `openai/gpt*`) is refused at load naming it;
  on `*` -> `openai/*` another provider's prefix stays a name at the route's provider, and a plain name runs;
- a concrete model is priced by its own price (the config's, then LiteLLM's map), else the pattern's; with
  none, a team with a budget gets `price_unknown` unless the route sets `allow_unpriced`;
- distinct concrete models per batch and per route are bounded at validation, and `/metrics` labels a
  wildcard route by its pattern whatever models lines name;
- a reply's reported `service_tier` is the tier billed, asked or not; a tier with no known price is billed at
  the highest known price and counted.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes.upstream.server import Upstream, start_upstream
from tests.support.server_helpers import (
    API_VERSION,
    REPO_ROOT,
    Gateway,
    chat_line,
    read_jsonl,
    start_gateway,
    submit,
    wait_batch,
)
from tests.support.team_helpers import metric

KEY = "sk-operator-0000"
TEAMS = {"research": "sk-research-0000", "tiers": "sk-tiers-0000", "wide": "sk-wide-0000"}
PATTERN_PRICE = (2e-6, 4e-6)  # cheap/*'s model_info prices
OWN_PRICE = (5e-6, 7e-6)  # the config's price of openai/priced-x (a named route sending that model)
BASE, PRIORITY = (1e-3, 2e-3), (4e-3, 8e-3)  # gpt-tier's prices, base and priority


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with start_upstream(api_key=KEY) as server:
        yield server


def _config(up: Upstream) -> dict[str, Any]:
    openai = {"api_base": up.v1_url, "api_key": KEY}
    return {
        "model_list": [
            {"model_name": "azure/gpt-4o*", "litellm_params": {"model": "azure/gpt-4o*", "api_base": up.url,
                                                                "api_key": KEY, "api_version": API_VERSION}},
            {"model_name": "openai/*", "litellm_params": {"model": "openai/*", **openai}},
            {"model_name": "cheap/*", "litellm_params": {"model": "openai/*", **openai},
             "model_info": {"input_cost_per_token": PATTERN_PRICE[0], "output_cost_per_token": PATTERN_PRICE[1]}},
            {"model_name": "free/*", "litellm_params": {"model": "openai/*", **openai},
             "model_info": {"allow_unpriced": True}},
            {"model_name": "*", "litellm_params": {"model": "openai/*", **openai}},
            # max_parallel_requests keeps this one on LiteLLM's completion path (not the pass-through)
            {"model_name": "lite/*", "litellm_params": {"model": "openai/*", "max_parallel_requests": 8, **openai}},
            {"model_name": "gpt-priced", "litellm_params": {"model": "openai/priced-x", **openai},
             "model_info": {"input_cost_per_token": OWN_PRICE[0], "output_cost_per_token": OWN_PRICE[1]}},
            {"model_name": "gpt-tier", "litellm_params": {"model": "openai/tier-x", **openai},
             "model_info": {"input_cost_per_token": BASE[0], "output_cost_per_token": BASE[1],
                            "input_cost_per_token_priority": PRIORITY[0],
                            "output_cost_per_token_priority": PRIORITY[1]}},
        ],
        "router_settings": {"num_retries": 0, "timeout": 30},
        "general_settings": {"master_key": "sk-admin"},
        "batch_settings": {
            "max_wildcard_models": 8, "max_wildcard_models_per_route": 3,
            "teams": [
                {"team_id": "research", "api_keys": [TEAMS["research"]], "max_budget": 100.0,
                 "models": ["azure/gpt-4o*", "openai/*", "cheap/*", "free/*", "*", "lite/*", "gpt-priced"]},
                {"team_id": "tiers", "api_keys": [TEAMS["tiers"]], "max_budget": 100.0, "models": ["gpt-tier"]},
                {"team_id": "wide", "api_keys": [TEAMS["wide"]], "models": ["openai/*", "cheap/*", "*", "lite/*"]},
            ],
        },
    }


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with start_gateway(_config(upstream), tmp_path_factory.mktemp("gw") / "data") as gateway:
        yield gateway
        log = gateway.log()
    assert KEY not in log, "the operator's key was logged"


def _run(gw: Gateway, team: str, lines: list[dict[str, Any]]) -> tuple[Any, dict[str, dict[str, Any]]]:
    client = gw.client(TEAMS[team])
    batch = wait_batch(client, submit(client, lines).id, timeout=120)
    written = read_jsonl(client, batch.output_file_id) + read_jsonl(client, batch.error_file_id)
    return batch, {r["custom_id"]: r for r in written}


def _errors(batch: Any) -> dict[int, Any]:
    assert batch.status == "failed", batch
    return {e.line: e for e in batch.errors.data}


WALKS = [
    "azure/gpt-4o/../o1-pro-secret#",  # the reported walk: `..` resolved, `#` cut the api-version
    "azure/gpt-4o%2e%2e%2fo1-pro-secret",
    "azure/gpt-4o-mini?api-version=x",
    "azure/gpt-4o-mini#",
    "azure/gpt-4o/.",
    "azure/gpt-4o\r\nx",
    "azure/gpt-4o\u202e",
    "azure/gpt-4o" + "x" * 300,
]


def test_a_line_cannot_walk_the_azure_deployment_path(gw: Gateway, upstream: Upstream) -> None:
    before = dict(upstream.stats()["by_path"])
    batch, _ = _run(gw, "research", [chat_line(f"walk-{i}", model, "hi") for i, model in enumerate(WALKS)])
    errors = _errors(batch)
    assert sorted(errors) == list(range(1, len(WALKS) + 1))
    for line, model in enumerate(WALKS, start=1):
        error = errors[line]
        assert (error.code, error.param) == ("model_not_found", "body.model"), error
        assert model[:20] in error.message  # the line's model, named
        assert "refuses it" in error.message and "azure" in error.message, error.message
    assert "'#'" in errors[1].message and "'%'" in errors[2].message and "'?'" in errors[3].message
    assert "'/'" in errors[5].message and "'\\r'" in errors[6].message
    assert "characters; the limit is 256" in errors[len(WALKS)].message
    assert dict(upstream.stats()["by_path"]) == before, "a refused line reached the upstream"

    # a real name is answered at its own deployment, the key and api-version with it, and priced (map price)
    batch, out = _run(gw, "research", [chat_line("real", "azure/gpt-4o-mini", "hi")])
    assert batch.status == "completed" and out["real"]["response"]["status_code"] == 200, out
    assert upstream.stats()["by_path"].get("/openai/deployments/gpt-4o-mini/chat/completions") == 1


def test_a_pattern_that_lets_the_line_choose_the_provider_is_refused_at_load(tmp_path: Path) -> None:
    # LiteLLM's documented `"*gpt*"` -> `openai/gpt*`: two `*` in, one out, so LiteLLM sends the line's text
    config = {"model_list": [{"model_name": "*gpt*", "litellm_params": {"model": "openai/gpt*", "api_key": KEY}}]}
    for name, params in (("*gpt*", {"model": "openai/gpt*"}), ("*", {"model": "*"})):
        config["model_list"][0] = {"model_name": name, "litellm_params": {**params, "api_key": KEY}}
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port", "0",
                               "--data-dir", str(tmp_path / "data")], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0, done
        text = done.stdout + done.stderr
        assert f"wildcard {name!r}" in text and "model_list[0].litellm_params.model" in text, text
        assert "Traceback" not in text


def test_another_providers_prefix_stays_a_name_and_a_plain_name_runs(gw: Gateway, upstream: Upstream) -> None:
    """`*` -> `openai/*`: the provider, key and URL are the route's; `gpt-4o` plain (a ValueError before)."""
    before = upstream.stats()
    lines = [chat_line("plain", "gpt-4o", "hi"), chat_line("prefixed", "openai/gpt-4o", "hi"),
             chat_line("anthropic", "anthropic/mini-x", "hi"), chat_line("litellm", "lite/anthropic/mini-x", "hi")]
    batch, out = _run(gw, "wide", lines)
    assert batch.status == "completed", batch
    answered = {cid: out[cid]["response"] for cid in ("plain", "prefixed", "anthropic", "litellm")}
    assert all(r["status_code"] == 200 for r in answered.values()), answered
    # the OpenAI-compatible server of the route was asked, with its key, for a model named as the line wrote;
    # through LiteLLM's completion path too (which once sent such a line to Anthropic's /v1/messages)
    assert [answered[c]["body"]["model"] for c in answered] == ["gpt-4o", "gpt-4o", "anthropic/mini-x",
                                                                "anthropic/mini-x"]
    # a walk through the same route: refused (`#`, `..`), nothing sent
    errors = _errors(_run(gw, "wide", [chat_line("steal", "azure/gpt/../../../steal#", "hi")])[0])
    assert errors[1].code == "model_not_found" and "'#'" in errors[1].message, errors
    after = upstream.stats()
    assert after["by_path"].get("/v1/chat/completions", 0) - before["by_path"].get("/v1/chat/completions", 0) == 4
    assert not any("messages" in p or "steal" in p for p in after["by_path"]), after["by_path"]
    assert after["by_status"].get("401", 0) == before["by_status"].get("401", 0)  # every call had the key


def test_a_concrete_model_is_priced_and_an_unpriced_one_is_refused_under_a_budget(
    gw: Gateway, upstream: Upstream,
) -> None:
    import litellm

    mapped = litellm.model_cost["gpt-4o-mini"]
    spent = metric(gw, "batchyard_team_spend_usd", team="research") or 0.0
    before = dict(upstream.stats()["by_model"])
    lines = [chat_line("own", "openai/priced-x", "a b c"),  # the config prices this model by name
             chat_line("map", "openai/gpt-4o-mini", "a b c"),  # LiteLLM's price map
             chat_line("pattern", "cheap/unknown-zzz", "a b c"),  # the pattern's model_info
             chat_line("unpriced", "openai/unknown-zzz", "a b c"),  # none: refused, never sent
             chat_line("allowed", "free/unknown-zzz", "a b c"),  # none, but the route allows it
             chat_line("litellm", "lite/gpt-4o-mini", "a b c"),  # the map's, on LiteLLM's completion path
             chat_line("litellm-unpriced", "lite/unknown-zzz", "a b c")]
    batch, out = _run(gw, "research", lines)
    assert batch.status == "completed", batch
    refused = out["unpriced"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["code"] == "price_unknown", refused
    assert "allow_unpriced" in refused["body"]["error"]["message"]
    assert out["litellm-unpriced"]["response"]["body"]["error"]["code"] == "price_unknown"
    after = upstream.stats()["by_model"]
    assert after.get("unknown-zzz", 0) - before.get("unknown-zzz", 0) == 2  # pattern and allowed, not unpriced

    def cost(cid: str, prices: tuple[float, float]) -> float:
        usage = out[cid]["response"]["body"]["usage"]
        return usage["prompt_tokens"] * prices[0] + usage["completion_tokens"] * prices[1]

    expected = (cost("own", OWN_PRICE) + cost("pattern", PATTERN_PRICE)
                + cost("map", (mapped["input_cost_per_token"], mapped["output_cost_per_token"]))
                + cost("litellm", (mapped["input_cost_per_token"], mapped["output_cost_per_token"])))
    assert expected > 0
    assert metric(gw, "batchyard_team_spend_usd", team="research") == pytest.approx(spent + expected, rel=1e-6)


def test_wildcard_models_are_bounded_per_batch_and_per_route_and_metrics_by_pattern(gw: Gateway) -> None:
    per_route = [chat_line(f"r{i}", f"openai/model-{i}", "hi") for i in range(4)]
    errors = _errors(_run(gw, "wide", per_route)[0])
    assert len(errors) == 1 and errors[4].code == "invalid_request", errors
    assert "batch_settings.max_wildcard_models_per_route" in errors[4].message and "'openai/*'" in errors[4].message
    total = [chat_line(f"{p}{i}", f"{p}/model-{i}", "hi") for p in ("openai", "cheap", "lite") for i in range(3)]
    errors = _errors(_run(gw, "wide", total)[0])
    assert len(errors) == 1 and "batch_settings.max_wildcard_models)" in errors[9].message, errors

    batch, _ = _run(gw, "wide", [chat_line(f"m{i}", f"openai/metric-{i}", "hi") for i in range(3)])
    assert batch.status == "completed", batch
    text = httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer sk-admin"}, timeout=10).text
    assert metric(gw, "batchyard_requests_total", team="wide", route="openai/*", status="200") is not None
    assert "metric-0" not in text and "model-0" not in text  # no series per model a line named


def test_the_tier_the_reply_reports_is_the_tier_billed(gw: Gateway) -> None:
    lines = [chat_line("priority", "gpt-tier", "a b c #tier:priority"),  # asked for none, ran at priority
             chat_line("unknown", "gpt-tier", "a b c #tier:turbo"),  # a tier no price is known for
             chat_line("default", "gpt-tier", "a b c #tier:default")]  # the base price
    batch, out = _run(gw, "tiers", lines)
    assert batch.status == "completed", batch

    def cost(cid: str, prices: tuple[float, float]) -> float:
        usage = out[cid]["response"]["body"]["usage"]
        return usage["prompt_tokens"] * prices[0] + usage["completion_tokens"] * prices[1]

    expected = cost("priority", PRIORITY) + cost("unknown", PRIORITY) + cost("default", BASE)
    assert metric(gw, "batchyard_team_spend_usd", team="tiers") == pytest.approx(expected, rel=1e-6)
    assert metric(gw, "batchyard_unpriced_tier_replies_total", route="gpt-tier") == 1
