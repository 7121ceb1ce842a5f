"""`credential_list` and `litellm_params.litellm_credential_name`, applied as LiteLLM's Router applies them.

A credential is `{credential_name, credential_values: {api_key, api_base, ...}, credential_info}`; a deployment
naming it gets its values over its own `litellm_params` (the Router's `resolved.update(credential_values)`).
Here that happens at load, before the keys are checked and `os.environ/NAME` is read, so a credential's
values are checked and resolved like the deployment's own. A name no credential has is refused (LiteLLM
only logs it, and the deployment then goes out without a key).
"""

from __future__ import annotations

from typing import Any

from gateway.errors import ConfigError

CREDENTIALS = "credential_list"
CREDENTIAL_NAME = "litellm_credential_name"
_CREDENTIAL_KEYS = frozenset({"credential_name", "credential_values", "credential_info"})


def _credentials(section: Any, path: str) -> dict[str, dict[str, Any]]:
    if not isinstance(section, list):
        raise ConfigError(path, CREDENTIALS, "must be a list of {credential_name, credential_values}")
    found: dict[str, dict[str, Any]] = {}
    for index, item in enumerate(section):
        where = f"{CREDENTIALS}[{index}]"
        if not isinstance(item, dict):
            raise ConfigError(path, where, "must be a mapping with credential_name and credential_values")
        extra = sorted(set(map(str, item)) - _CREDENTIAL_KEYS)
        if extra:
            raise ConfigError(path, f"{where}.{extra[0]}", "unknown key; known: " + ", ".join(sorted(_CREDENTIAL_KEYS)))
        name, values = item.get("credential_name"), item.get("credential_values")
        if not isinstance(name, str) or not name:
            raise ConfigError(path, f"{where}.credential_name", "must be a name")
        if name in found:
            raise ConfigError(path, f"{where}.credential_name", f"{name!r} is named twice")
        if not isinstance(values, dict):
            raise ConfigError(path, f"{where}.credential_values", "must be a mapping of litellm_params")
        found[name] = values
    return found


def apply_credentials(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """`raw` without `credential_list`, each entry naming a credential given its values."""
    if CREDENTIALS not in raw:
        return raw
    credentials = _credentials(raw[CREDENTIALS], path)
    rest = {k: v for k, v in raw.items() if k != CREDENTIALS}
    entries = rest.get("model_list")
    if not isinstance(entries, list):
        return rest  # the schema says what model_list must be
    merged: list[Any] = []
    for index, entry in enumerate(entries):
        params = entry.get("litellm_params") if isinstance(entry, dict) else None
        if not isinstance(params, dict) or CREDENTIAL_NAME not in params:
            merged.append(entry)
            continue
        name = params[CREDENTIAL_NAME]
        if name not in credentials:
            known = ", ".join(sorted(credentials)) or "none"
            raise ConfigError(path, f"model_list[{index}].litellm_params.{CREDENTIAL_NAME}",
                              f"{name!r} is no credential_name of credential_list (known: {known})")
        own = {k: v for k, v in params.items() if k != CREDENTIAL_NAME}
        merged.append({**entry, "litellm_params": {**own, **credentials[name]}})
    rest["model_list"] = merged
    return rest


__all__ = ["CREDENTIALS", "CREDENTIAL_NAME", "apply_credentials"]
