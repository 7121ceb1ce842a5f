"""The one pricing module: per-token prices from the config, at batch rates, and what a usage costs at them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config.prices import DeploymentPrices, Prices, batch_prices, cost_of, realtime_prices, route_prices
from gateway.domain import Usage

USAGE = Usage(input_tokens=1000, output_tokens=100)


@pytest.mark.parametrize(("info", "expected"), [
    ({}, None),
    ({"input_cost_per_token": 1e-6}, Prices(1e-6, 0.0)),
    ({"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}, Prices(1e-6, 2e-6)),
])
def test_a_routes_prices_are_its_model_info(info: dict[str, Any], expected: Prices | None) -> None:
    assert route_prices(info) == expected


MAP = {"gpt-x": {"input_cost_per_token": 4e-6, "output_cost_per_token": 8e-6},
       "gpt-b": {"input_cost_per_token_batches": 1e-6, "output_cost_per_token_batches": 3e-6}}


@pytest.mark.parametrize(("info", "candidates", "expected"), [
    ({}, ["gpt-x"], Prices(2e-6, 4e-6)),  # the price map's, halved: the batch discount
    ({}, ["gpt-b"], Prices(1e-6, 3e-6)),  # the map's batch rates, as they are
    ({"input_cost_per_token": 2e-6}, ["gpt-x"], Prices(1e-6, 0.0)),  # the config first
    ({"input_cost_per_token_batches": 5e-6}, ["gpt-x"], Prices(5e-6, 0.0)),
    ({}, ["", "unknown"], None),
])
def test_batch_prices(info: dict[str, Any], candidates: list[str], expected: Prices | None) -> None:
    assert batch_prices(info, MAP, candidates) == expected


def test_the_prompt_cache_has_prices_of_its_own() -> None:
    """Where a source prices cache reads and writes, a batch pays them at the batch discount, and a usage's reads
    and writes cost those prices rather than the input's."""
    info = {"input_cost_per_token": 1e-6, "output_cost_per_token": 5e-6, "cache_read_input_token_cost": 1e-7,
            "cache_creation_input_token_cost": 1.25e-6}
    assert batch_prices(info, {}, []) == Prices(5e-7, 2.5e-6, 5e-8, 6.25e-7)
    assert realtime_prices(info, {}, []) == Prices(1e-6, 5e-6, 1e-7, 1.25e-6)
    mapped = {"claude-z": {**info, "input_cost_per_token_batches": 4e-7, "cache_read_input_token_cost_batches": 3e-8}}
    assert batch_prices({}, mapped, ["claude-z"]) == Prices(4e-7, 0.0, 3e-8, None)
    usage = Usage(input_tokens=1000, output_tokens=10, cached_tokens=600, cache_write_tokens=300)
    assert realtime_prices(info, {}, []).cost(usage) == pytest.approx(  # type: ignore[union-attr]
        100 * 1e-6 + 600 * 1e-7 + 300 * 1.25e-6 + 10 * 5e-6)
    assert Prices(1e-6, 5e-6).cost(usage) == pytest.approx(1000 * 1e-6 + 10 * 5e-6)  # no cache prices: input


def test_what_a_usage_costs() -> None:
    assert cost_of(USAGE, None) is None
    assert cost_of(USAGE, Prices(1e-6, 2e-6)) == pytest.approx(1000 * 1e-6 + 100 * 2e-6)


def test_a_deployments_configured_prices_win_and_only_numbers_count() -> None:
    prices = DeploymentPrices([
        {"model_info": {"id": "a", "input_cost_per_token": 1e-6}, "litellm_params": {"output_cost_per_token": 3e-6}},
        {"model_info": {"id": "b", "input_cost_per_token": "1e-6"}, "litellm_params": {"model": "nowhere/none"}},
    ])
    assert prices.prices("a") == Prices(1e-6, 3e-6)
    assert prices.prices("b") is None  # a string is no price, and the price map has none for it
    assert prices.for_deployment("a", {"usage": {"prompt_tokens": 1000, "completion_tokens": 100}}) == (
        pytest.approx(1000 * 1e-6 + 100 * 3e-6))


