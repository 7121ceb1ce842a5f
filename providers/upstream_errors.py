"""A failed upstream call as the provider answered it, not as LiteLLM wrapped it.

LiteLLM raises its own exception types whose text reads
`litellm.BadRequestError: Hosted_vllmException - {...}\n\nLiteLLM: model group ...`.
The provider's reply is still in the exception chain: an `openai.APIStatusError`
or LiteLLM exception with `.body` (the parsed error object), an
`httpx.HTTPStatusError` with the raw `.response`, or LiteLLM's
`BaseLLMException` whose `.message` is the raw reply text. This module finds
it, so a caller sees the provider's status and its own error object (message,
type, param, code). When there is no reply at all (timeout, refused
connection) the line gets our own message under a stable code.

The one home of provider error reading: a line's error (`provider_error`, `reply_error`), and the
one-line words of a failed batch-job call for logs and a part's error results (`describe_error`,
`error_message`, `batch_error_message`), with whether it is worth another try (`retryable`; a LiteLLM call's:
`retry_can_fix`).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

UPSTREAM_TIMEOUT = "upstream_timeout"
UPSTREAM_UNREACHABLE = "upstream_unreachable"
UPSTREAM_ERROR = "upstream_error"


@dataclass(frozen=True, slots=True)
class ProviderError:
    """A provider's error reply (`status` and `body`) or, when there was none, our `code` and `message`."""

    status: int | None
    body: dict[str, Any] | None = None
    code: str | None = None
    message: str | None = None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _error_object(data: Any) -> dict[str, Any] | None:
    """`{"error": {...}}` in OpenAI's shape from a provider body, or None when it is not an error object."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        data = data["error"]
    elif isinstance(data, dict) and isinstance(data.get("error"), str):
        # e.g. {"error": "...", "code": 400}: some servers put the message at the top level
        data = {**data, "message": data["error"]}
    if not isinstance(data, dict) or not isinstance(data.get("message"), str):
        return None
    error = {"message": data["message"], "type": data.get("type"), "param": data.get("param"),
             "code": data.get("code")}
    # keep whatever else the provider said (vLLM's `object`, Azure's `innererror`, ...)
    extra = {k: v for k, v in data.items() if k not in error and k != "error"}
    return {"error": {**error, **extra}}


def _parse(text: str | bytes) -> dict[str, Any] | None:
    try:
        return _error_object(json.loads(text))
    except (ValueError, TypeError):
        return None


def _reply_of(exc: BaseException) -> tuple[int | None, dict[str, Any] | None]:
    """The provider's (status, error body) carried by one exception of the chain."""
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        try:
            return response.status_code, _parse(response.content)
        except httpx.ResponseNotRead:  # a streamed reply: nothing was read
            return response.status_code, None
    body = _error_object(getattr(exc, "body", None))
    if body is not None:
        return None, body
    # LiteLLM's BaseLLMException (not its public exceptions, whose message is prefixed): the raw reply text
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message.lstrip().startswith("{"):
        return None, _parse(message)
    return None, None


def _kind(exc: BaseException) -> str | None:
    """upstream_timeout / upstream_unreachable when no reply came, by the transport error in the chain."""
    import openai

    for e in _chain(exc):
        if isinstance(e, httpx.TimeoutException | openai.APITimeoutError | asyncio.TimeoutError | TimeoutError):
            return UPSTREAM_TIMEOUT
        if type(e).__name__ == "Timeout" and type(e).__module__.startswith("litellm"):
            return UPSTREAM_TIMEOUT
    for e in _chain(exc):
        if _no_bytes_came_back(e):
            return UPSTREAM_UNREACHABLE
    return None


def _no_bytes_came_back(exc: BaseException) -> bool:
    """A transport failure before any reply: connect, DNS, TLS, a reset. LiteLLM's own `APIConnectionError`
    is no such proof: it is its catch-all, raised as well for a reply it failed to map or a credential file
    it could not read, so only what it wraps counts."""
    import openai

    if isinstance(exc, httpx.NetworkError | httpx.ProxyError | httpx.UnsupportedProtocol | ConnectionError
                  | ssl.SSLError | socket.gaierror):
        return True
    module = type(exc).__module__
    if isinstance(exc, openai.APIConnectionError) and module.startswith("openai"):
        return True  # the SDK's: raised only when its transport failed
    return module.startswith("aiohttp") and ("Connect" in type(exc).__name__ or "Disconnected" in type(exc).__name__)


def retry_can_fix(exc: BaseException) -> bool:
    """Whether another try of a failed LiteLLM call may end differently. Not when LiteLLM failed in its own code:
    its catch-all `APIConnectionError` with no reply, no timeout and no transport failure in the chain (a
    credential file it could not read, a 200 reply it could not map). The same request fails the same way again,
    and a reply that was answered is paid for at each try."""
    if type(exc).__name__ != "APIConnectionError" or not type(exc).__module__.startswith("litellm"):
        return True
    return _kind(exc) is not None or any(_reply_of(e) != (None, None) for e in _chain(exc))


def _litellm_said(exc: BaseException) -> dict[str, Any]:
    """LiteLLM's words for an exception it raised itself, with the provider it names (`llm_provider`)."""
    message = clean_message(str(getattr(exc, "message", None) or exc))
    provider = getattr(exc, "llm_provider", None)
    said: dict[str, Any] = {"message": message}
    if isinstance(provider, str) and provider:
        said["message"] = message if message.startswith(provider) else f"{provider}: {message}"
        said["provider"] = provider
    if type(exc).__module__.startswith("litellm"):
        said["exception"] = type(exc).__name__
    return said


