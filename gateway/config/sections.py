"""The config's settings sections: `batch_settings` (batchyard's own), `general_settings`, `router_settings`.

Each is a pydantic model with `extra="forbid"` and strict types: a key batchyard would not apply is
refused at load, and `true` is no number. A new setting is one field here (with its default and a
comment saying what it does), plus its line in the README's config reference.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    field_validator,
    model_validator,
)

from gateway.config.entries import Strict
from gateway.errors import ConfigError

NonEmpty = Annotated[str, Field(min_length=1)]
DEFAULT_WINDOWS = {"24h": 86_400}  # OpenAI's only completion window


# What a team id may be (checked at load, gateway.config.schema): store keys are built from it
# (gateway.store.redis.keys), so no `:` (no key built from one team id can end where another's begins), and
# nothing a shell, a URL or a metric label would need to quote.
TEAM_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

WebhookEvent = Literal["batch.completed", "batch.failed", "batch.cancelled", "batch.expired"]
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired")


class Team(Strict):
    """`batch_settings.teams[]`: who may call, which models they may use, where their webhooks go."""

    team_id: NonEmpty
    api_keys: list[NonEmpty] = Field(default_factory=list)
    models: list[str] | None = None  # None: every model of model_list
    # The team's share of a route it competes on, against the other teams' weights (gateway.scheduling.fairness).
    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    # Quotas, refused at create with 429 and a code naming the quota (gateway.store.quota); None: no limit.
    max_enqueued_requests: PositiveInt | None = None  # requests in the team's unfinished batches
    max_active_batches: PositiveInt | None = None  # the team's unfinished batches
    # model_name -> requests of that model in the team's unfinished batches (only the models listed are limited;
    # refused with `model_max_enqueued_requests_exceeded`)
    model_max_enqueued_requests: dict[str, PositiveInt] = Field(default_factory=dict)
    # Bytes of the team's uploaded files (stored, or being uploaded) until deleted or expired; an upload that
    # would pass it is refused with 429 `storage_quota_exceeded` (gateway.store.storage). None: the default,
    # batch_settings.max_file_storage_bytes.
    max_file_storage_bytes: PositiveInt | None = None
    # Rate limits, LiteLLM proxy's names: requests started / tokens reported (usage.total_tokens) per minute
    # (per `rate_window_seconds`) on each route the team uses, each route counted apart; `model_…` overrides
    # them per model_name. On top of the deployments' own rpm/tpm (LiteLLM's Router keeps those). Over them a
    # batch's requests wait for the next window (paced, not refused): gateway.scheduling.pacing. None: no limit.
    rpm_limit: PositiveInt | None = None
    tpm_limit: PositiveInt | None = None
    model_rpm_limit: dict[str, PositiveInt] = Field(default_factory=dict)
    model_tpm_limit: dict[str, PositiveInt] = Field(default_factory=dict)
    # A budget, as LiteLLM names it: USD per `budget_duration` ("30d", "1h", "10m", "30s"; none: for ever). Over
    # it, new batches are refused and running ones stop sending (gateway.pipeline.execute).
    max_budget: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    budget_duration: Annotated[str, Field(pattern=r"^[1-9][0-9]*(s|m|h|d)$")] | None = None

    def rate_limits(self, route: str) -> tuple[int | None, int | None]:
        """(rpm, tpm) of the team on `route` (a model_name): the per-model value, else the team's."""
        return self.model_rpm_limit.get(route, self.rpm_limit), self.model_tpm_limit.get(route, self.tpm_limit)

    @property
    def budget_seconds(self) -> int | None:
        """`budget_duration` in seconds (None: the budget never resets)."""
        if self.budget_duration is None:
            return None
        unit = {"s": 1, "m": 60, "h": 3600, "d": 86_400}[self.budget_duration[-1]]
        return int(self.budget_duration[:-1]) * unit

    # OpenAI's batch webhooks: each of `webhook_events` is POSTed to `webhook_url`, signed the Standard
    # Webhooks way with `webhook_secret` (write it `os.environ/NAME`; OpenAI's `whsec_…` form or any string).
    webhook_url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")] | None = None
    webhook_secret: SecretStr | None = None
    webhook_events: list[WebhookEvent] = Field(default_factory=lambda: list(WEBHOOK_EVENTS), min_length=1)

    @model_validator(mode="after")
    def _url_and_secret_together(self) -> Team:
        if (self.webhook_url is None) != (self.webhook_secret is None):
            raise ValueError("webhook_url and webhook_secret go together: events are always signed")
        if self.webhook_secret is not None and not self.webhook_secret.get_secret_value():
            raise ValueError("webhook_secret is empty")
        return self


class WebhookSettings(Strict):
    """`batch_settings.webhooks`: how deliveries to the teams' `webhook_url`s are retried."""

    # Seconds before each retry after a failed attempt (the last repeats): Standard Webhooks' advice
    # of backing off over hours. Attempts stop `give_up_after_seconds` after the event.
    retry_delays_seconds: list[PositiveFloat] = Field(default_factory=lambda: [5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0],
                                                      min_length=1)
    give_up_after_seconds: PositiveFloat = 86_400
    timeout_seconds: PositiveFloat = 10  # one attempt's total deadline (connect, send, the reply read up to 64 KiB)


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
    # Files without their own expiry (uploads without `expires_after`, batch outputs without
    # `output_expires_after`) expire this long after they are created, as OpenAI's do; null: never.
    file_expiry_seconds: PositiveInt | None = 30 * 86_400
    # The file storage limit of each team without its own `max_file_storage_bytes`, and of the uploads made
    # with the master key or to an open gateway. None: no limit.
    max_file_storage_bytes: PositiveInt | None = None
    # The length of the windows the teams' rpm_limit/tpm_limit are counted in (gateway.store.rates): the limits
    # are per window, so 60 makes them per minute as their names say; tests shorten it.
    rate_window_seconds: PositiveInt = 60
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)

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
# tests/unit/test_input_errors.py checks it against the installed Router's signature.
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
    "ROUTER_SETTINGS", "TEAM_ID_PATTERN", "WEBHOOK_EVENTS", "BatchSettings", "GeneralSettings", "Limits",
    "MetricsSettings", "Team", "WebhookSettings", "check_router_settings",
]
