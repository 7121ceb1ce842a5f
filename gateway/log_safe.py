"""Text a caller (or an upstream) controls, made safe to log: one log record stays one line, and no byte of
it moves the reader's terminal.

`escaped` writes every control character (C0, DEL, C1, and Unicode's line and paragraph separators) as a
Python escape (`\\n`, `\\x1b`, `\\u2028`), so `GET /v1/x%0a2026-11-28 … WARNING … FORGED` is logged as one
line that shows its `\\n`, never as a second line of the attacker's text. Every log site that writes a
caller's or an upstream's text (a path, a query, a header value, an id, a model name, an upstream's error
message) passes it through `escaped`, which also hides any value the config took from the environment
(`gateway.env_values`); `EscapeArgs`, a filter on the processes' log handlers, applies it to every record's
arguments besides (the same function: text escaped once has nothing left to escape), so a site that forgot
it, or a library's, cannot write a line of a caller's either.
"""

from __future__ import annotations

import logging
import re

from gateway.env_values import redacted

# C0 controls, DEL, C1 controls, and the separators some readers break lines at
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def escaped(value: object) -> str:
    """`value` as text with its control characters escaped (text without any comes back as it is), and any
    value the config took from the environment hidden (`gateway.env_values`)."""
    text = value if isinstance(value, str) else str(value)
    return redacted(_CONTROL.sub(_escape, text))


# Libraries that log an upstream's or a caller's text formatted into the message itself (LiteLLM's f-strings
# quote a provider's error): their records are escaped whole, at the logger, before any handler (their own
# handlers too, added when they are imported) sees them.
_LIBRARY_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "httpx", "openai", "openai._base_client")


class EscapeArgs(logging.Filter):
    """Every string or exception argument of a record escaped before it is formatted (the message's own
    text is the code's, never a caller's); `whole`: the formatted message too (a library's records)."""

    def __init__(self, *, whole: bool = False) -> None:
        super().__init__()
        self.whole = whole

    def filter(self, record: logging.LogRecord) -> bool:
        if self.whole:
            record.msg, record.args = escaped(record.getMessage()), ()
            return True
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_safe(a) for a in args)
        elif isinstance(args, dict):
            record.args = {k: _safe(v) for k, v in args.items()}
        return True


def _safe(value: object) -> object:
    return escaped(value) if isinstance(value, str | BaseException | bytes) else value


def escape_every_handler(*loggers: str) -> None:
    """`EscapeArgs` on each handler of the root logger (where every record that propagates ends) and of
    `loggers` (those with handlers of their own that do not propagate, uvicorn's); on the libraries'
    loggers that format a provider's text into the message, the whole message escaped."""
    for name in ("", *loggers):
        for handler in logging.getLogger(name or None).handlers:
            if not any(isinstance(f, EscapeArgs) for f in handler.filters):
                handler.addFilter(EscapeArgs())
    for name in _LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        if not any(isinstance(f, EscapeArgs) for f in library.filters):
            library.addFilter(EscapeArgs(whole=True))


__all__ = ["EscapeArgs", "escape_every_handler", "escaped"]
