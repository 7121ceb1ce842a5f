"""The config's settings sections: `batch_settings` (batchyard's own), `general_settings`, `router_settings`.

Each is a pydantic model with `extra="forbid"` and strict types: a key batchyard would not apply is
refused at load, and `true` is no number. A new setting is one field here (with its default and a
docstring saying what it does: the docs' configuration reference is generated from these models
(scripts/docs_reference.py), and a unit test fails on a field without one.
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

WebhookEvent = Literal["batch.completed", "batch.failed", "batch.cancelled", "batch.expired", "team.budget_threshold"]
WEBHOOK_EVENTS: tuple[WebhookEvent, ...] = ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired",
                                            "team.budget_threshold")
# A fraction of `max_budget` whose crossing is announced (`team.budget_threshold`): above 0, at most 10x.
BudgetAlert = Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)]


class OutputCheckSettings(Strict):
    """`batch_settings.output_check` (and a team's own `output_check`): replies checked against the schema their
    request asked for (`gateway.lines.output_check`), and the re-runs of those that do not match."""

    enabled: bool = True
    """Check the replies of lines that name a schema; false: no reply is checked, none re-run."""
    reruns: Annotated[int, Field(ge=0, le=10)] = 2
    """How many more times a line whose reply does not match its schema is run on its route (each attempt
    paid and counted); still invalid after them, the line fails with `output_invalid`. 0: check only."""


class Team(Strict):
    """`batch_settings.teams[]`: who may call, which models they may use, where their webhooks go."""

    team_id: NonEmpty
    """The team's name, unique: 1 to 64 letters, digits, `_`, `.`, `-`, starting with a letter or digit
    (`TEAM_ID_PATTERN`; store keys are built from it)."""
    api_keys: list[NonEmpty] = Field(default_factory=list)
    """The keys the team's clients send (`Authorization: Bearer KEY` or Azure's `api-key: KEY`)."""
    models: list[str] | None = None
    """The model_names of `model_list` the team may use; null: every one."""
    weight: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 1.0
    """The team's share of a route it competes on, against the other teams' weights (fair share:
    `gateway.scheduling.fairness`)."""
    max_enqueued_requests: PositiveInt | None = None
    """Quota: requests in the team's unfinished batches; a batch over it is refused at create with 429
    `max_enqueued_requests_exceeded` (`gateway.store.quota`). Null: no limit."""
    max_active_batches: PositiveInt | None = None
    """Quota: the team's unfinished batches; over it, 429 `max_active_batches_exceeded`. Null: no limit."""
    model_max_enqueued_requests: dict[str, PositiveInt] = Field(default_factory=dict)
    """Quota per model_name: requests of that model in the team's unfinished batches (counted per
    `body.model` as the file streams; only the models listed are limited); over it, 429
    `model_max_enqueued_requests_exceeded`."""
    max_file_storage_bytes: PositiveInt | None = None
    """Bytes of the team's uploaded files (stored, or being uploaded) until deleted or expired; an upload
    that would pass it is refused with 429 `storage_quota_exceeded` (`gateway.store.storage`). Null:
    `batch_settings.max_file_storage_bytes`."""
    max_lines: PositiveInt | None = None
    """Lines per input file of the team's batches (more is `too_many_tasks`), e.g. raised for files sent
    through the Uploads API. Null: `batch_settings.max_lines`."""
    rpm_limit: PositiveInt | None = None
    """Requests started per window (`rate_window_seconds`: a minute) on each route the team uses, each route
    counted apart (LiteLLM proxy's name), on top of the deployments' own `rpm` (LiteLLM's Router keeps
    those). Over it a batch's requests wait for the next window (paced, never refused:
    `gateway.scheduling.pacing`). Null: no limit."""
    tpm_limit: PositiveInt | None = None
    """Tokens reported (`usage.total_tokens`) per window on each route the team uses, paced like `rpm_limit`.
    Null: no limit."""
    model_rpm_limit: dict[str, PositiveInt] = Field(default_factory=dict)
    """model_name -> requests per window, instead of `rpm_limit` on that route."""
    model_tpm_limit: dict[str, PositiveInt] = Field(default_factory=dict)
    """model_name -> tokens per window, instead of `tpm_limit` on that route."""
    max_budget: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """A budget in USD per `budget_duration` (LiteLLM's name). Over it, new batches are refused with 429
    `budget_exceeded` and running ones stop sending (their unrun lines: `budget_exceeded`;
    `gateway.pipeline.shard_runner`). Null: none."""
    budget_duration: Annotated[str, Field(pattern=r"^[1-9][0-9]*(s|m|h|d)$")] | None = None
    """The budget period: a number and `s`, `m`, `h` or `d` (`30d`, `1h`, `10m`, `30s`); null: the budget
    never resets."""
    budget_reservation: Literal["none", "estimate"] | None = None
    """The team's own `batch_settings.budget_reservation` (null: that one)."""
    budget_alerts: list[BudgetAlert] | None = Field(default=None, max_length=10)
    """The team's own `batch_settings.budget_alerts` (null: those; `[]`: none)."""
    output_check: OutputCheckSettings | None = None
    """The team's re-runs of replies that do not match their schema; null: `batch_settings.output_check`."""

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

    webhook_url: Annotated[str, Field(pattern=r"^https?://[^\s/]+")] | None = None
    """Where the team's batch events are POSTed (OpenAI's batch webhooks); goes with `webhook_secret`."""
    webhook_secret: SecretStr | None = None
    """The Standard Webhooks signing secret (write it `os.environ/NAME`; OpenAI's `whsec_…` form or any
    string); never logged or shown."""
    webhook_events: list[WebhookEvent] = Field(default_factory=lambda: list(WEBHOOK_EVENTS), min_length=1)
    """Which events are sent."""

    @model_validator(mode="after")
    def _url_and_secret_together(self) -> Team:
        if (self.webhook_url is None) != (self.webhook_secret is None):
            raise ValueError("webhook_url and webhook_secret go together: events are always signed")
        if self.webhook_secret is not None and not self.webhook_secret.get_secret_value():
            raise ValueError("webhook_secret is empty")
        return self


