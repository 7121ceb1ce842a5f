"""LiteLLM's process-wide settings: the team's `litellm_settings`, our defaults, and closing its clients.

`apply` does what LiteLLM's proxy does with `litellm_settings` (proxy_server.py
`load_config`: `setattr(litellm, key, value)`, callbacks through the
`logging_callback_manager`) for the keys `gateway.config.litellm.litellm_settings` accepts.
`build_router` builds the one Router (no network), for the backend and for `config check` alike, so a
config the check accepts never fails the Router's build at `run` or `serve`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gateway.errors import ConfigError

# Ours when the config says nothing (the config's value wins).
DEFAULTS: dict[str, Any] = {
    "drop_params": True,  # a body field one provider lacks should not fail the line
}


def apply(settings: dict[str, Any]) -> None:
    """Set LiteLLM's module settings from a checked `litellm_settings` section plus our defaults."""
    import litellm

    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners in a batch's stderr
    for key, value in {**DEFAULTS, **settings}.items():
        if key in ("callbacks", "success_callback", "failure_callback"):
            _callbacks(litellm, key, value)
        else:
            setattr(litellm, key, value)
            if key == "request_timeout":
                litellm.request_timeout_explicitly_set = True


def build_router(model_list: list[dict[str, Any]], router_kwargs: dict[str, Any], settings: dict[str, Any],
                 where: str = "config") -> Any:
    """LiteLLM's Router of `model_list`, the module set from `settings` first; a config it refuses (a setting
    of the wrong type, such as a boolean `cooldown_time`) is a `ConfigError`."""
    from litellm import Router

    apply(settings)
    try:
        return Router(model_list=model_list, **router_kwargs)
    except Exception as exc:  # building makes no call: whatever it refuses is the config's
        raise ConfigError(where, "model_list, router_settings", f"LiteLLM's Router refuses them: "
                          f"{type(exc).__name__}: {exc}") from None


def _callbacks(litellm: Any, key: str, names: list[str]) -> None:
    manager = litellm.logging_callback_manager
    add = {
        "callbacks": manager.add_litellm_callback,
        "success_callback": manager.add_litellm_success_callback,
        "failure_callback": manager.add_litellm_failure_callback,
    }[key]
    if key != "callbacks":
        setattr(litellm, key, [])  # the proxy replaces these lists
    for name in names:
        add(name)


async def close_clients() -> None:
    """Close every HTTP client LiteLLM cached (aiohttp sessions, httpx clients) and forget them.

    LiteLLM only does this in an atexit hook on a fresh event loop, after ours is
    gone, which leaves "Unclosed client session" warnings behind.
    """
    import litellm
    from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

    await close_litellm_async_clients()
    cache = litellm.in_memory_llm_clients_cache
    with contextlib.suppress(Exception):
        cache.flush_cache()
