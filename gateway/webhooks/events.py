"""OpenAI's batch webhook events, byte for byte what `openai.OpenAI(webhook_secret=…).webhooks.unwrap`
verifies: the payload `{"object": "event", "id": "evt_…", "type": "batch.completed", "created_at": …,
"data": {"id": "batch_…"}}` and the Standard Webhooks headers `webhook-id`, `webhook-timestamp` and
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.

The key is the secret's bytes after `whsec_`, base64-decoded (OpenAI's and Standard Webhooks'
form), or the secret's UTF-8 bytes when it has no such prefix: the SDK derives it the same way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from gateway.domain import BatchStatus
from gateway.json_codec import dumps

EVENT_TYPES: dict[BatchStatus, str] = {
    BatchStatus.COMPLETED: "batch.completed",
    BatchStatus.FAILED: "batch.failed",
    BatchStatus.CANCELLED: "batch.cancelled",
    BatchStatus.EXPIRED: "batch.expired",
}
ALL_EVENTS: tuple[str, ...] = tuple(EVENT_TYPES.values())
# A team's event, about no batch: its spend (reserved included) reached a fraction of its budget
BUDGET_THRESHOLD = "team.budget_threshold"


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """Where one team's events go. `secret` is never logged or shown."""

    url: str
    secret: str
    events: frozenset[str]

    def __repr__(self) -> str:
        return f"WebhookTarget(url={self.url!r}, events={sorted(self.events)})"


def event_ids(batch_id: str, event_type: str) -> tuple[str, str]:
    """(webhook-id, event id) for a batch's event: derived, so recording it twice (a finalizer run
    again after a crash) is one delivery."""
    digest = hashlib.sha256(f"{batch_id}:{event_type}".encode()).hexdigest()
    return f"wh_{digest[:32]}", f"evt_{digest[32:64]}"


def payload(event_id: str, event_type: str, created_at: int, batch_id: str,
            data: dict[str, Any] | None = None) -> bytes:
    """`data`: the event's own (a team's event); else the batch's `{"id": batch_id}`."""
    return dumps({"object": "event", "id": event_id, "type": event_type, "created_at": created_at,
                  "data": data if data is not None else {"id": batch_id}})


def _key(secret: str) -> bytes:
    return base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret.encode()


def signed_headers(secret: str, webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(_key(secret), signed, hashlib.sha256).digest()).decode()
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{signature}",
    }


__all__ = ["ALL_EVENTS", "BUDGET_THRESHOLD", "EVENT_TYPES", "WebhookTarget", "event_ids", "payload", "signed_headers"]