class WebhookSettings(Strict):
    """`batch_settings.webhooks`: how deliveries to the teams' `webhook_url`s are retried."""

    retry_delays_seconds: list[PositiveFloat] = Field(default_factory=lambda: [5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0],
                                                      min_length=1)
    """Seconds before each retry after a failed attempt (the last repeats): Standard Webhooks' advice of
    backing off over hours."""
    give_up_after_seconds: PositiveFloat = 86_400
    """Attempts stop this long after the event."""
    timeout_seconds: PositiveFloat = 10
    """One attempt's total deadline: connect, send, and the reply read up to 64 KiB."""


class MetricsSettings(Strict):
    """`batch_settings.metrics`: the Prometheus scrape at `/metrics` (and a worker's `--metrics-port`)."""

    enabled: bool = True
    """Serve `/metrics`; false answers 404."""
    require_auth: bool = True
    """The scrape needs the master key, as the admin API (a server with no keys configured is open);
    false opens it."""


class TracingSettings(Strict):
    """`batch_settings.tracing`: what OpenTelemetry's variables cannot say. Traces themselves are switched on by
    the standard `OTEL_*` variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...): without them nothing is sent and
    these settings have no effect (`gateway.tracing`)."""

    request_sample_ratio: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    """The share of a batch's requests that get a span (failed requests always do). Null: every request of a
    batch under `max_request_spans_per_batch` lines, then that many spans' worth of a larger batch."""
    max_request_spans_per_batch: PositiveInt = 10_000
    """With `request_sample_ratio` null, a batch of more lines samples its requests at this count over its
    lines, so one batch sends about this many request spans (plus its failures)."""
    capture_content_teams: list[NonEmpty] = Field(default_factory=list)
    """The teams whose prompts and completions go into their request spans (`gen_ai.input.messages`,
    `gen_ai.output.messages`). Empty: no team's; no key, token or header value is ever captured."""


class Limits(BaseModel):
    """The input limits (flat keys of `batch_settings`), gathered for the validator and the upload path."""

    model_config = ConfigDict(frozen=True)
    max_lines: int
    max_file_bytes: int
    max_line_bytes: int
    max_errors_listed: int


_ANY_NUMBER = 2**62  # lines: no bound a file could reach


