"""What the Router's model groups are to a line: which may reach an operator's own server (`internal_groups`),
and where a failed line may be sent on (`fallback_groups`, and `wire_fallbacks`: the Router's own walk, for the
pass-through's lines, which do not go through it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.domain import Result
from gateway.lines.media_urls import api_host, internal_deployment, resolves_private


async def internal_groups(deployments: Sequence[dict[str, Any]], fallbacks: Any) -> frozenset[str]:
    """The model groups whose lines may reach an operator's own server: a deployment of the group, or of a
    group it falls back to, is internal (`gateway.lines.media_urls.internal_deployment`) or its public-looking
    host resolves to a private address. Decided once, when the backend starts: one lookup per host."""
    hosts: dict[str, bool] = {}
    inside: set[str] = set()
    for deployment in deployments:
        params = deployment.get("litellm_params") or {}
        group = str(deployment.get("model_name"))
        if internal_deployment(params):
            inside.add(group)
            continue
        host = api_host(params)
        if host:
            if host not in hosts:
                hosts[host] = await resolves_private(host)
            if hosts[host]:
                inside.add(group)
    groups = {str(d.get("model_name")) for d in deployments}
    return frozenset(g for g in groups if g in inside or any(f in inside for f in fallback_closure(fallbacks, g)))


def fallback_closure(fallbacks: Any, group: str) -> set[str]:
    seen: set[str] = set()
    todo = [group]
    while todo:
        for fallback in fallback_groups(fallbacks, todo.pop()):
            if fallback not in seen:
                seen.add(fallback)
                todo.append(fallback)
    return seen


def fallback_groups(fallbacks: Any, group: str) -> list[str]:
    """The groups a group may fall back to in the Router's fallback lists (`[{group: [others]}]`, `*` for every
    group), in order: where a line may be sent on, whatever the error (`wire_fallbacks` picks by the error)."""
    found: list[str] = []
    for entry in fallbacks or []:
        if isinstance(entry, dict):
            for key in (group, "*"):
                value = entry.get(key)
                if isinstance(value, list):
                    found += [str(v) for v in value]
    return found


def wire_fallbacks(router: Any, result: Result, groups: tuple[str, ...]) -> list[str]:
    """The fallback chain the Router would walk after a pass-through line's last failed attempt, by its rules
    (`litellm/router_utils/fallback_event_handlers.py`, the Router's fallback walk): a context-window error
    takes `context_window_fallbacks` where they name the group, else `fallbacks`; a content-policy error takes
    `content_policy_fallbacks` alone when they are set; a timeout, 429 or 5xx takes `fallbacks`. The errors
    are told apart as LiteLLM tells them (`ExceptionCheckers`); other 4xx replies are the line's answer."""
    from litellm.litellm_core_utils.exception_mapping_utils import ExceptionCheckers
    from litellm.router_utils.fallback_event_handlers import get_fallback_model_group_for_lookup_groups

    status = result.status_code
    lookup = tuple(dict.fromkeys(groups))
    settings = router.settings()  # the Router's resolved settings (its attributes of these are deprecated)

    def chain(entries: Any) -> list[str] | None:
        listed = [e for e in entries or [] if isinstance(e, dict) and e]
        found, _ = get_fallback_model_group_for_lookup_groups(listed, lookup)
        return [str(f) for f in found] if found is not None else None

    if status is not None and 400 <= status < 500 and status not in (408, 429):
        text = json.dumps(result.body) if result.body is not None else ""  # LiteLLM matches `"code": "..."`
        if ExceptionCheckers.is_error_str_context_window_exceeded(text):
            window = chain(settings.context_window_fallbacks)
            return window if window is not None else chain(settings.fallbacks) or []
        lowered = text.lower()
        if (ExceptionCheckers.is_azure_content_policy_violation_error(text)
                or "violating our usage policy" in lowered or "rejected as a result of the safety system" in lowered):
            if settings.content_policy_fallbacks is not None:
                return chain(settings.content_policy_fallbacks) or []
            return chain(settings.fallbacks) or []
        return []
    return chain(settings.fallbacks) or []


__all__ = ["fallback_closure", "fallback_groups", "internal_groups", "wire_fallbacks"]
