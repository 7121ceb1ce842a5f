"""Loading the LiteLLM-style YAML config.

The file a team already has for LiteLLM's proxy works here: `model_list`,
`router_settings`, `general_settings`, `litellm_settings`; batchyard's own knobs
live under `batch_settings`. `os.environ/NAME` reads the environment. Every
problem is reported before any request is sent, naming the file and the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config.litellm_settings import check_litellm_settings
from gateway.config.routes import Route, RouteKind, native_refusal
from gateway.errors import ConfigError

_ENV_PREFIX = "os.environ/"


@dataclass(slots=True)
class Team:
    team_id: str
    api_keys: list[str]
    models: list[str] | None  # None: every model


@dataclass(slots=True)
class Limits:
    max_lines: int = 50_000
    max_file_bytes: int = 200 * 1024 * 1024
    max_line_bytes: int = 8 * 1024 * 1024
    max_errors_listed: int = 1_000  # validation errors listed on a failed batch


@dataclass(slots=True)
class MetricsSettings:
    """`batch_settings.metrics`: the Prometheus scrape at `/metrics` (and a worker's `--metrics-port`)."""

    enabled: bool = True
    require_auth: bool = True  # the master key, as the admin API; with no key configured the server is open


@dataclass(slots=True)
class BatchSettings:
    teams: list[Team] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    shard_size: int = 1_000
    # Requests in flight across all upstream routes of one process; per-deployment
    # bounds come from litellm_params.max_parallel_requests.
    max_concurrency: int = 128
    max_shards_in_flight: int = 8
    # Allowed completion windows, in seconds ("24h" is OpenAI's only value;
    # tests add short ones to exercise expiry).
    completion_windows: dict[str, int] = field(default_factory=lambda: {"24h": 86_400})
    file_expiry_seconds: int | None = None
    metrics: MetricsSettings = field(default_factory=MetricsSettings)


@dataclass(slots=True)
class Config:
    path: str
    routes: dict[str, Route]
    router_settings: dict[str, Any] = field(default_factory=dict)
    litellm_settings: dict[str, Any] = field(default_factory=dict)
    master_key: str | None = None
    batch: BatchSettings = field(default_factory=BatchSettings)
    # vLLM run_batch's input rules (repeated custom_ids answered line by line, an empty file is no error):
    # only the config `batchyard run --model` implies; a YAML config and the server keep OpenAI's.
    run_batch_rules: bool = False

    @property
    def auth_enabled(self) -> bool:
        return bool(self.master_key or any(t.api_keys for t in self.batch.teams))

    def route(self, model: str) -> Route | None:
        return self.routes.get(model)


def _resolve(value: Any, path: str, key: str) -> Any:
    """Replace `os.environ/NAME` with the variable's value, recursively."""
    if isinstance(value, str) and value.startswith(_ENV_PREFIX):
        name = value[len(_ENV_PREFIX):]
        if name not in os.environ:
            raise ConfigError(path, key, f"environment variable {name} is not set")
        return os.environ[name]
    if isinstance(value, dict):
        return {k: _resolve(v, path, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, path, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _mapping(value: Any, path: str, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(path, key, f"must be a mapping, got {type(value).__name__}")
    return value


def _positive_int(section: dict[str, Any], name: str, default: int, path: str, key: str) -> int:
    value = section.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(path, f"{key}.{name}", f"must be a positive integer, got {value!r}")
    return value


def _routes(model_list: Any, path: str) -> dict[str, Route]:
    if not isinstance(model_list, list) or not model_list:
        raise ConfigError(path, "model_list", "must be a non-empty list of models")
    entries: dict[str, list[dict[str, Any]]] = {}
    for i, entry in enumerate(model_list):
        key = f"model_list[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(path, key, "must be a mapping with model_name and litellm_params")
        name = entry.get("model_name")
        if not isinstance(name, str) or not name:
            raise ConfigError(path, f"{key}.model_name", "is required and must be a string")
        params = entry.get("litellm_params")
        if not isinstance(params, dict) or not isinstance(params.get("model"), str):
            raise ConfigError(path, f"{key}.litellm_params.model", "is required (e.g. openai/gpt-4o-mini)")
        if "/" not in params["model"]:
            raise ConfigError(
                path, f"{key}.litellm_params.model",
                f"{params['model']!r} names no provider; write provider/model, e.g. openai/{params['model']}",
            )
        _mapping(entry.get("engine_args"), path, f"{key}.engine_args")
        _mapping(entry.get("model_info"), path, f"{key}.model_info")
        entries.setdefault(name, []).append({**entry, "_key": key})

    routes: dict[str, Route] = {}
    for name, group in entries.items():
        kinds = {_kind(e, path) for e in group}
        if len(kinds) > 1:
            raise ConfigError(
                path, group[1]["_key"], f"model_name {name!r} mixes local (vllm/) and upstream deployments"
            )
        kind = kinds.pop()
        if kind is RouteKind.LOCAL and len(group) > 1:
            raise ConfigError(path, group[1]["_key"], f"local model {name!r} is listed twice")
        deployments = [{k: v for k, v in e.items() if k != "_key"} for e in group]
        routes[name] = Route(model_name=name, kind=kind, deployments=deployments)
    return routes


def _kind(entry: dict[str, Any], path: str) -> RouteKind:
    if entry["litellm_params"]["model"].startswith("vllm/"):
        return RouteKind.LOCAL
    mode = (entry.get("model_info") or {}).get("batch_mode", "realtime")
    if mode == "native":
        if (refusal := native_refusal(entry["litellm_params"]["model"])) is not None:
            raise ConfigError(path, f"{entry['_key']}.model_info.batch_mode", f"{entry['model_name']!r}: {refusal}")
        return RouteKind.NATIVE
    if mode != "realtime":
        raise ConfigError(path, f"{entry['_key']}.model_info.batch_mode", f"must be realtime or native, got {mode!r}")
    return RouteKind.UPSTREAM


def _teams(section: dict[str, Any], routes: dict[str, Route], path: str) -> list[Team]:
    raw = section.get("teams") or []
    if not isinstance(raw, list):
        raise ConfigError(path, "batch_settings.teams", "must be a list")
    teams: list[Team] = []
    seen: set[str] = set()
    for i, t in enumerate(raw):
        key = f"batch_settings.teams[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("team_id"), str):
            raise ConfigError(path, f"{key}.team_id", "is required and must be a string")
        if t["team_id"] in seen:
            raise ConfigError(path, f"{key}.team_id", f"duplicate team {t['team_id']!r}")
        seen.add(t["team_id"])
        keys = t.get("api_keys") or []
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise ConfigError(path, f"{key}.api_keys", "must be a list of non-empty strings")
        models = t.get("models")
        if models is not None:
            if not isinstance(models, list):
                raise ConfigError(path, f"{key}.models", "must be a list of model names")
            for m in models:
                if m not in routes:
                    raise ConfigError(path, f"{key}.models", f"{m!r} is not a model_name in model_list")
        teams.append(Team(team_id=t["team_id"], api_keys=list(keys), models=models))
    return teams


def _metrics(section: dict[str, Any], path: str) -> MetricsSettings:
    key = "batch_settings.metrics"
    raw = _mapping(section.get("metrics"), path, key)
    known = {"enabled", "require_auth"}
    for name, value in raw.items():
        if name not in known:
            raise ConfigError(path, f"{key}.{name}", f"unknown setting; known: {', '.join(sorted(known))}")
        if not isinstance(value, bool):
            raise ConfigError(path, f"{key}.{name}", f"must be true or false, got {value!r}")
    default = MetricsSettings()
    return MetricsSettings(enabled=raw.get("enabled", default.enabled),
                           require_auth=raw.get("require_auth", default.require_auth))


def _batch_settings(section: dict[str, Any], routes: dict[str, Route], path: str) -> BatchSettings:
    key = "batch_settings"
    default = Limits()
    limits = Limits(
        max_lines=_positive_int(section, "max_lines", default.max_lines, path, key),
        max_file_bytes=_positive_int(section, "max_file_bytes", default.max_file_bytes, path, key),
        max_line_bytes=_positive_int(section, "max_line_bytes", default.max_line_bytes, path, key),
        max_errors_listed=_positive_int(section, "max_errors_listed", default.max_errors_listed, path, key),
    )
    windows = {"24h": 86_400}
    extra = _mapping(section.get("completion_windows"), path, f"{key}.completion_windows")
    for name, seconds in extra.items():
        if not isinstance(seconds, int) or seconds <= 0:
            raise ConfigError(path, f"{key}.completion_windows.{name}", "must be a positive number of seconds")
        windows[str(name)] = seconds
    file_expiry = section.get("file_expiry_seconds")
    if file_expiry is not None and (not isinstance(file_expiry, int) or file_expiry <= 0):
        raise ConfigError(path, f"{key}.file_expiry_seconds", "must be a positive integer")
    known = {
        "teams", "max_lines", "max_file_bytes", "max_line_bytes", "max_errors_listed", "completion_windows",
        "shard_size", "max_concurrency", "max_shards_in_flight", "file_expiry_seconds", "metrics",
    }
    for name in section:
        if name not in known:
            raise ConfigError(path, f"{key}.{name}", f"unknown setting; known: {', '.join(sorted(known))}")
    return BatchSettings(
        teams=_teams(section, routes, path),
        limits=limits,
        shard_size=_positive_int(section, "shard_size", 1_000, path, key),
        max_concurrency=_positive_int(section, "max_concurrency", 128, path, key),
        max_shards_in_flight=_positive_int(section, "max_shards_in_flight", 8, path, key),
        completion_windows=windows,
        file_expiry_seconds=file_expiry,
        metrics=_metrics(section, path),
    )


_SECTIONS = ("model_list", "router_settings", "general_settings", "litellm_settings", "batch_settings")
_GENERAL = ("master_key",)


def _known(section: dict[str, Any], known: tuple[str, ...], path: str, key: str) -> None:
    """A setting we would not apply is refused, never silently dropped."""
    for name in section:
        if name not in known:
            where = f"{key}.{name}" if key else str(name)
            raise ConfigError(path, where, f"is not supported by batchyard; supported: {', '.join(known)}")


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


def _router_settings(section: dict[str, Any], path: str) -> dict[str, Any]:
    """`router_settings` go to LiteLLM's `Router` as keyword arguments: each must be one it takes."""
    for name in section:
        if name not in ROUTER_SETTINGS:
            raise ConfigError(path, f"router_settings.{name}", "is not a setting of LiteLLM's Router "
                              "(model_list is batchyard's to build)")
    return section


def parse_config(raw: Any, path: str = "<config>") -> Config:
    """Build a `Config` from parsed YAML; raises `ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(path, "(top level)", "must be a mapping with model_list")
    _known(raw, _SECTIONS, path, "")
    raw = _resolve(raw, path, "")
    routes = _routes(raw.get("model_list"), path)
    general = _mapping(raw.get("general_settings"), path, "general_settings")
    _known(general, _GENERAL, path, "general_settings")
    master_key = general.get("master_key")
    if master_key is not None and (not isinstance(master_key, str) or not master_key):
        raise ConfigError(path, "general_settings.master_key", "must be a non-empty string")
    return Config(
        path=path,
        routes=routes,
        router_settings=_router_settings(_mapping(raw.get("router_settings"), path, "router_settings"), path),
        litellm_settings=check_litellm_settings(_mapping(raw.get("litellm_settings"), path, "litellm_settings"), path),
        master_key=master_key,
        batch=_batch_settings(_mapping(raw.get("batch_settings"), path, "batch_settings"), routes, path),
    )


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), "(file)", "no such file") from None
    except OSError as exc:
        raise ConfigError(str(p), "(file)", f"cannot be read: {exc.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        raise ConfigError(str(p), where, f"is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_config(raw, str(p))


def local_model_config(model: str, engine_args: dict[str, Any], served_names: list[str] | None = None) -> Config:
    """The config `batchyard run --model M` implies: every name served by one local engine (run_batch's mode)."""
    names = served_names or [model]
    args = {**engine_args, "served_model_name": names}
    entry = {"model_name": names[0], "litellm_params": {"model": f"vllm/{model}"}, "engine_args": args}
    route = Route(model_name=names[0], kind=RouteKind.LOCAL, deployments=[entry])
    routes = {name: route for name in names}
    return Config(path="--model", routes=routes, run_batch_rules=True)