class BatchSettings(Strict):
    """`batch_settings`: batchyard's own knobs (LiteLLM's proxy has no such section)."""

    teams: list[Team] = Field(default_factory=list)
    """The teams that share the gateway: keys, models, fair-share weight, quotas, budgets, webhooks."""
    budget_reservation: Literal["none", "estimate"] = "none"
    """`estimate`: a batch create of a team with a `max_budget` reserves the batch's whole cost estimate (its
    high end, as `GET /v1/files/{id}/cost_estimate` gives it) against the budget, less what the team spent
    and what its running batches hold; an estimate that does not fit is refused with 429
    `insufficient_quota`. The reservation shrinks as results are recorded and is released when the batch
    ends. `none`: creates are refused only once the budget is spent."""
    budget_alerts: list[BudgetAlert] = Field(default_factory=lambda: [0.8, 1.0], max_length=10)
    """Fractions of a team's `max_budget`: when its spend this period plus what its running batches hold
    reaches one, the team's webhook gets a `team.budget_threshold` event, once per fraction and budget period
    (teams with a `max_budget` and a webhook whose `webhook_events` has it). `[]`: no alerts."""
    max_lines: PositiveInt = 50_000
    """Lines per input file; more is `too_many_tasks`. `batchyard run` applies it only when set here."""
    max_wildcard_models: PositiveInt = 200
    """Distinct concrete models one batch's lines may name through wildcard routes (`openai/*`), all together;
    past it the batch fails validation naming this setting. Each is a route of its own (shards, quota, cost),
    so the bound keeps one file from making routes without end."""
    max_wildcard_models_per_route: PositiveInt = 100
    """Distinct concrete models one batch's lines may name through any one wildcard route; past it the batch
    fails validation naming this setting."""
    max_file_bytes: PositiveInt = 200 * 1024 * 1024
    """Bytes per uploaded file (413 `file_too_large`). `batchyard run` applies it only when set here (else
    `max_upload_bytes`)."""
    max_upload_bytes: PositiveInt = 8 * 1024**3
    """Bytes of one file made by OpenAI's Uploads API (`POST /v1/uploads`, parts of up to 64 MB), OpenAI's
    8 GB by default; `max_file_bytes` still bounds a file sent whole to `POST /v1/files`. A file this big
    usually holds more than `max_lines` requests: raise that too."""
    upload_expiry_seconds: PositiveInt = 3600
    """How long an Upload takes parts before it expires (OpenAI's hour); the sweep then removes its parts
    and frees their storage. Tests shorten it."""
    max_line_bytes: PositiveInt = 8 * 1024 * 1024
    """Bytes per line; a longer line is cut off as it is read (never held whole) and is `invalid_request`."""
    max_errors_listed: PositiveInt = 1_000
    """Validation errors listed on a failed batch."""
    max_estimates_per_team: PositiveInt = 2
    """`GET /v1/files/{id}/cost_estimate` calls one team may have running at once on an API process (they
    share the validation processes with every team's batches); past it 429 `too_many_estimates`."""
    max_results_page_bytes: PositiveInt = 16 * 1024 * 1024
    """Bytes of one page of `GET /v1/batches/{id}/results` (besides its `limit` of lines): a page ends
    before the line that would pass it (a page always holds one line at least), with `x-has-more: true`."""
    max_passthrough_reply_bytes: PositiveInt = 64 * 1024 * 1024
    """Bytes of an upstream reply the pass-through (OpenAI-wire routes) reads; a longer reply fails its
    line with `upstream_reply_too_large`, read no further."""
    shard_size: PositiveInt = 1_000
    """Requests per shard: the unit of work, retry and takeover."""
    max_concurrency: PositiveInt = 128
    """Upstream requests in flight per process, across all routes; per-deployment bounds come from
    `litellm_params.max_parallel_requests`."""
    max_shards_in_flight: PositiveInt = 8
    """Shards one process runs at once."""
    completion_windows: dict[str, PositiveInt] = Field(default_factory=lambda: dict(DEFAULT_WINDOWS))
    """Extra completion windows in seconds, e.g. `{"1h": 3600}`; `24h` (OpenAI's only one) is always
    allowed. A shorter window is how a team asks for urgency (earliest deadline first); tests add short
    ones to exercise expiry."""
    file_expiry_seconds: PositiveInt | None = 30 * 86_400
    """Files without their own expiry expire this long after they are created, as OpenAI's do: uploads
    without `expires_after`, batch output and error files of batches created without
    `output_expires_after` (those two still override it, within OpenAI's 3600..2592000). Expired files are
    deleted, record and bytes, by the sweeper (every 5 s). Null: never. Files stored by an
    older version without an `expires_at` keep none (an upgrade does not delete data)."""
    max_file_storage_bytes: PositiveInt | None = None
    """The file storage quota of each team without its own `max_file_storage_bytes`, and of uploads made
    with the master key or to an open gateway. Null: no limit."""
    rate_window_seconds: PositiveInt = 60
    """The length of the windows the teams' `rpm_limit`/`tpm_limit` are counted in (`gateway.store.rates`):
    the limits are per window, so 60 makes them per minute as their names say; tests shorten it."""
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    """The Prometheus scrape at `/metrics`."""
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    """How webhook deliveries are retried."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """OpenTelemetry traces: request sampling and content capture (switched on by the `OTEL_*` variables)."""
    trust_caller_trace: bool = False
    """Continue a caller's W3C `traceparent` (its trace id and sampled flag become the batch's). False: a
    caller is another team's program, so its `traceparent` is a link on the batch's own root span. Either way
    a caller's `tracestate` and `baggage` are never sent on to an upstream (`gateway.tracing.caller_trace`)."""
    output_check: OutputCheckSettings = Field(default_factory=OutputCheckSettings)
    """Replies checked against their request's schema, and how often one that does not match is re-run."""
    strict_config: bool = False
    """Refuse to load a config holding LiteLLM settings batchyard does not apply (as `--strict-config` does);
    false: load it and name them once at start (stderr for `run`, the log and `/health` for `serve`)."""

    @field_validator("completion_windows")
    @classmethod
    def _keep_24h(cls, windows: dict[str, int]) -> dict[str, int]:
        return {**DEFAULT_WINDOWS, **windows}

    @cached_property
    def limits(self) -> Limits:
        return Limits(max_lines=self.max_lines, max_file_bytes=self.max_file_bytes,
                      max_line_bytes=self.max_line_bytes, max_errors_listed=self.max_errors_listed)

    def for_own_file(self) -> BatchSettings:
        """What `batchyard run` applies to the caller's own file: `max_file_bytes` and `max_lines` bound what a
        shared API takes from its callers (OpenAI's 200 MB and 50,000 by default), so unless the config sets
        them, a run's file may be as big as an Upload's (`max_upload_bytes`) and have any number of lines."""
        update: dict[str, int] = {}
        if "max_file_bytes" not in self.model_fields_set:
            update["max_file_bytes"] = self.max_upload_bytes
        if "max_lines" not in self.model_fields_set:
            update["max_lines"] = _ANY_NUMBER
        if not update:
            return self
        copy = self.model_copy(update=update)
        copy.__dict__.pop("limits", None)  # model_copy copies the cached `limits` with the fields: made again
        return copy


