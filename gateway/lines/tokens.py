"""A batch line's tokens, before it runs: its input tokens by the route's own tokenizer where one is at hand
offline, and the bound on its output tokens (what `gateway.estimate.cost` adds up).

- A local route's tokenizer comes from its model directory or the hub cache (`transformers`, loaded once per
  process on first use, never downloaded); an OpenAI model's is tiktoken through LiteLLM's `token_counter`
  on the encodings LiteLLM bundles (nothing is fetched; an image is not fetched to size it). Any other
  route's lines are estimated at a token per four bytes of their text (`TokenCounter.exact` says which).
- A line's output bound: its `max_completion_tokens` / `max_tokens` / `max_output_tokens` (times `n`), else
  the model's limit (`model_info.max_output_tokens`, else LiteLLM's price map; a local engine's context,
  `max_model_len`, less the line's input), else unknown. Embeddings and the like have no output.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.config.routes import Route, RouteKind
from gateway.domain import Endpoint

log = logging.getLogger(__name__)

_GENERATIVE = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES, Endpoint.MESSAGES})
_BOUND_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_OPENAI_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai"})
_MESSAGE_TOKENS = 4  # the estimate's overhead per chat message (role, separators), as OpenAI counts it
_SANE_LIMIT = 10**8  # a tokenizer's "no limit" is 10**30: not a context length


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def output_bound(endpoint: Endpoint, body: Mapping[str, Any], input_tokens: int, limit: Limit) -> int | None:
    if endpoint not in _GENERATIVE:
        return 0
    asked = next((n for name in _BOUND_FIELDS if (n := _int(body.get(name))) is not None), None)
    cap = limit.bound(input_tokens)  # what the model can write at most, whatever the line asks
    if asked is None or (cap is not None and cap < asked):
        asked = cap
    choices = _int(body.get("n")) or 1
    return None if asked is None else asked * choices


@dataclass(frozen=True, slots=True)
class Limit:
    """A model's output limit: a number of tokens, or a context the input shares (a local engine's)."""

    tokens: int | None = None
    context: int | None = None

    def bound(self, input_tokens: int) -> int | None:
        if self.tokens is not None:
            return self.tokens
        return None if self.context is None else max(self.context - input_tokens, 0)


def price_map() -> Mapping[str, Any]:
    import litellm  # its bundled price map (LITELLM_LOCAL_MODEL_COST_MAP, set by `gateway`): nothing fetched

    return litellm.model_cost


def price_names(route: Route) -> list[list[str]]:
    """Per deployment, the names the price map may know it by (`base_model` first, as LiteLLM looks it up)."""
    out = []
    for entry in route.entries:
        model = entry.litellm_params.model
        out.append([n for n in (entry.model_info.litellm_keys.get("base_model"), model, model.partition("/")[2])
                    if isinstance(n, str) and n])
    return out


def route_limit(route: Route) -> Limit:
    if route.kind is RouteKind.LOCAL:
        given = _int(route.model_info.litellm_keys.get("max_output_tokens"))
        return Limit(tokens=given) if given else Limit(context=_int(route.engine_args.get("max_model_len")))
    limits: list[int | None] = []
    cost: Mapping[str, Any] | None = None
    for entry, names in zip(route.entries, price_names(route), strict=True):
        given = _int(entry.model_info.litellm_keys.get("max_output_tokens"))
        if given is None:
            cost = cost if cost is not None else price_map()
            given = next((n for name in names if (n := _int((cost.get(name) or {}).get("max_output_tokens")))), None)
        limits.append(given)
    # the dearest deployment bounds the route: one unknown leaves the bound unknown
    return Limit(tokens=None if None in limits or not limits else max(n for n in limits if n is not None))


# -- counting tokens ---------------------------------------------------------------------------------------

# Tokenizers by model path, each with its lock, for the life of the process (loaded on first use)
_LOADED: dict[str, tuple[Any, threading.Lock] | None] = {}
_LOADING = threading.Lock()


class TokenCounter:
    """Input tokens of a line, about four bytes of its text each (the fallback of every route)."""

    exact = False

    def __init__(self, limit: Limit) -> None:
        self.limit = limit

    def count(self, endpoint: Endpoint, body: Mapping[str, Any]) -> int:
        texts, ids = _texts(endpoint, body)
        size = sum(len(t.encode()) for t in texts)
        overhead = _MESSAGE_TOKENS * len(body.get("messages") or ()) if endpoint is Endpoint.CHAT else 0
        return math.ceil(size / 4) + ids + overhead


class _TiktokenCounter(TokenCounter):
    """An OpenAI model's tokens, by LiteLLM's `token_counter` on its bundled tiktoken encodings."""

    exact = True

    def __init__(self, limit: Limit, model: str) -> None:
        super().__init__(limit)
        self._model = model

    def count(self, endpoint: Endpoint, body: Mapping[str, Any]) -> int:
        from litellm import token_counter

        try:
            messages = body.get("messages")
            if endpoint is Endpoint.CHAT and isinstance(messages, list):
                # never fetch an image to size it: the default image count is used
                return int(token_counter(model=self._model, messages=messages, use_default_image_token_count=True))
            texts, ids = _texts(endpoint, body)
            return sum(int(token_counter(model=self._model, text=t)) for t in texts) + ids
        except Exception:  # a shape its counter does not take: the estimate for this line
            return super().count(endpoint, body)


class _LocalCounter(TokenCounter):
    """A local model's tokens, by its own tokenizer (a chat line through its chat template: the engine's own
    `chat_template` where the route sets one)."""

    exact = True

    def __init__(self, limit: Limit, loaded: tuple[Any, threading.Lock], template: str | None) -> None:
        super().__init__(limit)
        # one lock per tokenizer, shared by every estimate of the process: a fast tokenizer refuses
        # concurrent use ("Already borrowed")
        self._tokenizer, self._lock = loaded
        self._template = template

    def count(self, endpoint: Endpoint, body: Mapping[str, Any]) -> int:
        tok = self._tokenizer
        try:
            with self._lock:
                messages = body.get("messages")
                template = self._template or getattr(tok, "chat_template", None)
                if endpoint is Endpoint.CHAT and isinstance(messages, list) and template:
                    text = tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                                   tokenize=False)
                    return len(tok.encode(text, add_special_tokens=False))
                texts, ids = _texts(endpoint, body)
                return sum(len(tok.encode(t)) for t in texts) + ids
        except Exception:
            return super().count(endpoint, body)


def counter_for(route: Route) -> TokenCounter:
    limit = route_limit(route)
    if route.kind is RouteKind.LOCAL:
        args = route.engine_args
        loaded = _local_tokenizer(str(args.get("tokenizer") or args["model"]))
        if loaded is None:
            return TokenCounter(limit)
        if limit.tokens is None and limit.context is None:
            length = _int(getattr(loaded[0], "model_max_length", None))
            limit = Limit(context=length if length and length < _SANE_LIMIT else None)
        return _LocalCounter(limit, loaded, _template(args.get("chat_template")))
    model = _openai_model(route)
    return _TiktokenCounter(limit, model) if model is not None else TokenCounter(limit)


def _template(given: Any) -> str | None:
    """The engine's `chat_template` setting: a file's path or the template itself (as vLLM takes it)."""
    if not isinstance(given, str) or not given:
        return None
    try:
        path = Path(given).expanduser()
        return path.read_text() if path.is_file() else given
    except (OSError, ValueError):  # a template too long or odd to be a path
        return given


def _local_tokenizer(path: str) -> tuple[Any, threading.Lock] | None:
    """The model's tokenizer from its directory or the hub cache (never downloaded), with its lock; None when
    there is none."""
    with _LOADING:
        if path not in _LOADED:
            try:
                from transformers import AutoTokenizer

                _LOADED[path] = (AutoTokenizer.from_pretrained(path, local_files_only=True), threading.Lock())
            except Exception as exc:  # not at hand offline, or it needs remote code: estimate instead
                log.info("no tokenizer at hand for %s (%s): input tokens are estimated", path, exc)
                _LOADED[path] = None
        return _LOADED[path]


def _openai_model(route: Route) -> str | None:
    """The OpenAI model whose tiktoken encoding counts the route's lines, when every deployment is one."""
    cost = price_map()
    found: list[str] = []
    for entry, names in zip(route.entries, price_names(route), strict=True):
        if entry.litellm_params.model.partition("/")[0] not in _OPENAI_PROVIDERS:
            return None
        known = next((n for n in names if (cost.get(n) or {}).get("litellm_provider") in _OPENAI_PROVIDERS), None)
        if known is None:
            return None
        found.append(known.partition("/")[2] if "/" in known else known)
    return found[0] if found else None