# LiteLLM's decorations of a message: "litellm.XError: ", "XException - ", and the router's trailers
_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)?(?:\w+Error:\s*)?(?:\w*Exception(?: \w+Error)?\s*-\s*)?")
_TRAILERS = ("\n\nLiteLLM", " LiteLLM Retried", "\nReceived Model Group", "\nDeployment Info", " Error_str:",
             "\nTraceback (most recent call last)", "\n\nThis looks like a bug in LiteLLM")


def clean_message(text: str) -> str:
    """LiteLLM's exception text without its prefixes and router trailers (the fallback when no body was sent)."""
    text = _PREFIX.sub("", text.strip(), count=1)
    for trailer in _TRAILERS:
        text = text.split(trailer, 1)[0]
    return text.strip() or "the upstream call failed"


def provider_error(exc: BaseException, model: str) -> ProviderError:
    """What to report for a failed upstream call of `model` (the caller's model name)."""
    status: int | None = None
    body: dict[str, Any] | None = None
    for e in _chain(exc):
        reply_status, reply_body = _reply_of(e)
        status = status or reply_status
        if reply_body is not None and body is None:
            body = reply_body
        if status is not None and body is not None:
            break
    outer = getattr(exc, "status_code", None)
    if status is None and isinstance(outer, int) and outer >= 400:
        status = outer
    if body is not None:
        return ProviderError(status=status if status and status >= 400 else 500, body=body)
    kind = _kind(exc)
    if kind == UPSTREAM_TIMEOUT:
        return ProviderError(None, code=kind, message=f"the upstream for model {model!r} did not answer in time")
    if kind == UPSTREAM_UNREACHABLE:
        return ProviderError(None, code=kind, message=f"the upstream for model {model!r} could not be reached")
    # An answer without an error object (an HTML 502 page), or a failure of LiteLLM itself (no deployment
    # available, a reply it could not map, a credential file it could not read): its words, cleaned of its
    # decorations, with its exception's name and the provider it names.
    said = _litellm_said(exc)
    error = {"message": said.pop("message"),
             "type": "invalid_request_error" if status and status < 500 else "upstream_error",
             "param": None, "code": UPSTREAM_ERROR, **said}
    return ProviderError(status=status if status and status >= 400 else 500, body={"error": error})


def reply_error(status: int, data: bytes) -> dict[str, Any]:
    """The body of a provider's error reply: as sent when it is OpenAI's `{"error": {...}}` shape, else in
    that shape (vLLM's top-level error object, a string `error`, or the text of an HTML error page)."""
    try:
        parsed = json.loads(data)
    except (ValueError, TypeError):
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return parsed
    body = _error_object(parsed)
    if body is not None:
        return body
    text = data.decode("utf-8", "replace").strip()[:1000] or f"the upstream answered {status}"
    error = {"message": text, "type": "invalid_request_error" if status < 500 else "upstream_error",
             "param": None, "code": UPSTREAM_ERROR}
    return {"error": error}


# -- a failed call in words: native batch jobs (logs, and the error results of a part's lines) -----------


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an upstream error: LiteLLM's exceptions carry it, httpx's `raise_for_status` on its reply."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def retryable(exc: BaseException) -> bool:
    """A transient upstream error: no reply at all, a timeout, a conflict, a rate limit or a server error."""
    status = status_of(exc)
    return status is None or status in (408, 409, 429) or status >= 500


def _words(body: Any) -> tuple[dict[str, Any] | None, str] | None:
    """A provider's error body in words: (its `error` object, `error.message`) as OpenAI and Anthropic write it,
    else (None, the top-level `message` or `detail`) as Mistral does; None when it says nothing."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error")
    if isinstance(inner, dict) and inner.get("message"):
        return inner, str(inner["message"])
    for key in ("message", "detail"):
        if body.get(key):
            return None, str(body[key])
    return None


def describe_error(exc: BaseException) -> str:
    """A failed call in one line: its status and the provider's message (LiteLLM passes the body on as text)."""
    status = status_of(exc)
    message = str(getattr(exc, "message", None) or str(exc) or type(exc).__name__)
    if message.lstrip().startswith("{"):
        try:
            said = _words(json.loads(message))
        except ValueError:
            said = None
        message = said[1] if said is not None else message
    return f"{status} {message}" if status else f"{type(exc).__name__}: {message}"


def error_message(reply: httpx.Response) -> str:
    """The provider's own words from an error reply: Anthropic's `error.message`, Mistral's `message`/`detail`."""
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:500] or reply.reason_phrase
    said = _words(body)
    if said is None:
        return reply.text[:500]
    inner, message = said
    return f"{inner.get('type', 'error')}: {message}" if inner is not None else message


def batch_error_message(batch: Any) -> str:
    """The upstream's own words for a failed batch (its `errors.data` messages)."""
    errors = getattr(batch, "errors", None)
    data = getattr(errors, "data", None) or (errors.get("data") if isinstance(errors, dict) else None) or []
    messages = []
    for item in data[:5]:
        message = getattr(item, "message", None) or (item.get("message") if isinstance(item, dict) else None)
        line = getattr(item, "line", None) or (item.get("line") if isinstance(item, dict) else None)
        if message:
            messages.append(f"{message} (upstream line {line})" if line else str(message))
    return "; ".join(messages) or "no reason given"
