"""The config's settings sections: `batch_settings` (batchyard's own), `general_settings`, `router_settings`.

Each is a pydantic model with `extra="forbid"` and strict types: a key batchyard would not apply is
refused at load, and `true` is no number. A new setting is one field here (with its default and a
comment saying what it does), plus its line in the README's config reference.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from gateway.config.entries import Strict
from gateway.errors import ConfigError

NonEmpty = Annotated[str, Field(min_length=1)]
DEFAULT_WINDOWS = {"24h": 86_400}  # OpenAI's only completion window


class Team(Strict):
    """`batch_settings.teams[]`: who may call, and which models they may use."""

    team_id: NonEmpty
    api_keys: list[NonEmpty] = Field(default_factory=list)
    models: list[str] | None = None  # None: every model of model_list


class MetricsSettings(Strict):
    """`batch_settings.metrics`: the Prometheus scrape at `/metrics` (and a worker's `--metrics-port`)."""

    enabled: bool = True
    require_auth: bool = True  # the master key, as the admin API; with no key configured the server is open


class Limits(BaseModel):
    """The input limits (flat keys of `batch_settings`), gathered for the validator and the upload path."""

    model_config = ConfigDict(frozen=True)
    max_lines: int
    max_file_bytes: int
    max_line_bytes: int
    max_errors_listed: int


class BatchSettings(Strict):
    teams: list[Team] = Field(default_factory=list)
    max_lines: PositiveInt = 50_000
    max_file_bytes: PositiveInt = 200 * 1024 * 1024
    max_line_bytes: PositiveInt = 8 * 1024 * 1024
    max_errors_listed: PositiveInt = 1_000  # validation errors listed on a failed batch
    shard_size: PositiveInt = 1_000
    # Requests in flight across all upstream routes of one process; per-deployment
    # bounds come from litellm_params.max_parallel_requests.
    max_concurrency: PositiveInt = 128
    max_shards_in_flight: PositiveInt = 8
    # Allowed completion windows, in seconds ("24h" is OpenAI's only value and always allowed;
    # tests add short ones to exercise expiry).
    completion_windows: dict[str, PositiveInt] = Field(default_factory=lambda: dict(DEFAULT_WINDOWS))
    file_expiry_seconds: PositiveInt | None = None  # uploads without expires_after expire after this
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

    @field_validator("completion_windows")
    @classmethod
    def _keep_24h(cls, windows: dict[str, int]) -> dict[str, int]:
        return {**DEFAULT_WINDOWS, **windows}

    @cached_property
    def limits(self) -> Limits:
        return Limits(max_lines=self.max_lines, max_file_bytes=self.max_file_bytes,
                      max_line_bytes=self.max_line_bytes, max_errors_listed=self.max_errors_listed)


class GeneralSettings(Strict):
    master_key: NonEmpty | None = None  # the admin key: every team's batches, every model, /metrics


# The keyword arguments of LiteLLM's `Router` (litellm==1.106.2, the pinned release; `model_list` is ours to
# build). Written out so loading a config needn't import LiteLLM (seconds, and ~100 MB in the API process);
# tests/test_input_errors.py checks it against the installed Router's signature.
ROUTER_SETTINGS = frozenset({
    "alerting_config", "allowed_fails", "allowed_fails_policy", "assistants_config", "auto_router_capability_limit",
    "background_health_check_model_groups", "cache_kwargs", "cache_responses", "caching_groups", "client_ttl",
    "content_policy_fallbacks", "context_window_fallbacks", "cooldown_time", "debug_level", "default_fallbacks",
    "default_litellm_params", "default_max_parallel_requests", "default_priority", "deployment_affinity_ttl_seconds",
    "disable_cooldowns", "enable_health_check_routing", "enable_pre_call_checks", "enable_tag_filtering",
    "enable_weighted_failover", "fallback_access_check", "fallback_budget_check", "fallbacks", "guardrail_list",
    "health_check_ignore_transient_errors", "health_check_staleness_threshold", "ignore_invalid_deployments",
    "max_fallbacks", "model_group_affinity_config", "model_group_alias", "model_group_retry_policy", "num_retries",
    "optional_pre_call_checks", "plugins", "polling_interval", "provider_budget_config", "redis_db", "redis_host",
    "redis_password", "redis_port", "redis_url", "retry_after", "retry_policy", "router_general_settings",
    "routing_groups", "routing_strategy", "routing_strategy_args", "search_tools", "set_verbose", "stream_timeout",
    "tag_filtering_match_any", "tag_routing_prefix", "timeout",
})


def check_router_settings(section: dict[str, Any], path: str) -> dict[str, Any]:
    """`router_settings` go to LiteLLM's `Router` as keyword arguments: each must be one it takes."""
    for name in section:
        if name not in ROUTER_SETTINGS:
            raise ConfigError(path, f"router_settings.{name}", "is not a setting of LiteLLM's Router "
                              "(model_list is batchyard's to build)")
    return dict(section)


__all__ = [
    "ROUTER_SETTINGS", "BatchSettings", "GeneralSettings", "Limits", "MetricsSettings", "Team", "check_router_settings",
]
