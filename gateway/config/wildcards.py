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

A line's model selects a model and nothing else (docs/security.md, "Wildcard routes"):

- At load (`pattern_refusal`), a wildcard deployment must fix its provider (`openai/*`, not `*`), and its
  pattern may not hold more `*`s than the deployment's model: LiteLLM then sends the line's text as
  written (`"*gpt*"` -> `openai/gpt*` would send `azure/gpt/../x` on Azure's wire with OpenAI's key), so
  such a pattern is refused, naming it.
- Per line (`Resolver.refusal`), the concrete model a pattern yields must be `<the deployment's
  provider>/<a name>`, the name passing `gateway.config.model_names` (no `..`, `?`, `#`, `%`, control
  characters, over-long names; `/` only where the provider's names hold one). Otherwise the line's model
  resolves to no route, and validation answers `model_not_found` with the reason.
- Answers are kept in a bounded LRU (`RESOLVED_KEPT`): lines name what they like.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.config.kinds import inferred_provider
from gateway.config.model_names import name_problem, slash_allowed
from gateway.config.routes import Route
from gateway.lru import LRU

_COMPLEXITY = ("*", "+", "?", "\\", "^", "$", "|", "(", ")")
RESOLVED_KEPT = 4096  # line models whose route (or refusal) is kept: a bound, whatever names lines send


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


def pattern_refusal(pattern: str, deployment_model: str) -> str | None:
    """Why wildcard `model_name` `pattern` cannot be served by a deployment of `deployment_model` (None: it
    can): its provider must be fixed by the config, never taken from a line's text."""
    if "*" not in deployment_model:
        return None  # every line of the pattern goes to one fixed model
    provider = deployment_model.split("*", 1)[0]
    if "/" not in provider:
        return (f"wildcard {pattern!r} is served by litellm_params.model {deployment_model!r}, whose provider "
                "a line's model would choose: write the provider, e.g. openai/*")
    if pattern.count("*") > deployment_model.count("*"):
        return (f"wildcard {pattern!r} has more '*' than litellm_params.model {deployment_model!r}: LiteLLM "
                "would send the line's model as written, provider and all; give the model as many '*' "
                "(e.g. model_name openai/gpt* for openai/gpt*), or name the provider in the pattern")
    return None


def concrete_refusal(entry_model: str, concrete: str, api_base: str | None) -> str | None:
    """Why `concrete` (a pattern deployment's model filled from a line) is not a model of the deployment's
    provider (None: it is one)."""
    provider = entry_model.split("/", 1)[0]
    if not concrete.startswith(provider + "/"):
        return f"it would leave the route's provider {provider!r}"
    why = name_problem(concrete[len(provider) + 1:], slash=slash_allowed(provider, api_base))
    return f"not a model name of provider {provider}: {why}" if why is not None else None


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
    # model -> (its route, or None and why a wildcard refused it)
    _cache: LRU[str, tuple[Route | None, str | None]] = field(default_factory=lambda: LRU(RESOLVED_KEPT))

    @classmethod
    def build(cls, routes: Mapping[str, Route], aliases: Mapping[str, Any]) -> Resolver:
        exact = {name: r for name, r in routes.items() if not is_pattern(name)}
        found = [(pattern_regex(name), r) for name, r in routes.items() if is_pattern(name)]
        found.sort(key=lambda item: _specificity(item[0]), reverse=True)  # stable, as LiteLLM's sorted()
        targets = {name: t for name, e in aliases.items() if (t := alias_target(e)) is not None}
        return cls(exact=exact, patterns=[(re.compile(rx), r) for rx, r in found], aliases=targets)

    def route(self, model: str) -> Route | None:
        return self._answer(model)[0]

    def refusal(self, model: str) -> str | None:
        """Why a wildcard route matched `model` but refused it (`concrete_refusal`); None otherwise."""
        return self._answer(model)[1]

    def _answer(self, model: str) -> tuple[Route | None, str | None]:
        found = self._cache.get(model)
        if found is None:
            found = self._cache.put(model, self._resolve(self.aliases.get(model, model)))
        return found

    def _resolve(self, model: str) -> tuple[Route | None, str | None]:
        route = self.exact.get(model)
        if route is not None or not self.patterns:
            return route, None
        for candidate in (model, None):
            if candidate is None:
                candidate = f"{inferred_provider(model)}/{model}"
            for regex, pattern_route in self.patterns:
                match = regex.match(candidate)
                if match is not None:
                    return checked_derived(pattern_route, model, match)
        return None, None


def team_allows(allowed: Collection[str], model: str, route: Route) -> bool:
    """Whether a team whose `models` are `allowed` may send a line naming `model` (resolved to `route`): the
    name itself, its route's model_name or the wildcard it comes from, or a pattern in the list that matches
    it (LiteLLM's team model lists take patterns too)."""
    if model in allowed or route.model_name in allowed or route.declared in allowed:
        return True
    return any(is_pattern(name) and re.match(pattern_regex(name), model) is not None for name in allowed)


def checked_derived(pattern_route: Route, model: str, match: re.Match[str]) -> tuple[Route | None, str | None]:
    """`derived`, where every deployment's concrete model is a name of its provider; else None and why."""
    route = derived(pattern_route, model, match)
    if model == pattern_route.model_name:
        return route, None  # the pattern by its own name (a worker hosts it so); a line may not name it (validate)
    for entry, pattern_entry in zip(route.entries, pattern_route.entries, strict=True):
        params = pattern_entry.litellm_params
        if "*" not in params.model:
            continue  # a fixed model: the line's text goes nowhere
        why = concrete_refusal(params.model, entry.litellm_params.model, (params.model_extra or {}).get("api_base"))
        if why is not None:
            return None, f"the wildcard route {pattern_route.model_name!r} refuses it: {why}"
    return route, None


def derived(pattern_route: Route, model: str, match: re.Match[str]) -> Route:
    """The route of one concrete model a wildcard route serves: named as the line names it, each entry with
    the model LiteLLM sends (`concrete_model`), the pattern kept as `group` (what the Router is asked)."""
    entries = []
    for entry in pattern_route.entries:
        params = entry.litellm_params.model_copy(update={"model": concrete_model(entry.litellm_params.model, match)})
        entries.append(entry.model_copy(update={"litellm_params": params}))
    return Route(model_name=model, kind=pattern_route.kind, entries=entries, group=pattern_route.model_name)


__all__ = ["RESOLVED_KEPT", "Resolver", "alias_target", "checked_derived", "concrete_model", "concrete_refusal",
           "derived", "hidden_aliases", "is_pattern", "pattern_model", "pattern_refusal", "pattern_regex",
           "team_allows"]
