"""`litellm_settings`: the keys we apply are accepted and checked; LiteLLM's others are named as not applied
(tests/servers/test_config_notices.py); a key LiteLLM does not know is refused at load, naming file and key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.config.schema import parse_config
from gateway.errors import ConfigError
from providers.litellm_backend import router_kwargs

REPO = Path(__file__).resolve().parents[2]
MODELS = [{"model_name": "m", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "sk"}}]


def config(settings: Any) -> dict[str, Any]:
    return {"model_list": MODELS, "litellm_settings": settings}


def test_supported_settings_are_kept() -> None:
    settings = {
        "drop_params": False, "modify_params": True, "request_timeout": 12.5, "num_retries": 0,
        "success_callback": ["langfuse", "s3"], "failure_callback": ["sentry"], "callbacks": ["prometheus", "otel"],
        "turn_off_message_logging": True, "redact_messages_in_exceptions": True, "ssl_verify": "/etc/ca.pem",
        "force_ipv4": True, "disable_aiohttp_transport": False,
    }
    assert parse_config(config(settings), "team.yaml").litellm_settings == settings
    assert parse_config({"model_list": MODELS}).litellm_settings == {}


@pytest.mark.parametrize(("settings", "key", "says"), [
    ({"drop_params": "yes"}, "litellm_settings.drop_params", "true or false"),
    ({"request_timeout": 0}, "litellm_settings.request_timeout", "positive number"),
    ({"num_retries": -1}, "litellm_settings.num_retries", "non-negative integer"),
    ({"success_callback": ["no-such-logger"]}, "litellm_settings.success_callback", "unknown callback"),
    ({"callbacks": ["my_module.handler"]}, "litellm_settings.callbacks", "custom callback modules"),
    ({"failure_callback": "sentry"}, "litellm_settings.failure_callback", "list of callback names"),
])
def test_unsupported_settings_are_refused(settings: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(settings), "team.yaml")
    assert info.value.path == "team.yaml" and info.value.key == key and says in info.value.problem


def test_refused_at_start_by_the_command(tmp_path: Path) -> None:
    cfg = tmp_path / "team.yaml"
    cfg.write_text("model_list:\n  - model_name: m\n    litellm_params: {model: openai/x, api_key: k}\n"
                   "litellm_settings: {drop_params: true, max_budgt: 10}\n")
    src = tmp_path / "in.jsonl"
    src.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n')
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-i", str(src), "-o", str(tmp_path / "o"),
                           "--config", str(cfg), "--strict-config"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    # LiteLLM sets a key its module lacks all the same: named with the nearest name, refused when strict
    assert (f"{cfg}: litellm_settings.max_budgt: not applied: LiteLLM sets it on its module, where nothing reads "
            "it; did you mean max_budget?") in proc.stderr
    assert not (tmp_path / "o").exists()


def test_router_takes_litellm_settings_where_router_settings_are_silent() -> None:
    assert router_kwargs({}, {}) == {"num_retries": 3, "timeout": 600, "retry_after": 0}
    # litellm_settings' num_retries / request_timeout are read by the Router when it is not given its own
    assert router_kwargs({}, {"num_retries": 0, "request_timeout": 5}) == {"retry_after": 0}
    assert router_kwargs({"timeout": 9}, {"request_timeout": 5}) == {"timeout": 9, "num_retries": 3, "retry_after": 0}
