"""What each endpoint's request body must hold, checked per input line.

A chat line without `messages` would otherwise pass validation and fail later,
one paid upstream call per line. Only checks that are cheap (a dict lookup and
an isinstance) and certain (every server of that endpoint refuses the body)
live here; the rest is the serving engine's or provider's to judge.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import LineCode, LineError
from gateway.records import Endpoint

# Per endpoint, the alternative sets of required fields: the body must hold every
# field of at least one set. vLLM's score takes any one of its four pairs
# (vllm/entrypoints/pooling/scoring/protocol.py); audio takes a URL or the file.
REQUIRED: dict[Endpoint, tuple[tuple[str, ...], ...]] = {
    Endpoint.CHAT: (("messages",),),
    Endpoint.COMPLETIONS: (("prompt",),),
    Endpoint.EMBEDDINGS: (("input",),),
    Endpoint.RESPONSES: (("input",),),
    Endpoint.MODERATIONS: (("input",),),
    Endpoint.IMAGES: (("prompt",),),
    Endpoint.TRANSCRIPTIONS: (("file_url",), ("file",)),
    Endpoint.TRANSLATIONS: (("file_url",), ("file",)),
    Endpoint.SCORE: (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")),
    Endpoint.RERANK: (("query", "documents"),),
}

_STRING_OR_ARRAY = ((str, list), "a string or an array")
# Field -> (accepted types, how OpenAI names them), per endpoint.
_TYPES: dict[Endpoint, dict[str, tuple[tuple[type, ...], str]]] = {
    Endpoint.CHAT: {"messages": ((list,), "an array")},
    Endpoint.COMPLETIONS: {"prompt": _STRING_OR_ARRAY},
    Endpoint.EMBEDDINGS: {"input": _STRING_OR_ARRAY},
    Endpoint.RESPONSES: {"input": _STRING_OR_ARRAY},
    Endpoint.MODERATIONS: {"input": _STRING_OR_ARRAY},
    Endpoint.IMAGES: {"prompt": ((str,), "a string")},
}

_JSON_NAMES = {str: "a string", list: "an array", dict: "an object", int: "an integer", float: "a number",
               bool: "a boolean", type(None): "null"}


def check_body(endpoint: Endpoint, body: dict[str, Any], line: int) -> LineError | None:
    """The first missing or mistyped field of `body`, in OpenAI's words; None when it is fine."""
    alternatives = REQUIRED.get(endpoint, ())
    if alternatives and not any(all(body.get(f) is not None for f in fields) for fields in alternatives):
        # name the first field missing from the set the body came closest to
        closest = max(alternatives, key=lambda fields: sum(body.get(f) is not None for f in fields))
        missing = next(f for f in closest if body.get(f) is None)
        return LineError(LineCode.MISSING_REQUIRED_PARAMETER,
                         f"Missing required parameter: 'body.{missing}'.", line, f"body.{missing}")
    for name, (types, wanted) in _TYPES.get(endpoint, {}).items():
        value = body.get(name)
        if value is not None and not isinstance(value, types):
            got = _JSON_NAMES.get(type(value), type(value).__name__)
            return LineError(LineCode.INVALID_TYPE,
                             f"Invalid type for 'body.{name}': expected {wanted}, but got {got} instead.",
                             line, f"body.{name}")
    return None
