"""Load-time checks of the Router settings that name routes: `model_group_alias` and the fallbacks.

An alias whose target no route serves, or a fallback a route cannot honour, would be accepted and then
fail (or be skipped) line by line: both are refused at load, naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.config.routes import Route, RouteKind
from gateway.config.wildcards import alias_target
from gateway.errors import ConfigError

FALLBACK_KEYS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks")


def check_aliases(aliases: Any, routes: Mapping[str, Route], path: str) -> None:
    """`model_group_alias`: `{alias: target}` or `{alias: {model: target, hidden: bool}}`, each target a route."""
    if aliases is None:
        return
    key = "router_settings.model_group_alias"
    if not isinstance(aliases, Mapping):
        raise ConfigError(path, key, "must be a mapping of alias to model_name")
    for alias, entry in aliases.items():
        if isinstance(entry, Mapping) and not set(entry) <= {"model", "hidden"}:
            extra = sorted(set(entry) - {"model", "hidden"})
            raise ConfigError(path, f"{key}.{alias}.{extra[0]}", "unknown setting; known: model, hidden")
        if isinstance(entry, Mapping) and not isinstance(entry.get("hidden", False), bool):
            raise ConfigError(path, f"{key}.{alias}.hidden", "must be true or false")
        target = alias_target(entry)
        if target is None:
            raise ConfigError(path, f"{key}.{alias}", "must be a model_name, or {model: model_name, hidden: bool}")
        if target not in routes:
            raise ConfigError(path, f"{key}.{alias}", f"{target!r} is not a model_name in model_list")


def _pairs(value: Any, key: str, path: str) -> list[tuple[str, list[str]]]:
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise ConfigError(path, key, "must be a list of {model_name: [fallback, ...]}")
    pairs: list[tuple[str, list[str]]] = []
    for item in value:
        for group, targets in item.items():
            if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
                raise ConfigError(path, f"{key}.{group}", "must be a list of model_names")
            pairs.append((str(group), list(targets)))
    return pairs


def check_fallbacks(settings: Mapping[str, Any], route: Callable[[str], Route | None], path: str,
                    section: str = "router_settings") -> None:
    """The Router's fallbacks hold on upstream routes only (the Router, or the pass-through doing what it
    does): a local or native route on either side of one is refused, naming both routes. `section`: where
    the settings are written (the Router reads `litellm_settings`' too, from the module)."""
    for key in FALLBACK_KEYS:
        if settings.get(key) is None:
            continue
        for group, targets in _pairs(settings[key], f"{section}.{key}", path):
            source = route(group) if group != "*" else None
            for target in targets:
                for name, found in ((group, source), (target, route(target))):
                    if found is not None and found.kind is not RouteKind.UPSTREAM:
                        raise ConfigError(
                            path, f"{section}.{key}.{group}",
                            f"{group!r} -> {target!r}: {name!r} is a {found.kind.value} route; fallbacks hold "
                            "between upstream (real-time) routes only")


__all__ = ["FALLBACK_KEYS", "check_aliases", "check_fallbacks"]
