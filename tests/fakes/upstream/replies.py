"""What the loopback upstream (tests/fakes/upstream/server.py) answers: request texts, replies and error bodies.

Pure functions of the request body, shared by the real-time endpoints and the
Batches API's lines. Token counts are whitespace word counts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import struct
import time
from collections.abc import Callable
from typing import Any

try:  # optional speed-up; the stdlib is the fallback
    import orjson

    def _dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    _loads: Callable[[bytes | str], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    _loads = json.loads


JSON = dict[str, Any]
EMBEDDING_DIM = 8

# status -> (type, code, message) for injected and protocol errors
_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", "bad_request", "Bad request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", "forbidden", "You are not allowed to do this."),
    404: ("invalid_request_error", "not_found", "Not found."),
    408: ("timeout_error", "timeout", "Request timed out."),
    409: ("invalid_request_error", "conflict", "Conflict."),
    422: ("invalid_request_error", "unprocessable_entity", "Unprocessable entity."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again in 0ms."),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The server is overloaded or not ready yet."),
    504: ("server_error", "gateway_timeout", "Gateway timeout."),
}
_RETRY_HEADERS = {"retry-after": "0", "retry-after-ms": "10"}


class ApiError(Exception):
    """An error reply in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> JSON:
        return {
            "error": {"message": self.message, "type": _error_type(self.status), "param": self.param, "code": self.code}
        }


def _error_type(status: int) -> str:
    if status in _ERRORS:
        return _ERRORS[status][0]
    return "server_error" if status >= 500 else "invalid_request_error"


def _missing(param: str) -> ApiError:
    return ApiError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def error_body(status: int, message: str | None = None) -> JSON:
    """OpenAI's error body for a status, with its usual type and code."""
    _, code, default_message = _ERRORS.get(status, ("", None, f"Error {status}."))
    return {"error": {"message": message or default_message, "type": _error_type(status), "param": None, "code": code}}


def _now() -> int:
    return int(time.time())


def _id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"



def _words(text: str) -> int:
    return len(text.split())


# --------------------------------------------------------------------------- request text


def _content_text(content: Any) -> str:
    """Text of a message content: a string or a list of parts with `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p if isinstance(p, str) else p.get("text") for p in content if isinstance(p, str | dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return ""


def _text_list(value: Any, param: str) -> list[str]:
    """A prompt/input as a list of texts: str, list[str], list[int] (tokens) or list[list[int]]."""
    if value is None:
        raise _missing(param)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return value
        if all(isinstance(v, int) for v in value):
            return [" ".join(map(str, value))]
        if all(isinstance(v, list) for v in value):
            return [" ".join(map(str, v)) for v in value]
    raise ApiError(400, f"Invalid value for '{param}'.", param=param, code="invalid_value")


def _last_user(messages: list[Any], content_key: str = "content") -> str:
    chosen = None
    for message in messages:
        if isinstance(message, dict) and message.get("role", "user") == "user":
            chosen = message
    if chosen is None and messages and isinstance(messages[-1], dict):
        chosen = messages[-1]
    return _content_text(chosen.get(content_key)) if chosen else ""


def request_text(kind: str, body: JSON) -> str:
    """The text a request is about: where directives are looked for and what replies echo."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _missing("messages")
        return _last_user(messages)
    if kind == "completions":
        return "\n".join(_text_list(body.get("prompt"), "prompt"))
    if kind == "embeddings":
        return "\n".join(_text_list(body.get("input"), "input"))
    if kind == "responses":
        value = body.get("input")
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            return _last_user(value)
        raise _missing("input")
    if kind == "rerank":
        query = body.get("query")
        if not isinstance(query, str) or not isinstance(body.get("documents"), list):
            raise _missing("query" if not isinstance(query, str) else "documents")
        return query
    if kind == "score":
        return "\n".join(_text_list(body.get("text_1", body.get("queries")), "text_1"))
    if kind == "moderations":
        return "\n".join(_text_list(body.get("input"), "input"))
    if kind == "image_edits":  # the JSON form: `images` as [{"image_url"} | {"file_id"}], one of them each
        images = body.get("images")
        if not isinstance(images, list) or not images:
            raise _missing("images")
        for i, ref in enumerate(images):
            if not isinstance(ref, dict) or len(ref.keys() & {"image_url", "file_id"}) != 1:
                raise _invalid(f"images[{i}]", "Each image must give exactly one of 'image_url' or 'file_id'.")
    if kind in ("images", "image_edits"):
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _missing("prompt")
        return prompt
    raise ApiError(404, f"Unknown endpoint kind {kind!r}.")


# --------------------------------------------------------------------------- replies


def _usage(prompt: int, completion: int) -> JSON:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _chat(body: JSON, model: str, text: str) -> JSON:
    content = f"echo: {text}"
    prompt = sum(_words(_content_text(m.get("content"))) for m in body["messages"] if isinstance(m, dict))
    return {
        "id": _id("chatcmpl-"),
        "object": "chat.completion",
        "created": _now(),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(prompt, _words(content)),
        "system_fingerprint": "fp_batchyard_upstream",
    }


def _completions(body: JSON, model: str, text: str) -> JSON:
    prompts = _text_list(body.get("prompt"), "prompt")
    choices: list[JSON] = [
        {"index": i, "text": f"echo: {p}", "logprobs": None, "finish_reason": "stop"} for i, p in enumerate(prompts)
    ]
    completion = sum(_words(c["text"]) for c in choices)
    return {
        "id": _id("cmpl-"),
        "object": "text_completion",
        "created": _now(),
        "model": model,
        "choices": choices,
        "usage": _usage(sum(_words(p) for p in prompts), completion),
    }