def test_anthropic_usage_counts_as_openai_counts_it() -> None:
    """An Anthropic `message`'s usage leaves cache reads and writes out of `input_tokens`: they count as input
    (the reads also as cached), so a budget and a tpm limit see every prompt token."""
    body = {"type": "message", "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 100,
                                         "cache_creation_input_tokens": 5}}
    assert Usage.read(body) == (Usage(input_tokens=115, output_tokens=7, cached_tokens=100, cache_write_tokens=5),
                                False)
    # LiteLLM's chat translation of it: `prompt_tokens` holds both counts already, named beside it again
    chat = {"usage": {"prompt_tokens": 115, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 100},
                      "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5}}
    assert Usage.read(chat) == Usage.read(body)
    assert Usage.read({"usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": None}}) == (
        Usage(input_tokens=3, output_tokens=4), False)
    assert Usage.read({"usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": -1}})[1]


def test_an_adapter_replys_deployment_prices_it() -> None:
    """LiteLLM's Anthropic-messages adapter answers a dict with `_hidden_params` in it: the deployment it names
    is the one whose prices apply."""
    prices = DeploymentPrices([{"model_name": "m", "litellm_params": {"model": "openai/x"},
                                "model_info": {"id": "d1", "input_cost_per_token": 0.5,
                                               "output_cost_per_token": 1.0}}])
    body = {"type": "message", "usage": {"input_tokens": 2, "output_tokens": 3}}
    assert prices.cost({**body, "_hidden_params": {"model_id": "d1"}}, body) == 4.0


REPLY = {"usage": {"prompt_tokens": 1000, "completion_tokens": 100}}


def test_a_wildcards_concrete_model_is_priced_by_its_own_price_then_the_patterns() -> None:
    prices = DeploymentPrices([
        {"model_name": "openai/*", "litellm_params": {"model": "openai/*"},
         "model_info": {"id": "w", "input_cost_per_token": 9e-6, "output_cost_per_token": 9e-6}},
        {"model_name": "named", "litellm_params": {"model": "openai/priced-x"},
         "model_info": {"id": "n", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}},
        {"model_name": "bare/*", "litellm_params": {"model": "openai/*"}, "model_info": {"id": "b"}},
    ])
    import litellm

    mapped = litellm.model_cost["gpt-4o-mini"]
    assert prices.prices("w", "openai/priced-x") == Prices(1e-6, 2e-6)  # the config's price of that model
    assert prices.prices("w", "openai/gpt-4o-mini") == Prices(mapped["input_cost_per_token"],
                                                              mapped["output_cost_per_token"])  # the map's
    assert prices.prices("w", "openai/unknown-zzz") == Prices(9e-6, 9e-6)  # the pattern's model_info
    assert prices.prices("b", "openai/unknown-zzz") is None
    assert not prices.priced_for("bare/*", "bare/unknown-zzz") and prices.priced_for("bare/*", "bare/gpt-4o-mini")


def test_the_reported_tier_is_billed_and_an_unknown_one_at_the_highest_price() -> None:
    told: list[tuple[str, str]] = []
    prices = DeploymentPrices([{"model_name": "m", "litellm_params": {"model": "openai/nowhere-x"},
                                "model_info": {"id": "d", "input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6,
                                               "input_cost_per_token_priority": 4e-6,
                                               "output_cost_per_token_priority": 8e-6,
                                               "input_cost_per_token_batches": 5e-7}}])
    prices.on_unpriced_tier = lambda group, tier: told.append((group, tier))
    base, priority = 1000 * 1e-6 + 100 * 2e-6, 1000 * 4e-6 + 100 * 8e-6
    assert prices.for_deployment("d", REPLY) == pytest.approx(base)
    assert prices.for_deployment("d", {**REPLY, "service_tier": "default"}) == pytest.approx(base)
    assert prices.for_deployment("d", {**REPLY, "service_tier": "priority"}) == pytest.approx(priority)  # unasked
    assert told == []
    for tier in ("turbo", "batches", "x" * 40):  # unknown, a price key that is no tier, a nonsense one
        assert prices.for_deployment("d", {**REPLY, "service_tier": tier}) == pytest.approx(priority)
    assert [t for _, t in told] == ["turbo", "batches", "x" * 40] and {g for g, _ in told} == {"m"}


def test_the_price_map_read_from_the_wheel_is_litellm_s() -> None:
    """`price_map` reads LiteLLM's shipped file without importing LiteLLM; it holds what `litellm.model_cost`
    holds at import (aliases resolved), so a price looked up either way is the same."""
    import litellm
    from litellm.litellm_core_utils.get_model_cost_map import get_model_cost_map

    from gateway.config.prices import price_map

    loaded = get_model_cost_map(url=litellm.model_cost_map_url)  # a fresh map, as LiteLLM loads it at import
    shipped = price_map()
    assert {k: loaded[k] for k in loaded} == {k: shipped[k] for k in loaded}
