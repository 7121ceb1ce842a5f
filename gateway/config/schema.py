"""Loading the LiteLLM-style YAML config.

The file a team already has for LiteLLM's proxy works here, read as LiteLLM reads it: its `include`s
merged and its `environment_variables` set (`litellm_file`) before `os.environ/NAME` reads the
environment; `model_list`, `router_settings`, `general_settings`, `litellm_settings`; batchyard's own
knobs live under `batch_settings`. A LiteLLM setting batchyard does not apply is taken out and named
(`notices`; `--strict-config` refuses it instead). The rest is read into the pydantic models of
`entries` and `sections` (`ConfigFile`), which refuse unknown keys and wrong types; every problem is
reported before any request is sent, as a `ConfigError` naming the file and the dotted key. The result is
a `Config`: routes by model name, the checked sections, and the notices.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from gateway.config.engine_fields import unknown_engine_args, unknown_parser
from gateway.config.entries import Entry, LocalEntry, ModelEntry, Strict, kind_of
from gateway.config.litellm.credentials import apply_credentials
from gateway.config.litellm.deployment_keys import environment_entries
from gateway.config.litellm.litellm_file import INCLUDE, apply_environment, merge_includes, read_yaml
from gateway.config.litellm.litellm_settings import check_litellm_settings
from gateway.config.litellm.notices import Notice, split_litellm_settings, strict_refusal
from gateway.config.local_paths import anchor_local_paths
from gateway.config.native_declarations import batch_discount
from gateway.config.prices import batch_prices, price_map
from gateway.config.problems import config_error
from gateway.config.route_checks import check_aliases, check_fallbacks
from gateway.config.routes import Route, RouteKind
from gateway.config.sections import (
    ROUTER_SETTINGS,
    TEAM_ID_PATTERN,
    BatchSettings,
    GeneralSettings,
    Limits,
    MetricsSettings,
    Team,
    check_router_settings,
)
from gateway.config.wildcards import Resolver, hidden_aliases, is_pattern, pattern_refusal
from gateway.env_values import remember
from gateway.errors import ConfigError

_ENV_PREFIX = "os.environ/"


class ConfigFile(Strict):
    """The YAML file as written (after `os.environ/` substitution)."""

    model_list: Annotated[list[ModelEntry], Field(min_length=1)]
    """The routes: one or more entries per `model_name`."""
    router_settings: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of LiteLLM's `Router` (`num_retries`, `timeout`, `retry_after`, `routing_strategy`,
    `fallbacks`, ...; checked by `check_router_settings`); retries back off and honour Retry-After."""
    general_settings: GeneralSettings = Field(default_factory=GeneralSettings)
    """LiteLLM proxy's section; batchyard applies `master_key`, and names LiteLLM's other keys as not applied."""
    litellm_settings: dict[str, Any] = Field(default_factory=dict)
    """Applied as LiteLLM's proxy applies them, for the keys batchyard supports (`litellm_settings.SUPPORTED`);
    LiteLLM's other module settings are named as not applied; an unknown key is refused."""
    batch_settings: BatchSettings = Field(default_factory=BatchSettings)
    """batchyard's own knobs."""

    @field_validator("router_settings", "general_settings", "litellm_settings", "batch_settings", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        return {} if value is None else value  # `router_settings:` with nothing under it


@dataclass(slots=True)
class Config:
    path: str
    routes: dict[str, Route]
    router_settings: dict[str, Any] = field(default_factory=dict)
    litellm_settings: dict[str, Any] = field(default_factory=dict)
    master_key: str | None = None
    batch: BatchSettings = field(default_factory=BatchSettings)
    # The LiteLLM settings of the file that batchyard does not apply (config.litellm.notices), section by section.
    notices: list[Notice] = field(default_factory=list)
    # vLLM run_batch's input rules (repeated custom_ids answered line by line, an empty file is no error):
    # only the config `batchyard run --model` implies; a YAML config and the server keep OpenAI's.
    run_batch_rules: bool = False

    # How a line's model resolves (alias, exact name, wildcard), LiteLLM's order; built on first use
    _resolver: Resolver | None = field(default=None, repr=False, compare=False)
    _named: frozenset[str] | None = field(default=None, repr=False, compare=False)  # `metric_route`

    @property
    def auth_enabled(self) -> bool:
        return bool(self.master_key or any(t.api_keys for t in self.batch.teams))

    @property
    def resolver(self) -> Resolver:
        if self._resolver is None:
            self._resolver = Resolver.build(self.routes, self.router_settings.get("model_group_alias") or {})
        return self._resolver

    def route(self, model: str) -> Route | None:
        """The route a line's `model` takes: an alias's target, an exact model_name, else the most specific
        wildcard route, materialised for this model (cached: `gateway.config.wildcards`)."""
        route = self.routes.get(model)
        if route is not None and not is_pattern(model) and model not in self.resolver.aliases:
            return route  # the common case without a dictionary more
        return self.resolver.route(model)

    def lane(self, route_name: str) -> str:
        """The model_name a shard of `route_name` queues under and workers host: the pattern of a wildcard
        route's concrete model, else the name itself."""
        route = self.route(route_name)
        return route.declared if route is not None else route_name

    def metric_route(self, route_name: str) -> str:
        """The `route` label metrics give a route: its name; for a wildcard route's concrete model, its pattern,
        unless the config names that model (a team's `models`, a team's per-model limit). Lines choose
        concrete models: labelled by them, one file could make series without end."""
        if route_name in self.routes:
            return route_name
        route = self.route(route_name)
        if route is None or route.group is None:
            return route_name
        if self._named is None:
            self._named = frozenset(
                name for team in self.batch.teams
                for name in [*(team.models or ()), *team.model_rpm_limit, *team.model_tpm_limit,
                             *team.model_max_enqueued_requests] if not is_pattern(name))
        return route_name if route_name in self._named else route.group

    def named_routes(self) -> dict[str, Route]:
        """The routes by model_name as model_list writes them (wildcards as their pattern)."""
        return {route.model_name: route for route in self.routes.values()}

    def listed_models(self) -> list[str]:
        """What /v1/models lists: every model_name, and each alias not written `hidden: true`."""
        aliases = self.router_settings.get("model_group_alias") or {}
        hidden = hidden_aliases(aliases)
        return sorted(set(self.named_routes()) | {a for a in self.resolver.aliases if a not in hidden})


def _resolve(value: Any, path: str, key: str) -> Any:
    """Replace `os.environ/NAME` with the variable's value, recursively."""
    if isinstance(value, str) and value.startswith(_ENV_PREFIX):
        name = value[len(_ENV_PREFIX):]
        if name not in os.environ:
            raise ConfigError(path, key, f"environment variable {name} is not set")
        remember(os.environ[name])  # never shown in an error or a log, whatever the key
        return os.environ[name]
    if isinstance(value, dict):
        return {k: _resolve(v, path, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, path, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _routes(entries: list[Entry], path: str) -> dict[str, Route]:
    """Entries of one `model_name` form one route: one local engine, or load-balanced upstream deployments."""
    groups: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        groups.setdefault(entry.model_name, []).append(i)
    routes: dict[str, Route] = {}
    for name, indexes in groups.items():
        kinds = {kind_of(entries[i]) for i in indexes}
        if RouteKind.LOCAL in kinds and len(kinds) > 1:
            raise ConfigError(path, f"model_list[{indexes[1]}]",
                              f"model_name {name!r} mixes local (vllm/) and upstream deployments")
        if len(kinds) > 1:
            raise ConfigError(path, f"model_list[{indexes[1]}].model_info.batch_mode",
                              f"model_name {name!r} mixes native and realtime deployments")
        kind = kinds.pop()
        if kind is not RouteKind.UPSTREAM and is_pattern(name):
            # an engine serves one model, a provider's batch job is priced and split per model: no wildcard
            what = "a local (vllm/) model" if kind is RouteKind.LOCAL else "a native (batch_mode: native) route"
            raise ConfigError(path, f"model_list[{indexes[0]}].model_name",
                              f"{name!r} is a wildcard; {what} cannot be one (name each model)")
        for i in indexes:
            if is_pattern(name) and (why := pattern_refusal(name, entries[i].litellm_params.model)) is not None:
                raise ConfigError(path, f"model_list[{i}].litellm_params.model", why)
            if entries[i].model_info.allow_unpriced and not is_pattern(name):  # never read on a named route
                raise ConfigError(path, f"model_list[{i}].model_info.allow_unpriced",
                                  f"{name!r} is not a wildcard route: its model is the config's, priced or not")
        if kind is RouteKind.LOCAL and len(indexes) > 1:
            raise ConfigError(path, f"model_list[{indexes[1]}]", f"local model {name!r} is listed twice")
        if any(entries[i].model_info.batch_mode == "background" for i in indexes):
            # one server's /metrics paces the route, and its model_name label filters them: one deployment, named
            if len(indexes) > 1:
                raise ConfigError(path, f"model_list[{indexes[1]}]", f"model_name {name!r}: a batch_mode: background "
                                  "route is one server, so one deployment")
            if is_pattern(name):
                raise ConfigError(path, f"model_list[{indexes[0]}].model_name",
                                  f"{name!r} is a wildcard; a batch_mode: background route cannot be one")
        # The typed entries; LiteLLM gets litellm_params and model_info as written (Route.model_list).
        discounts = tuple(batch_discount(entries[i].litellm_params.model) for i in indexes) \
            if kind is RouteKind.NATIVE else ()
        routes[name] = Route(model_name=name, kind=kind, entries=[entries[i] for i in indexes],
                             batch_discounts=discounts)
    return routes


def _check_teams(teams: list[Team], config: Config, path: str) -> None:
    routes = config.routes

    def known(model: str) -> bool:  # a model_name (a pattern too), an alias, or a model a wildcard serves
        if model in routes or config.route(model) is not None:
            return True
        # a pattern narrower than a wildcard route (`openai/gpt-4*` under `*`): matched, though no model name
        return is_pattern(model) and config.resolver.refusal(model) is not None

    seen: set[str] = set()
    for i, team in enumerate(teams):
        if not re.fullmatch(TEAM_ID_PATTERN, team.team_id):
            # store keys are built from team ids (gateway.store.redis.keys): one shape, checked here
            raise ConfigError(path, f"batch_settings.teams[{i}].team_id",
                              f"team {team.team_id!r} is not a valid team id: 1 to 64 letters, digits, '_', '.' "
                              f"or '-', starting with a letter or digit ({TEAM_ID_PATTERN})")
        if team.team_id in seen:
            raise ConfigError(path, f"batch_settings.teams[{i}].team_id", f"duplicate team {team.team_id!r}")
        seen.add(team.team_id)
        for model in team.models or ():
            if not known(model):
                raise ConfigError(path, f"batch_settings.teams[{i}].models",
                                  f"{model!r} is not a model_name in model_list")
        for key in ("model_rpm_limit", "model_tpm_limit", "model_max_enqueued_requests"):
            for model in getattr(team, key):  # a limit on a model no line can name would never apply
                if is_pattern(model):  # counted per concrete model a line names: a pattern's row never fills
                    raise ConfigError(path, f"batch_settings.teams[{i}].{key}.{model}",
                                      f"{model!r} is a wildcard; limits are per model: name each model")
                if not known(model):
                    raise ConfigError(path, f"batch_settings.teams[{i}].{key}.{model}",
                                      f"{model!r} is not a model_name in model_list")


def _check_native_prices(teams: list[Team], config: Config, path: str) -> None:
    """A native deployment whose provider discounts some models only (Together: no halved real-time price) and
    that has no batch price (LiteLLM's map's `*_batches`, else the config's) cannot keep a team to its budget:
    refused at load when a team with a `max_budget` may send it lines."""
    budgeted = [t for t in teams if t.max_budget is not None]
    if not budgeted:
        return
    for name, route in config.routes.items():
        if route.kind is not RouteKind.NATIVE:
            continue
        team = next((t for t in budgeted if t.models is None or name in t.models), None)
        for index, entry in enumerate(route.entries):
            model = entry.litellm_params.model
            if team is None or route.batch_discount(index) is not None:
                continue
            keys = entry.model_info.litellm_keys
            names = [n for n in (keys.get("base_model"), model, model.partition("/")[2]) if isinstance(n, str) and n]
            if batch_prices(keys, price_map(), names, None) is None:
                raise ConfigError(path, f"model_list: {name}.model_info",
                                  f"no batch price is known for {model} (LiteLLM's price map has none, and the "
                                  "provider discounts some models only, so its real-time price is not one), and "
                                  f"team {team.team_id!r} has a max_budget: give input_cost_per_token_batches and "
                                  "output_cost_per_token_batches")


def parse_config(raw: Any, path: str = "<config>", *, strict: bool = False) -> Config:
    """Build a `Config` from parsed YAML (its `include`s already merged: `load_config`); raises `ConfigError`.

    `environment_variables` are set first; LiteLLM's settings batchyard does not apply become
    `Config.notices`, or with `strict` (or `batch_settings.strict_config`) a `ConfigError`."""
    if not isinstance(raw, dict):
        raise ConfigError(path, "(top level)", "must be a mapping with model_list")
    if INCLUDE in raw:
        raise ConfigError(path, INCLUDE, "names files relative to a config file: load the file (load_config)")
    raw, env_notices = apply_environment(raw, path)
    raw = apply_credentials(raw, path)  # before the keys are checked: a credential's values are litellm_params
    entries, skipped = environment_entries(raw.get("model_list"), path)  # after environment_variables are set
    raw = {**raw, "model_list": entries} if "model_list" in raw else raw
    env_notices += [Notice(key, why) for key, why in skipped]
    raw, notices = split_litellm_settings(raw, ConfigFile.model_fields, path)
    notices = env_notices + notices
    raw = _resolve(raw, path, "")  # after the split: a setting not applied needs no variable set
    try:
        file = ConfigFile.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc, path, ConfigFile) from None
    refusal = strict_refusal(notices, path) if strict or file.batch_settings.strict_config else None
    if refusal is not None:
        raise refusal
    routes = _routes(file.model_list, path)
    router_settings = check_router_settings(file.router_settings, path)
    check_aliases(router_settings.get("model_group_alias"), routes, path)
    config = Config(
        path=path,
        routes=routes,
        router_settings=router_settings,
        litellm_settings=check_litellm_settings(file.litellm_settings, path),
        master_key=file.general_settings.master_key,
        batch=file.batch_settings,
        notices=notices,
    )
    check_fallbacks(router_settings, config.route, path)
    check_fallbacks(config.litellm_settings, config.route, path, "litellm_settings")
    _check_teams(file.batch_settings.teams, config, path)
    _check_native_prices(file.batch_settings.teams, config, path)
    declared = {team.team_id for team in file.batch_settings.teams}
    for team_id in file.batch_settings.tracing.capture_content_teams:  # a team no key can be: never applies
        if team_id not in declared:
            raise ConfigError(path, "batch_settings.tracing.capture_content_teams",
                              f"{team_id!r} is not a team_id of batch_settings.teams")
    return config


def load_config(path: str | Path, *, strict: bool = False) -> Config:
    """Read a config file as LiteLLM's proxy reads it (its `include`s merged) and `parse_config` it."""
    p = Path(path)
    raw = read_yaml(p)
    if isinstance(raw, dict):
        raw = merge_includes(raw, p)
    config = parse_config(raw, str(p), strict=strict)
    anchor_local_paths(config.routes, p.resolve().parent)  # a model path is read from the file's directory
    return config


def local_model_config(model: str, engine_args: dict[str, Any], served_names: list[str] | None = None) -> Config:
    """The config `batchyard run --model M` implies: every name served by one local engine (run_batch's mode).

    The engine flags are checked here, as a config's `engine_args` are at load: an unknown one is
    refused before anything starts.
    """
    names = served_names or [model]
    args = {**engine_args, "served_model_name": names}
    entry = {"model_name": names[0], "litellm_params": {"model": f"vllm/{model}"}, "engine_args": args}
    unknown = unknown_engine_args(engine_args)
    if unknown:
        flag = "--" + str(unknown[0]).replace("_", "-")
        raise ConfigError("command line", flag, "is not an option of vLLM's run_batch (nor of batchyard run)")
    parser = unknown_parser(engine_args)  # before any engine loads: vLLM would say it only after loading
    if parser is not None:
        raise ConfigError("command line", "--" + parser[0].replace("_", "-"), parser[1])
    try:
        typed = LocalEntry.model_validate(entry)
    except ValidationError as exc:
        raise config_error(exc, "command line", LocalEntry) from None
    route = Route(model_name=names[0], kind=RouteKind.LOCAL, entries=[typed])
    routes = {name: route for name in names}
    return Config(path="--model", routes=routes, run_batch_rules=True)


__all__ = [
    "ROUTER_SETTINGS", "BatchSettings", "Config", "ConfigFile", "GeneralSettings", "Limits", "MetricsSettings",
    "Notice", "Team", "load_config", "local_model_config", "parse_config",
]
