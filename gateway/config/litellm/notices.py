"""LiteLLM's settings that batchyard does not apply: named at start, never silent, never fatal (unless strict).

A key LiteLLM's proxy knows (gateway.config.litellm.proxy_names, generated from the pinned LiteLLM; the Router's
keyword arguments for `router_settings`) is never a config error: where batchyard applies it, it is
kept; where it does not, it is taken out of the config and becomes a `Notice` (its dotted key and why),
which `batchyard run` prints on stderr, and `serve` logs and shows in `/health`, once at start.
`--strict-config` (or `batch_settings.strict_config: true`) makes the notices a load error instead.
A key nobody knows (a typo) stays an error naming that key and the closest known name, except in
`litellm_settings`: LiteLLM's proxy sets any key there on its module, so such a key is named in the notice
(with the nearest known name) rather than refused. The callbacks LiteLLM's proxy starts itself (`presidio`,
`hide_secrets`, ...) are taken out of the callback lists and named too.

The reasons are the table of docs/configuration.md ("LiteLLM settings batchyard names but does not apply").
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.litellm.deployment_keys import extra_body_notices
from gateway.config.litellm.litellm_settings import CALLBACK_KEYS
from gateway.config.litellm.litellm_settings import SUPPORTED as LITELLM_APPLIED
from gateway.config.litellm.proxy_names import (
    CONFIG_SECTIONS,
    GENERAL_SETTINGS,
    LITELLM_MODULE_SETTINGS,
    PROXY_CALLBACKS,
)
from gateway.config.sections import ROUTER_SETTINGS, GeneralSettings
from gateway.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Notice:
    """A LiteLLM setting of the config that batchyard does not apply (or applies as LiteLLM does without
    checking it, `applied`): its dotted key and why."""

    key: str
    why: str
    applied: bool = False  # passed on as written (extra_body): named, not refused by --strict-config

    def __str__(self) -> str:
        return f"{self.key}: {self.why}"


_STORE = "batchyard keeps its own store (SQLite in --data-dir, or Redis and shared storage)"
_AUTH = "batchyard's keys are general_settings.master_key and batch_settings.teams[].api_keys"
_CACHE = ("not applied to batch lines: LiteLLM's response cache is keyed on the request alone, so one team "
          "could be answered from another team's cached reply; every line is sent upstream")
_PROXY = "a setting of LiteLLM's proxy server, which batchyard does not run"

# Dotted key -> why it is not applied, where the section's default does not say enough.
REASONS: dict[str, str] = {
    "general_settings.database_url": _STORE,
    "general_settings.store_model_in_db": _STORE,
    "general_settings.use_redis_transaction_buffer": _STORE,
    "general_settings.proxy_batch_write_at": _STORE,
    "general_settings.coordination_redis": _STORE,
    "general_settings.disable_spend_logs": _STORE,
    "general_settings.custom_auth": _AUTH,
    "general_settings.enable_jwt_auth": _AUTH,
    "general_settings.litellm_jwtauth": _AUTH,
    "general_settings.allowed_routes": _AUTH,
    "general_settings.alerting": "batchyard sends no alerts: see /metrics and the teams' webhooks",
    "litellm_settings.cache": _CACHE,
    "litellm_settings.cache_params": "goes with litellm_settings.cache, which is not applied to batch lines",
    "litellm_settings.max_budget": "budgets are per team here: batch_settings.teams[].max_budget",
    "litellm_settings.default_team_settings": "teams are batch_settings.teams",
    "litellm_settings.guardrails": "LiteLLM's guardrails run in its proxy server, which batchyard does not run",
    "litellm_settings.set_verbose": "batchyard sets LiteLLM's logging itself (-v shows it)",
    "litellm_settings.json_logs": "batchyard sets LiteLLM's logging itself (-v shows it)",
    "router_settings.cache_responses": _CACHE,
    "router_settings.cache_kwargs": "goes with router_settings.cache_responses, which is not applied",
    "router_settings.caching_groups": "goes with router_settings.cache_responses, which is not applied",
}
_DEFAULTS = {
    "": "a section of LiteLLM's proxy server that batchyard does not apply",
    "general_settings": _PROXY,
    "litellm_settings": "a LiteLLM module setting batchyard does not set (it sets the ones docs/configuration.md "
                        "lists as applied)",
}
# Router settings passed on to LiteLLM's Router except these (its response cache: see _CACHE).
ROUTER_NOT_APPLIED = frozenset({"cache_responses", "cache_kwargs", "caching_groups"})


_MODULE = "set on LiteLLM's module, as its proxy sets it"
_ROUTER_READS = ("set on LiteLLM's module, where its Router reads it when router_settings does not set it; "
                 "checked at load like router_settings'")
# What batchyard does with each LiteLLM key it applies (status, how): the configuration page's table
# (generated, scripts/docs_reference.py); every other key LiteLLM knows is "not applied", for `why(key)`.
HOW_APPLIED: dict[str, tuple[str, str]] = {
    "model_list": ("applied", "the routes; every litellm_params and model_info key checked against LiteLLM's"),
    "router_settings": ("applied", "LiteLLM's Router arguments, its response cache excepted"),
    "litellm_settings": ("applied differently", "the keys below marked applied; the others are named at start"),
    "general_settings": ("applied differently", "`master_key` only: the admin key of batchyard's API"),
    "include": ("applied", "the files merged as LiteLLM's proxy merges them"),
    "environment_variables": ("applied", "set in the process, LiteLLM's blocked names excepted"),
    "credential_list": ("applied differently", "each credential's values given at load to the entries naming it "
                        "(`litellm_params.litellm_credential_name`), checked and resolved as their own"),
    "litellm_settings.drop_params": ("applied differently", f"{_MODULE}; batchyard's default is true"),
    "litellm_settings.callbacks": ("applied differently", f"{_MODULE}, less the callbacks LiteLLM's proxy server "
                                   "starts itself (named at start)"),
    "litellm_settings.success_callback": ("applied differently", "as `callbacks`"),
    "litellm_settings.failure_callback": ("applied differently", "as `callbacks`"),
    "litellm_settings.request_timeout": ("applied", f"{_MODULE}; the Router's `timeout` unless router_settings "
                                         "sets it"),
    "litellm_settings.num_retries": ("applied", f"{_MODULE}; the Router's retries unless router_settings sets them"),
    "litellm_settings.fallbacks": ("applied", _ROUTER_READS),
    "litellm_settings.context_window_fallbacks": ("applied", _ROUTER_READS),
    "litellm_settings.content_policy_fallbacks": ("applied", _ROUTER_READS),
    "litellm_settings.allowed_fails": ("applied", _ROUTER_READS),
}


def status(key: str) -> tuple[str, str]:
    """(applied / applied differently / not applied, how or why) for the LiteLLM key at dotted `key`."""
    section, _, name = key.partition(".")
    if key in HOW_APPLIED:
        return HOW_APPLIED[key]
    if section == "litellm_settings" and name in LITELLM_APPLIED:
        return "applied", _MODULE
    return "not applied", why(key)


def why(key: str) -> str:
    """Why the LiteLLM setting at dotted `key` is not applied."""
    section = key.partition(".")[0] if "." in key else ""
    return REASONS.get(key) or _DEFAULTS.get(section, _PROXY)


def unknown_key(name: str, known: Iterable[str]) -> str:
    """An unknown key's problem, with the closest known name when one is near."""
    close = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return f"unknown key; did you mean {close[0]}?" if close else "unknown key"


