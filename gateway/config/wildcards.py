"""Where a line's `model` goes, as LiteLLM's Router resolves it: alias, exact name, then wildcard pattern.

LiteLLM (1.110.2, `litellm_core_utils/pattern_match_deployments.py` and the Router's name lookup):

- `router_settings.model_group_alias` first: `{alias: target}` or `{alias: {model: target, hidden: bool}}`
  (`resolve_model_group_alias`); the target is then looked up as any name.
- An exact `model_name`.
- A wildcard `model_name` (any name with `*`: `*`, `openai/*`, `openai/gpt-4*`): each `*` becomes `(.*)`
  in a regex matched at the start of the name (`re.match`); patterns are tried most specific first (the
  regex's length, then its count of regex characters, both descending); the line's model is tried first
  as written against every pattern, then as `<its inferred provider>/<model>`. The deployment's
  `litellm_params.model` gets the matched segments in place of its `*`s (`set_deployment_model_name`).

A wildcard route is materialised per concrete model a line names (`derived`): its `model_name` is the
line's model, its entries carry the concrete `litellm_params.model`, so quota, budget, fair share, cost
and the dashboard count each model apart. The Router gets the pattern deployment as written and resolves
the same way (checked by tests/servers/test_litellm_routes.py against the installed Router).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config.kinds import inferred_provider
from gateway.config.routes import Route

_COMPLEXITY = ("*", "+", "?", "\\", "^", "$", "|", "(", ")")


def is_pattern(name: str) -> bool:
    """Whether a `model_name` is a wildcard route (LiteLLM treats every name with `*` as one)."""
    return "*" in name


def pattern_regex(pattern: str) -> str:
    """LiteLLM's `PatternMatchRouter.pattern_to_regex`: escaped, each `*` a group."""
    return re.escape(pattern).replace(r"\*", "(.*)")


def _specificity(regex: str) -> tuple[int, int]:
    return len(regex), sum(regex.count(c) for c in _COMPLEXITY)


def concrete_model(deployment_model: str, match: re.Match[str]) -> str:
    """LiteLLM's `set_deployment_model_name`: the deployment's `*`s filled with the matched segments."""
    if "*" not in deployment_model:
        return deployment_model
    segments = match.groups()
    if len(segments) > deployment_model.count("*"):
        return match.string
    for segment in segments:
        deployment_model = deployment_model.replace("*", segment, 1)
    return deployment_model


def pattern_model(pattern: str, deployment_model: str, model: str) -> str | None:
    """The model a deployment of wildcard route `pattern` sends for a line naming `model` (LiteLLM's rule: the
    name as written, then as `<its inferred provider>/<model>`), or None where the pattern does not match."""
    regex = re.compile(pattern_regex(pattern))
    match = regex.match(model) or regex.match(f"{inferred_provider(model)}/{model}")
    return concrete_model(deployment_model, match) if match is not None else None


def alias_target(entry: Any) -> str | None:
    """The target of one `model_group_alias` entry (LiteLLM's `resolve_model_group_alias`)."""
    target = entry.get("model") if isinstance(entry, Mapping) else entry
    return target if isinstance(target, str) and target else None


def hidden_aliases(aliases: Mapping[str, Any]) -> frozenset[str]:
    """Aliases written `{model: ..., hidden: true}`: they resolve but are not listed by /v1/models."""
    return frozenset(name for name, e in aliases.items() if isinstance(e, Mapping) and e.get("hidden") is True)


@dataclass(slots=True)
class Resolver:
    """Resolves a line's `model` to its `Route`; each answer is cached (no regex per line after the first)."""

    exact: dict[str, Route]
    patterns: list[tuple[re.Pattern[str], Route]] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    _cache: dict[str, Route | None] = field(default_factory=dict)

    @classmethod
    def build(cls, routes: Mapping[str, Route], aliases: Mapping[str, Any]) -> Resolver:
        exact = {name: r for name, r in routes.items() if not is_pattern(name)}
        found = [(pattern_regex(name), r) for name, r in routes.items() if is_pattern(name)]
        found.sort(key=lambda item: _specificity(item[0]), reverse=True)  # stable, as LiteLLM's sorted()
        targets = {name: t for name, e in aliases.items() if (t := alias_target(e)) is not None}
        return cls(exact=exact, patterns=[(re.compile(rx), r) for rx, r in found], aliases=targets)

    def route(self, model: str) -> Route | None:
        try:
            return self._cache[model]
        except KeyError:
            pass
        found = self._resolve(self.aliases.get(model, model))
        if len(self._cache) < 100_000:  # names come from lines: keep the cache bounded
            self._cache[model] = found
        return found

    def _resolve(self, model: str) -> Route | None:
        route = self.exact.get(model)
        if route is not None or not self.patterns:
            return route
        for candidate in (model, None):
            if candidate is None:
                candidate = f"{inferred_provider(model)}/{model}"
            for regex, pattern_route in self.patterns:
                match = regex.match(candidate)
                if match is not None:
                    return derived(pattern_route, model, match)
        return None


def team_allows(allowed: Collection[str], model: str, route: Route) -> bool:
    """Whether a team whose `models` are `allowed` may send a line naming `model` (resolved to `route`): the
    name itself, its route's model_name or the wildcard it comes from, or a pattern in the list that matches
    it (LiteLLM's team model lists take patterns too)."""
    if model in allowed or route.model_name in allowed or route.declared in allowed:
        return True
    return any(is_pattern(name) and re.match(pattern_regex(name), model) is not None for name in allowed)


def derived(pattern_route: Route, model: str, match: re.Match[str]) -> Route:
    """The route of one concrete model a wildcard route serves: named as the line names it, each entry with
    the model LiteLLM sends (`concrete_model`), the pattern kept as `group` (what the Router is asked)."""
    entries = []
    for entry in pattern_route.entries:
        params = entry.litellm_params.model_copy(update={"model": concrete_model(entry.litellm_params.model, match)})
        entries.append(entry.model_copy(update={"litellm_params": params}))
    return Route(model_name=model, kind=pattern_route.kind, entries=entries, group=pattern_route.model_name)


__all__ = ["Resolver", "alias_target", "concrete_model", "derived", "hidden_aliases", "is_pattern", "pattern_model",
           "pattern_regex", "team_allows"]