def embedding_vector(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """The deterministic unit vector the server returns for `text` (float32 values)."""
    raw = b""
    block = 0
    while len(raw) < 4 * dim:
        raw += hashlib.sha256(f"{block}:{text}".encode()).digest()
        block += 1
    ints = struct.unpack(f"<{dim}I", raw[: 4 * dim])
    values = [i / 2147483647.5 - 1.0 for i in ints]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    packed = struct.pack(f"<{dim}f", *(v / norm for v in values))
    return list(struct.unpack(f"<{dim}f", packed))


def _embeddings(body: JSON, model: str, text: str) -> JSON:
    inputs = _text_list(body.get("input"), "input")
    dim = body.get("dimensions") or EMBEDDING_DIM
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for i, item in enumerate(inputs):
        vector: Any = embedding_vector(item, dim)
        if as_base64:
            vector = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": vector})
    prompt = sum(_words(t) for t in inputs)
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def _responses(body: JSON, model: str, text: str) -> JSON:
    content = f"echo: {text}"
    value = body.get("input")
    if isinstance(value, str):
        input_tokens = _words(value)
    else:
        items = value if isinstance(value, list) else []
        input_tokens = sum(_words(_content_text(m.get("content"))) for m in items if isinstance(m, dict))
    output_tokens = _words(content)
    return {
        "id": _id("resp_"),
        "object": "response",
        "created_at": _now(),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": [
            {
                "type": "message",
                "id": _id("msg_"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def relevance(query: str, document: str) -> float:
    """Word-set overlap (Jaccard) of two texts: the rerank/score relevance."""
    a, b = set(query.lower().split()), set(document.lower().split())
    return len(a & b) / len(a | b) if a | b else 0.0


def _rerank(body: JSON, model: str, text: str) -> JSON:
    docs = [d if isinstance(d, str) else _content_text([d]) for d in body["documents"]]
    ranked = sorted(range(len(docs)), key=lambda i: (-relevance(text, docs[i]), i))
    top_n = body.get("top_n") or len(docs)
    results = [{"index": i, "document": {"text": docs[i]}, "relevance_score": relevance(text, docs[i])} for i in ranked]
    tokens = _words(text) + sum(_words(d) for d in docs)
    return {"id": _id("rerank-"), "model": model, "usage": {"total_tokens": tokens}, "results": results[:top_n]}


def _score(body: JSON, model: str, text: str) -> JSON:
    left = _text_list(body.get("text_1", body.get("queries")), "text_1")
    right = _text_list(body.get("text_2", body.get("documents")), "text_2")
    if len(left) == 1:
        left = left * len(right)
    pairs = list(zip(left, right, strict=False))
    data = [{"index": i, "object": "score", "score": relevance(a, b)} for i, (a, b) in enumerate(pairs)]
    tokens = sum(_words(a) + _words(b) for a, b in pairs)
    return {
        "id": _id("score-"),
        "object": "list",
        "created": _now(),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


_MODERATION_CATEGORIES = ("harassment", "hate", "self-harm", "sexual", "violence")


def _moderations(body: JSON, model: str, text: str) -> JSON:
    results = []
    for item in _text_list(body.get("input"), "input"):
        flagged = "attack" in item.lower().split()
        categories = {c: flagged and c == "violence" for c in _MODERATION_CATEGORIES}
        scores = {c: (0.9 if categories[c] else 0.001) for c in _MODERATION_CATEGORIES}
        results.append({"flagged": flagged, "categories": categories, "category_scores": scores})
    return {"id": _id("modr-"), "model": model, "results": results}


def _images(body: JSON, model: str, text: str) -> JSON:
    n = body.get("n") or 1
    if not isinstance(n, int) or not 1 <= n <= 10:
        raise _invalid("n", "Invalid value for 'n': must be an integer from 1 to 10.")
    data: list[JSON] = []
    for i in range(n):
        pixels = hashlib.sha256(f"{i}:{text}".encode()).digest()  # stands in for an image
        if body.get("response_format") == "url":
            data.append({"url": f"https://images.invalid/{pixels.hex()[:16]}.png", "revised_prompt": text})
        else:
            data.append({"b64_json": base64.b64encode(pixels).decode(), "revised_prompt": text})
    tokens = _words(text)
    usage = {"input_tokens": tokens, "output_tokens": 0, "total_tokens": tokens,
             "input_tokens_details": {"text_tokens": tokens, "image_tokens": 0}}
    return {"created": _now(), "data": data, "usage": usage}


_BUILDERS: dict[str, Callable[[JSON, str, str], JSON]] = {
    "chat": _chat,
    "completions": _completions,
    "embeddings": _embeddings,
    "responses": _responses,
    "rerank": _rerank,
    "score": _score,
    "moderations": _moderations,
    "images": _images,
    "image_edits": _images,
}


def _sse(kind: str, reply: JSON, include_usage: bool) -> bytes:
    """A streamed form of a chat or completions reply: one content chunk, one finish chunk, usage, [DONE]."""
    head = {"id": reply["id"], "created": reply["created"], "model": reply["model"]}
    if kind == "chat":
        head["object"] = "chat.completion.chunk"
        content = reply["choices"][0]["message"]["content"]
        first = [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}]
        last = [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    else:
        head["object"] = "text_completion"
        first = [{**choice, "finish_reason": None} for choice in reply["choices"]]
        last = [{**choice, "text": ""} for choice in reply["choices"]]
    chunks = [{**head, "choices": first}, {**head, "choices": last}]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": reply["usage"]})
    return b"".join(b"data: " + _dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
