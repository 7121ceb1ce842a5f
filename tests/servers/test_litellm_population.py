"""Every config the pinned LiteLLM ships in its wheel, as it ships it: the population is the test.

Each YAML file under `litellm/proxy/` that is a proxy config (a mapping with a section LiteLLM's proxy reads)
is read from the installed wheel, unchanged: its `os.environ/` variables are set, the base URLs among them
pointed at the loopback upstream (tests/fakes/upstream). Each one either passes `batchyard config check`
(rc 0) or is refused (rc 2) for a reason LiteLLM shares, asserted per file below. The configs whose chat
models go through OpenAI's wire to such a base URL run a small batch each, answered by the deployment
LiteLLM's Router picks (in a process of its own where the file starts LiteLLM callbacks). A new pin that
ships another config fails `test_the_population_is_the_wheels` until the file is added to `POPULATION` with
what batchyard does with it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

from gateway.config.litellm.proxy_names import CONFIG_SECTIONS
from tests.fakes.upstream.server import Upstream
from tests.support.cli_in_process import batchyard

REPO = Path(__file__).resolve().parents[2]
_spec = find_spec("litellm")
assert _spec is not None and _spec.origin is not None
PROXY = Path(_spec.origin).parent / "proxy"

# file under litellm/proxy/ -> None: loads and checks (rc 0); else the words of its refusal (rc 2).
POPULATION: dict[str, str | None] = {
    "dev_config.yaml": None,
    "model_config.yaml": None,
    "proxy_config.yaml": None,  # mcp_servers, search_tools, ...: named in the notice as LiteLLM proxy sections
    "wildcard_config.yaml": None,
    "example_config_yaml/_health_check_test_config.yaml": None,
    "example_config_yaml/adaptive_router_example.yaml": None,
    "example_config_yaml/agentcore_websearch_config.yaml": None,
    "example_config_yaml/aliases_config.yaml": None,
    "example_config_yaml/azure_config.yaml": None,
    "example_config_yaml/bing_grounding_websearch_config.yaml": None,
    "example_config_yaml/code_interpreter_interception_config.yaml": None,
    "example_config_yaml/disable_schema_update.yaml": None,
    "example_config_yaml/enterprise_config.yaml": None,
    # a deployment with no `model`: LiteLLM's Router refuses it too (litellm_params.model is required there)
    "example_config_yaml/langfuse_config.yaml": "model_list[0].litellm_params.model: is required",
    # `mistralai/mistral-7b-instruct`: a provider LiteLLM's Router cannot place, so every line of it fails there
    "example_config_yaml/load_balancer.yaml": "LiteLLM has no provider `mistralai`; did you mean `mistral/`?",
    "example_config_yaml/multi_instance_simple_config.yaml": None,
    "example_config_yaml/oai_misc_config.yaml": None,
    "example_config_yaml/opentelemetry_config.yaml": None,
    "example_config_yaml/otel_test_config.yaml": None,
    "example_config_yaml/pass_through_config.yaml": None,
    "example_config_yaml/reject_clientside_metadata_tags_config.yaml": None,
    "example_config_yaml/simple_config.yaml": None,
    "example_config_yaml/spend_tracking_config.yaml": None,
    "example_config_yaml/store_model_db_config.yaml": None,
    "example_config_yaml/test_pipeline_config.yaml": None,
    "example_config_yaml/tool_permission_example.yaml": None,
    "example_config_yaml/websearch_interception_config.yaml": None,
    "guardrails/guardrail_hooks/generic_guardrail_api/example_config.yaml": None,
    # a guardrail fragment with no model_list: there is no model for a line to name, in LiteLLM's proxy either
    "guardrails/guardrail_hooks/ibm_guardrails/example_config.yaml": "model_list: is required",
    "guardrails/guardrail_hooks/llm_shield_proxy/example_config.yaml": None,
}

# file -> {model_name a batch names: the model the Router's deployment sends upstream}: the chat models on
# OpenAI's wire whose api_base is a variable (pointed at the loopback upstream).
ROUTED: dict[str, dict[str, str]] = {
    "example_config_yaml/disable_schema_update.yaml": {"fake-openai-endpoint": "fake", "gpt-4": "gpt-4"},
    "example_config_yaml/enterprise_config.yaml": {"gpt-4": "fake"},
    "example_config_yaml/multi_instance_simple_config.yaml": {"fake-openai-endpoint": "my-fake-model"},
    "example_config_yaml/otel_test_config.yaml": {"fake-openai-endpoint": "gpt-5-mini"},
    "example_config_yaml/spend_tracking_config.yaml": {"fake-openai-endpoint": "gpt-5-mini"},
    "example_config_yaml/store_model_db_config.yaml": {"fake-openai-endpoint": "my-fake-model"},
}


def _is_config(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and bool(set(map(str, data)) & CONFIG_SECTIONS)


def _env(upstream: Upstream) -> dict[str, str]:
    """Every `os.environ/NAME` the population reads: a base URL at the loopback upstream, anything else a value."""
    names: set[str] = set()
    for name in POPULATION:
        names |= set(re.findall(r"os\.environ/([A-Za-z_][A-Za-z0-9_]*)", (PROXY / name).read_text()))
    return {name: upstream.v1_url if re.search(r"BASE|URL", name) else "sk-test" for name in sorted(names)} | {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def test_the_population_is_the_wheels() -> None:
    shipped = {str(p.relative_to(PROXY)) for p in [*PROXY.rglob("*.yaml"), *PROXY.rglob("*.yml")] if _is_config(p)}
    assert shipped == set(POPULATION), ("configs the pinned LiteLLM ships that the population lacks (add each with "
                                        f"what batchyard does with it): {sorted(shipped - set(POPULATION))}; "
                                        f"listed but not shipped: {sorted(set(POPULATION) - shipped)}")
    assert set(ROUTED) <= {name for name, refusal in POPULATION.items() if refusal is None}


@pytest.mark.parametrize("name", sorted(POPULATION))
def test_each_config_checks_or_is_refused_for_a_reason_litellm_shares(
        name: str, upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    proc = batchyard(capsys, "config", "check", str(PROXY / name), env=_env(upstream), cwd=REPO)
    refusal = POPULATION[name]
    if refusal is None:
        assert proc.returncode == 0, proc.stderr
        assert f"{PROXY / name}: " in proc.stdout and "model name(s)" in proc.stdout
    else:
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr.startswith(f"batchyard: config error: {PROXY / name}: ") and refusal in proc.stderr


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_a_small_batch_goes_to_the_deployment_litellm_picks(name: str, upstream: Upstream, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    models = ROUTED[name]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": f"{model}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": model, "messages": [{"role": "user", "content": f"n{i}"}]}})
                           + "\n" for model in models for i in range(2)))
    out = tmp_path / "out.jsonl"
    before = dict(upstream.stats()["by_model"])
    args = ["run", "-i", str(src), "-o", str(out), "--config", str(PROXY / name), "--no-progress"]
    if yaml.safe_load((PROXY / name).read_text()).get("litellm_settings", {}).get("callbacks"):
        # LiteLLM's callbacks (otel, prometheus, gcs_bucket) set process-wide state: their own process
        proc = subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=REPO,
                              env={**os.environ, **_env(upstream)}, capture_output=True, text=True, timeout=300)
    else:
        proc = batchyard(capsys, *args, env=_env(upstream), cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["response"]["status_code"] for r in results] == [200] * len(results), results
    after = upstream.stats()["by_model"]
    sent: dict[str, int] = {}
    for deployment in models.values():
        sent[deployment] = sent.get(deployment, 0) + 2
    assert {m: after.get(m, 0) - before.get(m, 0) for m in sent} == sent