def _texts(endpoint: Endpoint, body: Mapping[str, Any]) -> tuple[list[str], int]:
    """The request's text, and the tokens it gives as ids (a prompt of token ids)."""
    texts: list[str] = []
    ids = 0

    def take(value: Any) -> None:
        nonlocal ids
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            ids += 1
        elif isinstance(value, list):
            for item in value:
                take(item)
        elif isinstance(value, dict):
            for key in ("content", "text", "input_text", "arguments", "output"):
                take(value.get(key))

    if endpoint is Endpoint.CHAT:
        take(body.get("messages"))
    elif endpoint is Endpoint.COMPLETIONS:
        take(body.get("prompt"))
    elif endpoint is Endpoint.RESPONSES:
        take(body.get("instructions"))
        take(body.get("input"))
    elif endpoint is Endpoint.MESSAGES:  # Anthropic's: a top-level system prompt, then the turns
        take(body.get("system"))
        take(body.get("messages"))
    elif endpoint in (Endpoint.EMBEDDINGS, Endpoint.MODERATIONS):
        take(body.get("input"))
    else:  # score, rerank, images, audio: the body's JSON less its model, as text
        texts.append(orjson.dumps({k: v for k, v in body.items() if k != "model"}).decode())
    return texts, ids


__all__ = ["Limit", "TokenCounter", "counter_for", "output_bound", "price_map", "price_names", "route_limit"]
