"""The order a shard's requests enter the engine: lines that share a prompt prefix, together.

vLLM's prefix cache reuses the KV blocks of a prompt's leading tokens once they
have been computed and while they stay cached. Lines that share a long system
prompt but are scattered through a file recompute it whenever the cache has let
it go; sent one after another, each group computes it once and the rest of the
group reads it. llm-d's batch gateway groups a file's lines by model and
system-prompt hash for the same reason; we do it within a shard (a shard is
the unit a backend sees; the planner streams the file and holds no lines).

Groups keep the order of their first line, and lines keep file order within
their group, so a file with one shared prompt (or none) runs in file order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gateway.domain import BatchRequest, Endpoint
from gateway.json_codec import dumps

_LEADING_ROLES = ("system", "developer")


def prefix_key(req: BatchRequest) -> tuple[str, str, bytes]:
    """(model, endpoint, digest of the chat's leading system/developer messages, or of an Anthropic Messages
    line's `system`); an empty digest when none."""
    head: list[Any] = []
    if req.url is Endpoint.CHAT:
        messages = req.body.get("messages")
        if isinstance(messages, list):
            for message in messages:
                if not isinstance(message, dict) or message.get("role") not in _LEADING_ROLES:
                    break
                head.append(message.get("content"))
    elif req.url is Endpoint.MESSAGES and req.body.get("system") is not None:
        head.append(req.body["system"])  # Anthropic's system prompt: a field of its own, ahead of the turns
    digest = hashlib.blake2b(dumps(head), digest_size=16).digest() if head else b""
    return req.model, req.url.value, digest


def group_by_prefix(requests: Sequence[BatchRequest]) -> list[BatchRequest]:
    """`requests` with the lines of one (model, endpoint, system prompt) next to each other."""
    groups: dict[tuple[str, str, bytes], list[BatchRequest]] = {}
    for req in requests:
        groups.setdefault(prefix_key(req), []).append(req)
    if len(groups) <= 1:
        return list(requests)
    return [req for group in groups.values() for req in group]


__all__ = ["group_by_prefix", "prefix_key"]
