"""A local model's paths, read relative to the config file that names them.

`vllm/<path or hub id>` and the path-valued `engine_args` (`tokenizer`, `chat_template`) are read from the
config file's directory, as LiteLLM reads its `include`s and every config-driven tool reads a relative path,
so `serve --config config/local-tiny.yaml` finds the same model from any working directory. What is a path:
- one written as a path (absolute, `~`, `./`, `../`, a leading dot, or more than one `/`: a Hugging Face id
  is `name` or `org/name` and never starts with a dot);
- otherwise (`name`, `org/name`) a path only when it exists next to the config file; else a hub id, left as
  written for vLLM to fetch.
A path is made absolute here, once, at load; `missing_paths` names those that are not there (`config check`
fails on them; the engine would otherwise try the hub with a path and say something else).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

from gateway.config.entries import LOCAL_PREFIX
from gateway.config.kinds import RouteKind

if TYPE_CHECKING:
    from gateway.config.entries import LocalEntry
    from gateway.config.routes import Route

# engine_args that name a file or directory: a tokenizer like the model; a chat template only when the file is
# there (vLLM also takes the template's text itself)
_LIKE_MODEL = ("tokenizer",)
_FILE_OR_TEXT = ("chat_template",)


def written_as_path(value: str) -> bool:
    """`value` can only be a path (no Hugging Face id looks like it)."""
    return value.startswith(("/", "~", ".")) or value.count("/") > 1


def _anchored(value: str, base: Path) -> str | None:
    """`value` as an absolute path when it is one (read from `base`), else None (a hub id)."""
    if written_as_path(value):
        return str((base / Path(value).expanduser()).resolve())
    candidate = base / value
    return str(candidate.resolve()) if candidate.exists() else None


def anchor_local_paths(routes: dict[str, Route], base: Path) -> None:
    """Make each local route's model path (and its path-valued engine_args) absolute, read from `base`."""
    for route in routes.values():
        if route.kind is not RouteKind.LOCAL:
            continue
        entry = cast("LocalEntry", route.entries[0])  # a local route has one (schema._routes)
        model = entry.litellm_params.model.removeprefix(LOCAL_PREFIX)
        path = _anchored(model, base)
        if path is not None:
            entry.litellm_params.model = LOCAL_PREFIX + path
        for key in (*_LIKE_MODEL, *_FILE_OR_TEXT):
            value = entry.engine_args.get(key)
            if isinstance(value, str) and value:
                found = _anchored(value, base) if key in _LIKE_MODEL else _existing(value, base)
                if found is not None:
                    entry.engine_args[key] = found


def _existing(value: str, base: Path) -> str | None:
    candidate = base / Path(value).expanduser()
    return str(candidate.resolve()) if "\n" not in value and candidate.is_file() else None


def missing_paths(routes: dict[str, Route]) -> list[tuple[str, str]]:
    """(model_name, path) for each local model written as a path that is not a directory."""
    missing = []
    for name, route in sorted(routes.items()):
        if route.kind is not RouteKind.LOCAL:
            continue
        model = route.entries[0].litellm_params.model.removeprefix(LOCAL_PREFIX)
        if written_as_path(model) and not Path(model).expanduser().is_dir():
            missing.append((name, model))
    return missing


__all__ = ["anchor_local_paths", "missing_paths", "written_as_path"]
