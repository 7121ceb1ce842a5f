"""The embedded `WebhookDeliveries`: the `webhook_deliveries` table of the SQLite store (see
`gateway.store.sqlite.store`)."""

from __future__ import annotations

import json

from gateway.store.sqlite.db import Database, off_loop
from gateway.store.webhook_deliveries import PENDING, WebhookDelivery

SCHEMA = """
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL,
    state TEXT NOT NULL, next_at REAL NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS webhook_due ON webhook_deliveries(state, next_at);
CREATE INDEX IF NOT EXISTS webhook_owner ON webhook_deliveries(owner, seq);
"""


class SQLiteWebhookDeliveries:
    def __init__(self, sql: Database) -> None:
        self.sql, self._db = sql, sql.conn

    @off_loop
    def add(self, delivery: WebhookDelivery) -> bool:
        cur = self._db.execute(
            "INSERT OR IGNORE INTO webhook_deliveries (id, owner, state, next_at, data) VALUES (?, ?, ?, ?, ?)",
            (delivery.id, delivery.owner, delivery.state, delivery.next_at, json.dumps(delivery.to_json())),
        )
        return cur.rowcount == 1

    @off_loop
    def due(self, now: float, limit: int) -> list[WebhookDelivery]:
        rows = self._db.execute(
            "SELECT data FROM webhook_deliveries WHERE state = ? AND next_at <= ? ORDER BY next_at, seq LIMIT ?",
            (PENDING, now, limit),
        ).fetchall()
        return [WebhookDelivery.from_json(json.loads(r[0])) for r in rows]

    @off_loop
    def save(self, delivery: WebhookDelivery) -> None:
        self._db.execute(
            "UPDATE webhook_deliveries SET state = ?, next_at = ?, data = ? WHERE id = ?",
            (delivery.state, delivery.next_at, json.dumps(delivery.to_json()), delivery.id),
        )

    @off_loop
    def recent(self, owner: str | None, limit: int) -> list[WebhookDelivery]:
        if owner is None:
            rows = self._db.execute("SELECT data FROM webhook_deliveries ORDER BY seq DESC LIMIT ?", (limit,))
        else:
            rows = self._db.execute(
                "SELECT data FROM webhook_deliveries WHERE owner = ? ORDER BY seq DESC LIMIT ?", (owner, limit)
            )
        found = [WebhookDelivery.from_json(json.loads(r[0])) for r in rows.fetchall()]
        return [d for d in found if owner is None or d.owner == owner]  # as the Redis store: the record decides
