"""pydantic's validation errors as a `ConfigError`: the file, the dotted key, and what is wrong in our words.

`model_list[2].engine_args`, `batch_settings.teams[0].team_id`: the key as a reader finds it in the
YAML. The tags of the model_list union (local/upstream/native) are pydantic's, not the file's, and are
left out of the key. An unknown key is the error reported first (a misspelt `litellm_parms` is the
problem, not the `litellm_params` it leaves missing), with the closest known name, or else the known
ones. A value is echoed only where it is no secret.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gateway.config.entries import ENTRY_MODELS, ENTRY_TAGS
from gateway.config.litellm.notices import unknown_key
from gateway.env_values import from_environment
from gateway.errors import ConfigError

_SECRET = ("key", "secret", "password", "token")

# pydantic's wording, where ours says more
_MESSAGES = {
    "missing": "is required",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "list_type": "must be a list",
    "greater_than": "must be a positive integer",
    "too_short": "must not be empty",
    "string_too_short": "must not be empty",
}


def dotted(loc: tuple[int | str, ...]) -> str:
    """`("model_list", 0, "local", "engine_args")` -> `model_list[0].engine_args`."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i == 2 and loc[0] == "model_list" and part in ENTRY_TAGS:
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (`list[X]`, `X | None`, `Annotated[...]`, a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found += _models_in(arg)
    return found


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model that holds the last key of `loc` (to list the keys it knows)."""
    candidates = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if part in ENTRY_MODELS and len(candidates) > 1:  # the model_list union's tag
            candidates = [ENTRY_MODELS[part]]
            continue
        fld = candidates[0].model_fields.get(part)
        candidates = _models_in(fld.annotation) if fld is not None else []
        if not candidates:
            return None
    return candidates[0] if len(candidates) == 1 else None


def _holds_float(root: type[BaseModel], loc: tuple[int | str, ...]) -> bool:
    """Whether the key at `loc` is a number field (seconds), not a count."""
    holder = _model_at(root, loc)
    fld = holder.model_fields.get(str(loc[-1])) if holder is not None else None

    def mentions_float(annotation: Any) -> bool:
        return annotation is float or any(mentions_float(arg) for arg in typing.get_args(annotation))

    return fld is not None and mentions_float(fld.annotation)


def _problem(error: ErrorDetails, root: type[BaseModel]) -> str:
    kind, loc = error["type"], tuple(error["loc"])
    if kind == "extra_forbidden":
        name = str(loc[-1])
        if name == "engine_args" and len(loc) > 2 and loc[2] in ("upstream", "native"):
            return f"is for local models (litellm_params.model: vllm/...); this entry is {loc[2]}"
        holder = _model_at(root, loc)
        if holder is None:
            return "unknown key"
        problem = unknown_key(name, holder.model_fields)
        return problem if "did you mean" in problem else f"{problem}; known: {', '.join(holder.model_fields)}"
    message = _MESSAGES.get(kind, error["msg"])
    if kind.startswith("greater_than") and isinstance(error.get("ctx"), dict):
        message = f"must be greater than {error['ctx'].get('gt', error['ctx'].get('ge'))}"
        if error["ctx"].get("gt") == 0:
            message = "must be a positive number" if _holds_float(root, loc) else "must be a positive integer"
    if kind in ("missing", "extra_forbidden") or any(s in str(p).lower() for p in loc for s in _SECRET) \
            or from_environment(error["input"]):
        return message
    if kind in _MESSAGES or kind.startswith(("greater_than", "literal")):
        return f"{message}, got {error['input']!r}"
    return message


def config_error(exc: ValidationError, path: str, root: type[BaseModel]) -> ConfigError:
    """The first of pydantic's errors as a `ConfigError` (one problem at a time, as the rest of the loader)."""
    errors = exc.errors(include_url=False)
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = dotted(tuple(error["loc"])) or "(top level)"
    if error["type"] == "missing" and key.endswith(("litellm_params", "litellm_params.model")):
        # what an entry cannot do without is the model it names
        return ConfigError(path, key.removesuffix(".model") + ".model", "is required (e.g. openai/gpt-4o-mini)")
    return ConfigError(path, key, _problem(error, root))


__all__ = ["config_error", "dotted"]

