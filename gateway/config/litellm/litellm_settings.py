"""`litellm_settings` of a team's LiteLLM YAML: which keys we honour, checked at config load.

LiteLLM's proxy applies this section with `setattr(litellm, key, value)`, with
special cases for callbacks. We do the same (`providers.litellm_setup.apply`)
for the keys below. LiteLLM's other settings never reach this module: they are
named at start as not applied (`gateway.config.litellm.notices`, a key LiteLLM's module lacks
included, with the nearest name); a setting accepted and then ignored would be a lie.
Callback names are checked against the names LiteLLM knows (LiteLLM is imported
only when callbacks are configured: it takes seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import ConfigError

Check = Callable[[Any], str | None]  # None: fine; else what is wrong


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {value!r}"


def _seconds(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return None if ok else f"must be a positive number of seconds, got {value!r}"


def _count(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return None if ok else f"must be a non-negative integer, got {value!r}"


def _ssl_verify(value: Any) -> str | None:
    ok = isinstance(value, bool) or (isinstance(value, str) and bool(value))
    return None if ok else f"must be true, false or a CA bundle path, got {value!r}"


def _names(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return f"must be a list of callback names, got {value!r}"
    unknown = [v for v in value if v not in known_callbacks()]
    if unknown:
        custom = [v for v in unknown if "." in v]
        if custom:
            return f"custom callback modules ({', '.join(custom)}) are not supported; use a callback LiteLLM knows"
        return f"unknown callback {unknown[0]!r}; LiteLLM knows: {', '.join(sorted(known_callbacks()))}"
    return None


def _fallbacks(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(item, dict) for item in value)
    return None if ok else f"must be a list of {{model_name: [fallback, ...]}}, got {value!r}"


CALLBACK_KEYS = ("callbacks", "success_callback", "failure_callback")
# Read by LiteLLM's Router from the module when router_settings does not set them (litellm.router_config's
# current_dynamic_config): set on the module here too, and checked at load as router_settings' are.
ROUTER_MODULE_KEYS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks", "allowed_fails")

# key -> check. Every key here is applied by providers.litellm_setup.apply.
SUPPORTED: dict[str, Check] = {
    "drop_params": _bool,  # ours defaults to true: a field one provider lacks should not fail the line
    "modify_params": _bool,
    "request_timeout": _seconds,  # the Router's timeout when router_settings.timeout is not set
    "num_retries": _count,  # the Router's retries when router_settings.num_retries is not set
    "callbacks": _names,
    "success_callback": _names,
    "failure_callback": _names,
    "turn_off_message_logging": _bool,
    "redact_messages_in_exceptions": _bool,
    "ssl_verify": _ssl_verify,
    "force_ipv4": _bool,
    "disable_aiohttp_transport": _bool,
    "fallbacks": _fallbacks,
    "context_window_fallbacks": _fallbacks,
    "content_policy_fallbacks": _fallbacks,
    "allowed_fails": _count,
}

# Callbacks LiteLLM's logging dispatches by name (litellm_logging.set_callbacks), besides
# the CustomLogger-compatible ones it lists in `_known_custom_logger_compatible_callbacks`.
_LEGACY_CALLBACKS = frozenset({
    "athina", "datadog", "dynamodb", "greenscale", "helicone", "langfuse", "logfire", "lunary",
    "openmeter", "promptlayer", "s3", "sentry", "slack", "supabase", "traceloop", "wandb",
})
_known: frozenset[str] | None = None


def known_callbacks() -> frozenset[str]:
    global _known
    if _known is None:
        import litellm

        _known = _LEGACY_CALLBACKS | frozenset(litellm._known_custom_logger_compatible_callbacks)
    return _known


def check_litellm_settings(section: dict[str, Any], path: str) -> dict[str, Any]:
    """The section as given, after checking every key and value; raises `ConfigError`."""
    for key, value in section.items():
        check = SUPPORTED.get(str(key))
        if check is None:
            raise ConfigError(
                path, f"litellm_settings.{key}", f"is not supported by batchyard; supported: {', '.join(SUPPORTED)}"
            )
        problem = check(value)
        if problem is not None:
            raise ConfigError(path, f"litellm_settings.{key}", problem)
    return dict(section)
