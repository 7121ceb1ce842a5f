"""LiteLLM's config file as LiteLLM's proxy reads it: `include` merged, `environment_variables` applied.

`include: [models.yaml, ...]` names files relative to the config that declares it (an included file may
include others, each read once). Each is merged into the config as LiteLLM merges it
(litellm/proxy/common_utils/config_includes.py): a list (`model_list`) is extended, any other value is
replaced; only the top-level keys are merged. A missing file is a `ConfigError` naming it. Written here
rather than calling LiteLLM's `resolve_includes`: that one is async and needs LiteLLM imported, which
loading a config avoids (seconds, and ~100 MB in the API process).

`environment_variables:` sets process environment variables before any `os.environ/NAME` is read
(ProxyConfig._load_environment_variables): a value `os.environ/OTHER` copies another variable (left unset
when that one is), anything else is set as text (an empty value as ""). The variables LiteLLM's proxy never
lets a config set (PATH, LD_PRELOAD, ...) are not set here either, and are named among the settings not
applied. Values are never logged nor put in an error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from gateway.config.litellm.notices import Notice
from gateway.env_values import remember
from gateway.errors import ConfigError

INCLUDE, ENVIRONMENT = "include", "environment_variables"
ENV_PREFIX = "os.environ/"

# LiteLLM's ProxyConfig._BLOCKED_ENV_KEYS (1.110.2): they alter process execution, library loading or
# network routing, so the proxy skips them; so do we.
BLOCKED_ENV_KEYS = frozenset({
    "PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "DYLD_INSERT_LIBRARIES", "PYTHONPATH",
    "PYTHONSTARTUP", "PYTHONHOME", "HOME", "USER", "SHELL", "LOGNAME", "NO_PROXY", "no_proxy",
})


def read_yaml(path: Path, shown: str | None = None) -> Any:
    """One YAML file, parsed; a missing or unreadable file or bad YAML is a `ConfigError` naming it."""
    where = shown or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(where, "(file)", "no such file") from None
    except OSError as exc:
        raise ConfigError(where, "(file)", f"cannot be read: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        raise ConfigError(where, at, f"is not valid YAML: {getattr(exc, 'problem', exc)}") from None


def _entries(config: dict[str, Any], where: str) -> list[str]:
    entries = config.get(INCLUDE)
    if entries is None:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, str) and e for e in entries):
        raise ConfigError(where, INCLUDE, "must be a list of file paths")
    return list(entries)


def merge_includes(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """`config` (read from `path`) with every file its `include` names merged in, as LiteLLM merges them."""
    root = path.resolve()
    pending = [(entry, root) for entry in _entries(config, str(path))]
    loaded = {root}
    merged = {k: v for k, v in config.items() if k != INCLUDE}
    while pending:
        entry, declared_in = pending.pop(0)
        location = (declared_in.parent / entry).resolve()
        if not location.exists() and (root.parent / entry).resolve().exists():
            location = (root.parent / entry).resolve()  # LiteLLM's fallback: next to the root config
        if location in loaded:
            continue
        if not location.is_file():
            raise ConfigError(str(declared_in), INCLUDE, f"{entry}: no such file ({location})")
        included = read_yaml(location)
        if included is None:
            included = {}
        if not isinstance(included, dict):
            raise ConfigError(str(location), "(top level)", "an included config must be a mapping")
        loaded.add(location)
        for key, value in included.items():
            if key == INCLUDE:
                continue
            base = merged.get(key)
            merged[key] = [*base, *value] if isinstance(base, list) and isinstance(value, list) else value
        pending += [(e, location) for e in _entries(included, str(location))]
    return merged


def apply_environment(config: dict[str, Any], path: str) -> tuple[dict[str, Any], list[Notice]]:
    """Set `environment_variables` in the process environment; the config without that section.

    Returns the variables that were not set (LiteLLM's blocked names) as notices."""
    section = config.get(ENVIRONMENT)
    rest = {k: v for k, v in config.items() if k != ENVIRONMENT}
    if section is None:
        return rest, []
    if not isinstance(section, dict):
        raise ConfigError(path, ENVIRONMENT, "must be a mapping of variable names to values")
    notices: list[Notice] = []
    for name, value in section.items():
        key = f"{ENVIRONMENT}.{name}"
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ConfigError(path, key, "is not an environment variable name")
        if name in BLOCKED_ENV_KEYS:
            notices.append(Notice(key, "not set: LiteLLM's proxy never lets a config set it (it alters process "
                                       "execution, library loading or network routing)"))
            continue
        if isinstance(value, dict | list):
            raise ConfigError(path, key, "must be a string, a number or true/false")  # the value is not echoed
        if isinstance(value, str) and value.startswith(ENV_PREFIX):
            copied = os.environ.get(value[len(ENV_PREFIX):])
            if copied is not None:
                os.environ[name] = copied
                remember(copied)
            continue
        os.environ[name] = "" if value is None else str(value)  # LiteLLM's str(value): `true` is "True"
        remember(os.environ[name])  # never shown in an error or a log (gateway.env_values)
    return rest, notices


__all__ = ["BLOCKED_ENV_KEYS", "ENVIRONMENT", "INCLUDE", "apply_environment", "merge_includes", "read_yaml"]