class GeneralSettings(Strict):
    """`general_settings`: LiteLLM proxy's section; batchyard applies its `master_key` (LiteLLM's other keys
    are named as not applied: gateway.config.litellm.notices)."""

    master_key: NonEmpty | None = None
    """The admin key of `batchyard serve`: every team's batches, every model, `/metrics`, `/health`'s details."""


# The keyword arguments of LiteLLM's `Router` (litellm==1.110.2, the pinned release; `model_list` is ours to
# build). Written out so loading a config needn't import LiteLLM (seconds, and ~100 MB in the API process);
# tests/unit/test_input_errors.py checks it against the installed Router's signature.
ROUTER_SETTINGS = frozenset({
    "alerting_config", "allowed_fails", "allowed_fails_policy", "assistants_config", "auto_router_capability_limit",
    "background_health_check_model_groups", "cache_kwargs", "cache_responses", "caching_groups", "client_ttl",
    "content_policy_fallbacks", "context_window_fallbacks", "cooldown_time", "debug_level", "default_fallbacks",
    "default_litellm_params", "default_max_parallel_requests", "default_priority", "deployment_affinity_ttl_seconds",
    "disable_cooldowns", "enable_health_check_routing", "enable_mid_stream_fallback_continuation",
    "enable_pre_call_checks", "enable_tag_filtering", "enable_weighted_failover", "fallback_access_check",
    "fallback_budget_check", "fallback_on_unsupported_params", "fallbacks", "guardrail_list",
    "health_check_ignore_transient_errors", "health_check_staleness_threshold", "ignore_invalid_deployments",
    "max_fallbacks", "model_group_affinity_config", "model_group_alias", "model_group_retry_policy", "num_retries",
    "optional_pre_call_checks", "plugins", "polling_interval", "provider_budget_config", "redis_db", "redis_host",
    "redis_password", "redis_port", "redis_url", "retry_after", "retry_policy", "router_general_settings",
    "routing_groups", "routing_strategy", "routing_strategy_args", "search_tools",
    "session_affinity_repin_on_failover", "set_verbose", "stream_timeout", "tag_filtering_match_any",
    "tag_routing_prefix", "timeout",
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
    "MetricsSettings", "OutputCheckSettings", "Team", "TracingSettings", "WebhookSettings", "check_router_settings",
]
