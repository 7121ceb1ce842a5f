"""What a model name a line chose may be: a name, never a path, a query, a host or another provider.

A wildcard route (`gateway.config.wildcards`) fills its deployment's `*`s with text from the line's
`model`. That text ends up in a request body, and on some providers in a URL path (Azure's
`/openai/deployments/{name}/...`, Gemini's and Vertex AI's `models/{name}:...`). So the concrete name a
wildcard yields is checked here before anything is sent:

- at most `MAX_NAME_CHARS` characters, at least one;
- only letters, digits and `_ . : @ + = ~ , -` (every provider's model and deployment names fit: OpenAI's
  fine-tunes `ft:gpt-4o:org::id`, Bedrock's ARNs, Vertex AI's `name@version`), and `/` only where the
  provider's names can hold one (a Hugging Face id on vLLM, an ARN on Bedrock); so no `?`, `#`, `%`,
  `\\`, space or control character ever passes;
- no path segment that is empty, `.` or `..` (`a//b`, `./a`, `a/..`).

`path_segment` is how any name (the config's too) is put in a URL path: percent-encoded as one segment.
"""

from __future__ import annotations

import re
import urllib.parse

MAX_NAME_CHARS = 256
_ALLOWED = re.compile(r"[A-Za-z0-9_.:@+=~,\-/]+")
# Providers whose model (or deployment) names never hold a `/`: for them a `/` could only walk a URL path.
NO_SLASH_PROVIDERS = frozenset({
    "azure", "azure_text", "anthropic", "mistral", "gemini", "deepseek", "xai", "cohere", "cohere_chat",
})
# OpenAI's own API: its names hold no `/` either (an `openai/` deployment with another api_base is an
# OpenAI-compatible server, a vLLM say, whose names may: `meta-llama/Llama-3.1-8B`).
_OPENAI_HOSTS = frozenset({"api.openai.com"})


def slash_allowed(provider: str, api_base: str | None) -> bool:
    """Whether names on this provider (at this api_base) may hold a `/`."""
    if provider in NO_SLASH_PROVIDERS:
        return False
    if provider in ("openai", "text-completion-openai"):
        host = urllib.parse.urlsplit(api_base).hostname if api_base else "api.openai.com"
        return host not in _OPENAI_HOSTS
    return True


def name_problem(name: str, *, slash: bool) -> str | None:
    """Why `name` is not a model name a line may choose (None: it is one). `slash`: may it hold a `/`."""
    if not name:
        return "the name is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"the name is {len(name)} characters; the limit is {MAX_NAME_CHARS}"
    if _ALLOWED.fullmatch(name) is None:
        bad = next(c for c in name if _ALLOWED.fullmatch(c) is None)
        return f"the name holds {bad!r}; a model name holds letters, digits and _ . : @ + = ~ , - only"
    if "/" in name and not slash:
        return "the name holds '/', which no name of this provider does"
    if any(segment in ("", ".", "..") for segment in name.split("/")):
        return "the name holds an empty, '.' or '..' path segment"
    return None


def path_segment(name: str) -> str:
    """`name` percent-encoded as one URL path segment (`/`, `?`, `#`, `%` and every other reserved byte
    encoded; `.` and `..` are refused by `name_problem` before a line's name gets here)."""
    return urllib.parse.quote(name, safe="")


__all__ = ["MAX_NAME_CHARS", "NO_SLASH_PROVIDERS", "name_problem", "path_segment", "slash_allowed"]