def module_key(name: str, known: Collection[str]) -> str:
    """Why a `litellm_settings` key the `litellm` module lacks is not applied: LiteLLM's proxy sets it on the
    module all the same (so its file loads), where nothing reads it; the nearest name where one is near."""
    base = "LiteLLM sets it on its module, where nothing reads it"
    if name in ROUTER_SETTINGS:
        return f"{base}; it is a Router setting: write it in router_settings"
    close = difflib.get_close_matches(name, sorted(set(known)), n=1)
    return f"{base}; did you mean {close[0]}?" if close else base


def _split(section: Mapping[Any, Any], prefix: str, applied: Collection[str], known: Collection[str],
           path: str) -> tuple[dict[str, Any], list[Notice]]:
    kept: dict[str, Any] = {}
    notices: list[Notice] = []
    for key, value in section.items():
        name = str(key)
        dotted = f"{prefix}.{name}" if prefix else name
        if name in applied:
            kept[name] = value
        elif name in known:
            notices.append(Notice(dotted, why(dotted)))
        elif prefix == "litellm_settings":  # LiteLLM's proxy setattr()s any key: the file loads there
            notices.append(Notice(dotted, module_key(name, [*applied, *known])))
        else:
            raise ConfigError(path, dotted, unknown_key(name, [*applied, *known]))
    return kept, notices


