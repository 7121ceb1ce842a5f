"""What each endpoint's request body must hold, and what it may hold.

Must: a chat line without `messages` would otherwise pass validation and fail
later, one paid upstream call per line. Only checks that are cheap (a dict
lookup and an isinstance) and certain (every server of that endpoint refuses
the body) are made, from the endpoint table (`gateway.config.endpoints`); the
rest is the serving engine's or provider's to judge.

May: a line's body is data, never configuration. An upstream route takes the
endpoint's documented request fields only (`upstream_fields`: OpenAI's request
schemas, as the pinned `openai` SDK's generated request types spell them),
plus the provider extras the operator lists for that model
(`model_info.allowed_params`). Anything else is that line's 400: LiteLLM takes
keyword arguments for keys, base URLs, providers, headers, timeouts, retries,
fallbacks, mocks, prices and callbacks, and a line must reach none of them.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from collections.abc import Collection
from pathlib import Path
from typing import Any

from gateway.config.endpoints import ENDPOINTS
from gateway.domain import BatchRequest, Endpoint, Result
from gateway.errors import LineCode, LineError

# Containers a line may nest (its body is about two levels in): far more than any request's JSON schema
# needs, and under orjson's 254, so a checked line is always written back by the fast codec.
MAX_LINE_DEPTH = 128
_JSON_NAMES = {str: "a string", list: "an array", dict: "an object", int: "an integer", float: "a number",
               bool: "a boolean", type(None): "null"}


def check_body(endpoint: Endpoint, body: dict[str, Any], line: int) -> LineError | None:
    """The first missing or mistyped field of `body`, in OpenAI's words; None when it is fine."""
    rule = ENDPOINTS[endpoint]  # its required fields and their types: gateway.config.endpoints
    alternatives = rule.required
    if alternatives and not any(all(body.get(f) is not None for f in fields) for fields in alternatives):
        # name the first field missing from the set the body came closest to
        closest = max(alternatives, key=lambda fields: sum(body.get(f) is not None for f in fields))
        missing = next(f for f in closest if body.get(f) is None)
        return LineError(LineCode.MISSING_REQUIRED_PARAMETER,
                         f"Missing required parameter: 'body.{missing}'.", line, f"body.{missing}")
    for name, (types, wanted) in rule.types.items():
        value = body.get(name)
        if value is not None and not isinstance(value, types):
            got = _JSON_NAMES.get(type(value), type(value).__name__)
            return LineError(LineCode.INVALID_TYPE,
                             f"Invalid type for 'body.{name}': expected {wanted}, but got {got} instead.",
                             line, f"body.{name}")
    return None


@functools.cache
def upstream_fields(endpoint: Endpoint) -> frozenset[str]:
    """The request fields OpenAI documents for `endpoint` (empty for an endpoint no upstream route serves).

    Read from the `openai` SDK's request types (the table's `sdk_params`), which Stainless generates from
    `openai/openai-openapi`, so the list follows the pinned SDK instead of a hand-kept copy (Anthropic's
    Messages: the `anthropic` SDK's, less the names it sends as headers). `stream` lives in the SDK's
    streaming variants; validation answers `stream: true` itself. Rerank, no OpenAI endpoint, has its
    fields listed in the table."""
    rule = ENDPOINTS[endpoint]
    if rule.sdk_params is None:
        return rule.fields
    return frozenset(typed_dict_fields(rule.sdk_params) | {"stream"}) - rule.header_params


def typed_dict_fields(spec: str) -> frozenset[str]:
    """The field names of the TypedDict `module:Name` and of the bases it extends.

    Read from the module's source when the TypedDict and its bases are all defined there (the SDKs' request
    types are): importing `anthropic` to read one class costs a worker a second of CPU. Imported otherwise."""
    module, _, name = spec.partition(":")
    top, _, below = module.partition(".")
    found = importlib.util.find_spec(top)  # a top-level package: found without being imported
    roots = list(found.submodule_search_locations or []) if found is not None else []
    if roots and below:
        source = Path(roots[0], *below.split(".")).with_suffix(".py")
        if source.is_file() and (names := _annotated_in(source.read_text(), name)) is not None:
            return names
    params = getattr(importlib.import_module(module), name)
    annotated: set[str] = set()
    for klass in params.__mro__:  # a TypedDict's own annotations, and those of the bases it extends
        annotated.update(getattr(klass, "__annotations__", {}))
    return frozenset(annotated)


def _annotated_in(source: str, name: str) -> frozenset[str] | None:
    """The annotated names of class `name` in `source` and of its bases, or None when a base is not a class
    of that source (nor `TypedDict` itself)."""
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    names: set[str] = set()
    todo = [name]
    while todo:
        klass = classes.get(todo.pop())
        if klass is None:
            return None
        names.update(s.target.id for s in klass.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name))
        for base in klass.bases:
            if not isinstance(base, ast.Name):
                return None
            if base.id != "TypedDict":
                todo.append(base.id)
    return frozenset(names)


# Fields OpenAI documents that LiteLLM also reads as its own keyword argument: `metadata` is LiteLLM's logging
# and routing metadata (tags pick deployments), not the provider's. Through LiteLLM's translation a line may
# not set it; the OpenAI-wire pass-through sends it to the provider as data.
LITELLM_OWN_FIELDS = frozenset({"metadata"})


def unknown_field(body: dict[str, Any], known: Collection[str]) -> str | None:
    """The first field of `body` outside `known`, in the body's order; None when every field is known."""
    for name in body:
        if name not in known:
            return name
    return None


def unrecognized(req: BatchRequest, name: str) -> Result:
    """The line's 400 for a body field the route does not take, in OpenAI's words."""
    return Result.http_error(req.line, req.custom_id, 400, f"Unrecognized request argument supplied: {name}",
                             type_="invalid_request_error", code="unknown_parameter", model=req.model,
                             param=name)


def unsupported(req: BatchRequest, name: str, why: str) -> Result:
    """The line's 400 for a documented field this route cannot honour, in OpenAI's words and the reason."""
    return Result.http_error(req.line, req.custom_id, 400,
                             f"Unsupported parameter: '{name}' is not supported with this model ({why}).",
                             type_="invalid_request_error", code="unsupported_parameter", model=req.model,
                             param=name)
