"""Webhook deliveries: the store's record of each event owed to a team's webhook endpoint.

A delivery is recorded before its batch reaches the status it announces and
before anything is sent, so a crash loses none (at least once). The sender
(`gateway.webhooks.sender`) picks the due ones, sends, and saves the outcome;
`recent` feeds the dashboard. A part of the `Store` (`store.webhooks`), in both
modes: `SQLiteWebhookDeliveries` (embedded) and `RedisWebhookDeliveries` (shared).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PENDING, DELIVERED, FAILED, SUPERSEDED = "pending", "delivered", "failed", "superseded"


@dataclass(slots=True)
class WebhookDelivery:
    id: str  # `wh_…`: the `webhook-id` header, the same on every attempt (receivers dedupe on it)
    event_id: str  # `evt_…`: the event's own id, in the payload
    owner: str  # the team whose endpoint it goes to
    batch_id: str
    type: str  # batch.completed | batch.failed | batch.cancelled | batch.expired | team.budget_threshold
    created_at: int  # the event's time (payload `created_at`)
    state: str = PENDING  # PENDING until DELIVERED, FAILED (gave up) or SUPERSEDED (the batch ended otherwise)
    attempts: int = 0
    next_at: float = 0.0  # when a PENDING delivery is next tried (epoch seconds)
    last_status: int | None = None  # the receiver's last HTTP status; None: no reply (down, timeout)
    last_error: str | None = None
    finished_at: int | None = None
    # The event's `data` when it is not a batch's `{"id": batch_id}` (a team's event: `batch_id` is "")
    data: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WebhookDelivery:
        return cls(**data)


__all__ = ["DELIVERED", "FAILED", "PENDING", "SUPERSEDED", "WebhookDelivery"]