def _proxy_callbacks(section: dict[str, Any]) -> list[Notice]:
    """Take the callbacks LiteLLM's proxy starts itself (guardrails, interceptions) out of the callback lists."""
    notices: list[Notice] = []
    for key in CALLBACK_KEYS:
        names = section.get(key)
        if not isinstance(names, list):
            continue
        started = [n for n in names if isinstance(n, str) and n in PROXY_CALLBACKS]
        section[key] = [n for n in names if n not in started]
        notices += [Notice(f"litellm_settings.{key}.{name}", "a callback LiteLLM's proxy server starts itself (a "
                           "guardrail, interception or moderation), which batchyard does not run") for name in started]
    return notices


def split_litellm_settings(raw: dict[str, Any], sections: Collection[str], path: str) -> tuple[
        dict[str, Any], list[Notice]]:
    """The config with only what batchyard applies (and its typos, left for the schema to refuse), and the
    LiteLLM settings taken out as notices. `sections`: the top-level keys batchyard reads."""
    kept, notices = _split(raw, "", sections, CONFIG_SECTIONS, path)
    checks: dict[str, tuple[Collection[str], Collection[str]]] = {
        "general_settings": (frozenset(GeneralSettings.model_fields), GENERAL_SETTINGS),
        "litellm_settings": (LITELLM_APPLIED, LITELLM_MODULE_SETTINGS),
        "router_settings": (ROUTER_SETTINGS - ROUTER_NOT_APPLIED, ROUTER_SETTINGS),
    }
    for name, (applied, known) in checks.items():
        section = kept.get(name)
        if isinstance(section, dict):  # anything else: the schema says what it must be
            kept[name], more = _split(section, name, applied, known, path)
            notices += more
    if isinstance(kept.get("litellm_settings"), dict):
        notices += _proxy_callbacks(kept["litellm_settings"])
    notices += [Notice(key, reason, applied=True) for key, reason in extra_body_notices(kept.get("model_list"))]
    return kept, notices


def strict_refusal(notices: list[Notice], path: str) -> ConfigError | None:
    """The load error `--strict-config` makes of the notices (the first named, the others listed); None when
    every notice names a setting that is applied."""
    refused = [n for n in notices if not n.applied]
    if not refused:
        return None
    first, rest = refused[0], refused[1:]
    also = f"; also not applied: {', '.join(n.key for n in rest)}" if rest else ""
    return ConfigError(path, first.key, f"not applied: {first.why}; refused by --strict-config "
                       f"(batch_settings.strict_config){also}")


def notice_text(notices: list[Notice]) -> str:
    """The one start-up notice: every LiteLLM setting of the config that batchyard does not apply."""
    skipped = [n for n in notices if not n.applied]
    lines = [f"config: {len(skipped)} LiteLLM setting(s) not applied (--strict-config refuses them):"]
    lines = [*lines, *(f"  {n}" for n in skipped)] if skipped else []
    passed = [n for n in notices if n.applied]
    if passed:
        lines += [f"config: {len(passed)} LiteLLM setting(s) passed on as written:"] + [f"  {n}" for n in passed]
    return "\n".join(lines)


__all__ = ["HOW_APPLIED", "REASONS", "ROUTER_NOT_APPLIED", "Notice", "module_key", "notice_text",
           "split_litellm_settings", "status", "strict_refusal", "unknown_key", "why"]
